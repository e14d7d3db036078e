package fakekubelet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpuherd/gpuherd/tools/kube/controlplane"
	"github.com/gpuherd/gpuherd/tools/kube/fakekubelet"
)

const driver = "gpu.gpuherd.io"

// tinyPlugin is the smallest DRA plugin that exercises the sockets: it
// prepares every device allocated to it by naming a CDI device from a
// static spec, with KEP-5304 metadata, and remembers what it unprepared.
type tinyPlugin struct {
	mu         sync.Mutex
	unprepared []types.UID
	errs       []error
}

func (p *tinyPlugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		var res kubeletplugin.PrepareResult
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver != driver {
				continue
			}
			res.Devices = append(res.Devices, kubeletplugin.Device{
				Requests:     []string{r.Request},
				PoolName:     r.Pool,
				DeviceName:   r.Device,
				CDIDeviceIDs: []string{driver + "/gpu=" + r.Device},
				Metadata: &kubeletplugin.DeviceMetadata{Attributes: map[string]resourceapi.DeviceAttribute{
					"resource.kubernetes.io/pciBusID": {StringValue: new(pciBusIDs[r.Device])},
				}},
			})
		}
		out[claim.UID] = res
	}
	return out, nil
}

func (p *tinyPlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[types.UID]error{}
	for _, c := range claims {
		p.unprepared = append(p.unprepared, c.UID)
		out[c.UID] = nil
	}
	return out, nil
}

// HandleError collects background errors (the helper's gRPC servers and
// slice publishing); the test checks there were none. It may be called
// after the test's end, so it must not use testing.T.
func (p *tinyPlugin) HandleError(_ context.Context, err error, msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, fmt.Errorf("%s: %w", msg, err))
}

func (p *tinyPlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

var pciBusIDs = map[string]string{"gpu-0": "0000:18:00.0", "gpu-1": "0000:2a:00.0"}

// cdiSpec is the static spec the tiny plugin's devices resolve to: the
// two VFIO nodes virt-launcher needs per GPU.
const cdiSpec = `{
  "cdiVersion": "0.6.0",
  "kind": "gpu.gpuherd.io/gpu",
  "devices": [
    {"name": "gpu-0", "containerEdits": {"deviceNodes": [{"path": "/dev/vfio/21"}], "env": ["GPUHERD_GPU_0=0000:18:00.0"]}},
    {"name": "gpu-1", "containerEdits": {"deviceNodes": [{"path": "/dev/vfio/22"}], "env": ["GPUHERD_GPU_1=0000:2a:00.0"]}}
  ],
  "containerEdits": {"deviceNodes": [{"path": "/dev/vfio/vfio"}]}
}`

func TestPrepareRoundTrip(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cp := controlplane.Start(t, controlplane.Options{})
	c := cp.Client
	if _, err := cp.AddNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}

	// The kubelet's directories, all under one temp dir.
	root := t.TempDir()
	registry := filepath.Join(root, "plugins_registry")
	pluginDir := filepath.Join(root, "plugins", driver)
	cdiDir := filepath.Join(root, "cdi")
	for _, d := range []string{registry, pluginDir, cdiDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(cdiDir, driver+"-gpu.json"), []byte(cdiSpec), 0o644); err != nil {
		t.Fatal(err)
	}

	plugin := &tinyPlugin{}
	helper, err := kubeletplugin.Start(ctx, plugin,
		kubeletplugin.DriverName(driver),
		kubeletplugin.NodeName("n1"),
		kubeletplugin.KubeClient(c),
		kubeletplugin.RegistrarDirectoryPath(registry),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.CDIDirectory(cdiDir),
		// v1alpha1 first: virt-launcher reads only the first object of
		// the metadata stream and wants v1alpha1; the helper insists on
		// v1beta1 (the latest) being there too.
		kubeletplugin.EnableDeviceMetadata(true, []schema.GroupVersion{metadatav1alpha1.SchemeGroupVersion, metadatav1beta1.SchemeGroupVersion}),
	)
	if err != nil {
		t.Fatalf("start plugin: %v", err)
	}
	t.Cleanup(helper.Stop)

	var devices []resourceapi.Device
	for _, name := range []string{"gpu-0", "gpu-1"} {
		devices = append(devices, controlplane.Device(name, map[string]any{"resource.kubernetes.io/pciBusID": pciBusIDs[name]}))
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		"n1": {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}); err != nil {
		t.Fatal(err)
	}

	// The kubelet's side of registration, on the real socket.
	regSocket := filepath.Join(registry, driver+"-reg.sock")
	p, err := fakekubelet.Register(ctx, regSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Close() }()
	t.Logf("GetInfo: name=%s endpoint=%s versions=%v", p.Info.Name, p.Info.Endpoint, p.Info.SupportedVersions)
	if p.Info.Name != driver || p.Info.Endpoint != filepath.Join(pluginDir, "dra.sock") || !slices.Contains(p.Info.SupportedVersions, drapb.DRAPluginService) {
		t.Fatalf("GetInfo = %v", p.Info)
	}

	dc := controlplane.DeviceClass(driver, `device.driver == "`+driver+`"`)
	if _, err := c.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Two virt-launcher pods, one per way KubeVirt names a claim: a
	// ResourceClaim by name, and a ResourceClaimTemplate (the claim's
	// metadata then lands under the pod-level claim name).
	claim := controlplane.Claim("default", "vm-gpu", controlplane.Requests("gpu", driver, 1, "")...)
	if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tmpl := controlplane.ClaimTemplate("default", "vm-gpu-template", controlplane.Requests("gpu", driver, 1, "")...)
	if _, err := c.ResourceV1().ResourceClaimTemplates("default").Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := []*v1.Pod{
		controlplane.LauncherPod("default", "virt-launcher-a", controlplane.PodClaim{Name: "gpu", ResourceClaimName: "vm-gpu"}),
		controlplane.LauncherPod("default", "virt-launcher-b", controlplane.PodClaim{Name: "tgpu", ResourceClaimTemplateName: tmpl.Name}),
	}
	wantFiles := []string{
		"/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-gpu/gpu0/*-metadata.json",
		"/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/tgpu/gpu0/*-metadata.json",
	}
	var claims []*resourceapi.ResourceClaim
	for _, pod := range pods {
		if _, err := c.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		s, err := cp.WaitScheduled(ctx, pod)
		if err != nil {
			t.Fatal(err)
		}
		claims = append(claims, s.Claims[0])
	}

	// One call for both, as the kubelet batches a pod's claims.
	prepared, err := p.Prepare(ctx, claims...)
	if err != nil {
		t.Fatal(err)
	}
	var hostFiles []string
	for i, claim := range claims {
		res := prepared[claim.UID]
		if res.Err != "" || len(res.Devices) != 1 {
			t.Fatalf("prepare answer for %s: %+v", claim.Name, res)
		}
		ids := res.CDIDeviceIDs()
		t.Logf("claim %s: CDI device IDs %v", claim.Name, ids)
		view, err := fakekubelet.ApplyCDI(cdiDir, ids)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("claim %s: container view %+v", claim.Name, view)
		dev := res.Devices[0].DeviceName
		wantNode := map[string]string{"gpu-0": "/dev/vfio/21", "gpu-1": "/dev/vfio/22"}[dev]
		var nodes []string
		for _, n := range view.DeviceNodes {
			nodes = append(nodes, n.Path)
		}
		if !slices.Contains(nodes, "/dev/vfio/vfio") || !slices.Contains(nodes, wantNode) {
			t.Errorf("device nodes %v, want /dev/vfio/vfio and %s", nodes, wantNode)
		}

		// What virt-launcher globs, through the container's mounts.
		files, err := view.Glob(wantFiles[i])
		if err != nil {
			t.Fatal(err)
		}
		if len(files) != 1 {
			t.Fatalf("glob %s in the container = %v, want one file", wantFiles[i], files)
		}
		host, _ := view.HostPathFor(files[0])
		data, err := os.ReadFile(host)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("container %s <- host %s:\n%s", files[0], host, data)
		first, err := firstObject(data)
		if err != nil {
			t.Fatalf("metadata %s: %v", host, err)
		}
		if first["apiVersion"] != "metadata.resource.k8s.io/v1alpha1" {
			t.Errorf("first metadata object is %v, want metadata.resource.k8s.io/v1alpha1", first["apiVersion"])
		}
		if !bytes.Contains(data, []byte(pciBusIDs[dev])) {
			t.Errorf("metadata lacks the device's pciBusID %s:\n%s", pciBusIDs[dev], data)
		}
		hostFiles = append(hostFiles, host)
	}

	// Unprepare: the plugin hears of the claims, the helper removes their
	// metadata files and CDI specs.
	errs, err := p.Unprepare(ctx, claims...)
	if err != nil {
		t.Fatal(err)
	}
	for _, claim := range claims {
		if e := errs[claim.UID]; e != "" {
			t.Fatalf("unprepare %s: %s", claim.Name, e)
		}
	}
	plugin.mu.Lock()
	got := slices.Clone(plugin.unprepared)
	bgErrs := slices.Clone(plugin.errs)
	plugin.mu.Unlock()
	if len(bgErrs) > 0 {
		t.Errorf("plugin background errors: %v", bgErrs)
	}
	if len(got) != 2 || !slices.Contains(got, claims[0].UID) || !slices.Contains(got, claims[1].UID) {
		t.Errorf("plugin unprepared %v, want the two claims", got)
	}
	for _, host := range hostFiles {
		if _, err := os.Stat(host); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("metadata file %s still there after unprepare (%v)", host, err)
		}
	}
	left, _ := filepath.Glob(filepath.Join(cdiDir, driver+"_metadata_*.json"))
	if len(left) != 0 {
		t.Errorf("metadata CDI specs left after unprepare: %v", left)
	}
	ids := prepared[claims[0].UID].CDIDeviceIDs()
	if _, err := fakekubelet.ApplyCDI(cdiDir, ids); err == nil || !strings.Contains(err.Error(), "unresolvable") {
		t.Errorf("ApplyCDI after unprepare: %v, want unresolvable metadata device", err)
	}
}

// firstObject decodes the first JSON object of a concatenated stream, as
// virt-launcher does.
func firstObject(data []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil && err != io.EOF {
		return nil, err
	}
	return obj, nil
}
