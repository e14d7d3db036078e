// Package platform runs simulated gpuherd servers as Kubernetes nodes of
// an in-process control plane: on each, the real agent on simulated
// hardware, the real DRA driver (agent/dra) against the API server, and
// the kubelet played over the driver's real sockets. The end-to-end tests,
// the benchmark and `make demo-kubevirt` share it.
package platform

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/dra"
	"github.com/gpuherd/gpuherd/agent/dra/manifest"
	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/tools/kube/controlplane"
	"github.com/gpuherd/gpuherd/tools/kube/fakekubelet"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/yaml"
)

// Server is one hypervisor: a Kubernetes node with its gpuherd agent and
// DRA driver.
type Server struct {
	Name    string
	Dir     string // everything of this server, under a short path (sockets)
	Machine *sim.Machine
	Agent   *agent.Agent
	Client  *api.Client // the agent's local API, as the driver reaches it
	Driver  *dra.Driver
	Kubelet *fakekubelet.Plugin
	CDIDir  string

	cfg     agent.Config
	log     *slog.Logger
	stopRun func()
}

// StartServer boots a simulated server of profile as node name: the agent,
// the driver registered with the (played) kubelet, and its first slice
// published.
func StartServer(tb controlplane.TB, cp *controlplane.ControlPlane, name, profile string, log *slog.Logger) *Server {
	tb.Helper()
	return StartServerWith(tb, cp, name, profile, log, Options{})
}

// Options change how a server's driver runs.
type Options struct {
	// ClaimAtPrepareOnly: as a driver whose credentials may not list
	// ResourceClaims, which claims a GPU only when its pod is prepared.
	ClaimAtPrepareOnly bool
}

// StartServerWith is StartServer with opts.
func StartServerWith(tb controlplane.TB, cp *controlplane.ControlPlane, name, profile string, log *slog.Logger, opts Options) *Server {
	tb.Helper()
	ctx := context.Background()
	if _, err := cp.AddNode(ctx, name); err != nil {
		tb.Fatalf("node %s: %v", name, err)
	}
	dir, err := os.MkdirTemp("", "gh-"+name+"-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	p, err := sim.Load(profile)
	if err != nil {
		tb.Fatal(err)
	}
	m, err := sim.Start(p, filepath.Join(dir, "data"))
	if err != nil {
		tb.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.NodeName = name
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.Socket = filepath.Join(dir, "api.sock")
	cfg.IdleDriver = "nvidia"
	s := &Server{Name: name, Dir: dir, Machine: m, cfg: cfg, log: log.With("server", name), CDIDir: filepath.Join(dir, "cdi")}
	s.StartAgent(tb)
	s.Client = api.NewClient(cfg.Socket)
	tb.Cleanup(s.Client.Close)

	s.Driver, err = dra.Start(ctx, dra.Config{
		NodeName: name, KubeClient: cp.Client, Agent: s.Client,
		PluginDataDir: filepath.Join(dir, "plugin"), RegistrarDir: filepath.Join(dir, "registry"), CDIDir: s.CDIDir,
		Log: s.log, ClaimAtPrepareOnly: opts.ClaimAtPrepareOnly,
	})
	if err != nil {
		tb.Fatalf("%s: %v", name, err)
	}
	tb.Cleanup(s.Driver.Stop)
	<-s.Driver.Synced()
	s.Kubelet, err = fakekubelet.Register(ctx, filepath.Join(dir, "registry", dra.DefaultDriverName+"-reg.sock"))
	if err != nil {
		tb.Fatalf("%s: registering the plugin: %v", name, err)
	}
	tb.Cleanup(func() { s.Kubelet.Close() })
	return s
}

// StartAgent starts (or starts again) the agent on the server's machine
// and data directory, as systemd would after a restart.
func (s *Server) StartAgent(tb controlplane.TB) {
	tb.Helper()
	a, err := agent.New(context.Background(), s.cfg, s.log, agent.WithSysfs(s.Machine.Kernel, s.Machine.NVML))
	if err != nil {
		tb.Fatalf("%s: agent: %v", s.Name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- a.Run(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		tb.Fatalf("%s: agent: %v", s.Name, err)
	}
	s.Agent = a
	stopped := false
	s.stopRun = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		<-done
		a.Close()
	}
	tb.Cleanup(s.stopRun)
}

// StopAgent stops the agent; its ledger stays on disk.
func (s *Server) StopAgent() { s.stopRun() }

// ApplyDeviceClasses creates the driver's DeviceClasses for the catalog's
// models from the YAML `gpuherd kubernetes deviceclasses` prints, read as
// `kubectl apply -f -` reads it.
func ApplyDeviceClasses(ctx context.Context, cp *controlplane.ControlPlane) error {
	var models []string
	for _, m := range inventory.DefaultCatalog().Models() {
		models = append(models, m.Name)
	}
	out, err := manifest.DeviceClassesYAML(dra.DefaultDriverName, models)
	if err != nil {
		return err
	}
	for _, doc := range strings.Split(string(out), "---\n") {
		var dc resourceapi.DeviceClass
		if err := yaml.UnmarshalStrict([]byte(doc), &dc); err != nil {
			return fmt.Errorf("DeviceClass: %w\n%s", err, doc)
		}
		if _, err := cp.Client.ResourceV1().DeviceClasses().Create(ctx, &dc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("DeviceClass %s: %w", dc.Name, err)
		}
	}
	return nil
}

// PinnedClaim is the ResourceClaim that `gpuherd get ID -o kubevirt`
// prints for c, read as `kubectl apply -f -` reads it.
func PinnedClaim(c api.Claim, o manifest.Options) (*resourceapi.ResourceClaim, error) {
	out, err := manifest.KubeVirtManifests(c, o)
	if err != nil {
		return nil, err
	}
	doc, _, _ := strings.Cut(string(out), "---\n")
	var rc resourceapi.ResourceClaim
	if err := yaml.UnmarshalStrict([]byte(doc), &rc); err != nil {
		return nil, fmt.Errorf("ResourceClaim: %w\n%s", err, doc)
	}
	return &rc, nil
}

// WaitSlice waits until node's ResourceSlice of the driver satisfies ok,
// watching the API server, and returns its devices.
func WaitSlice(ctx context.Context, cp *controlplane.ControlPlane, node string, ok func([]resourceapi.Device) bool) ([]resourceapi.Device, error) {
	sel := fields.OneTermEqualSelector("spec.nodeName", node).String()
	slices := cp.Client.ResourceV1().ResourceSlices()
	list, err := slices.List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return nil, err
	}
	for _, s := range list.Items {
		if s.Spec.Driver == dra.DefaultDriverName && ok(s.Spec.Devices) {
			return s.Spec.Devices, nil
		}
	}
	w, err := slices.Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("node %s's ResourceSlice: %w", node, ctx.Err())
		case ev, open := <-w.ResultChan():
			if !open {
				return nil, fmt.Errorf("node %s's ResourceSlice: the watch ended", node)
			}
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			s, _ := ev.Object.(*resourceapi.ResourceSlice)
			if s != nil && s.Spec.Driver == dra.DefaultDriverName && ok(s.Spec.Devices) {
				return s.Spec.Devices, nil
			}
		}
	}
}

// Has reports whether devices name the GPU at addr, and with which claim
// attribute.
func Has(devices []resourceapi.Device, addr string) (claim string, ok bool) {
	name := dra.DeviceName(addr)
	i := slices.IndexFunc(devices, func(d resourceapi.Device) bool { return d.Name == name })
	if i < 0 {
		return "", false
	}
	if v := devices[i].Attributes[resourceapi.QualifiedName(dra.DefaultDriverName+"/claim")].StringValue; v != nil {
		return *v, true
	}
	return "", true
}

// Allocated is the PCI addresses a claim's allocation names on node.
func Allocated(c *resourceapi.ResourceClaim) (node string, addrs []string) {
	if c.Status.Allocation == nil {
		return "", nil
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if a, ok := dra.PCIAddress(r.Device); ok {
			addrs = append(addrs, a)
			node = r.Pool
		}
	}
	slices.Sort(addrs)
	return node, addrs
}

// waitGPU waits, through the agent's change feed, until the GPU at addr
// satisfies ok.
func waitGPU(ctx context.Context, s *Server, addr string, ok func(api.GPU) bool) error {
	st, err := s.Client.Status(ctx)
	for {
		if err != nil {
			return err
		}
		for _, g := range st.GPUs {
			if g.PCIAddress == addr && ok(g) {
				return nil
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		st, err = s.Client.WatchStatus(ctx, st.Generation, 30*time.Second)
	}
}
