// Package dra is gpuherd's Kubernetes Dynamic Resource Allocation driver:
// a kubelet plugin on every hypervisor that is a Kubernetes node. It
// publishes the server's GPUs as ResourceSlices from the agent's ledger,
// turns a prepared ResourceClaim into a gpuherd claim (bound to vfio-pci,
// handed over as CDI devices with KEP-5304 device metadata, as KubeVirt's
// virt-launcher reads them), and releases it at unprepare. It talks to the
// agent only through agent/api, as the libvirt hook does; the ledger stays
// the one authority over the GPUs, shared with libvirt VMs. Its
// manifests (DeviceClasses, pinned ResourceClaims) are package manifest's,
// which the gpuherd binary links without Kubernetes' client.
package dra

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/dra/manifest"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	resourceapi "k8s.io/api/resource/v1"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
)

// DefaultDriverName is the driver name, and the attribute domain, unless
// configured otherwise.
const DefaultDriverName = manifest.DefaultDriverName

// Agent is what the driver asks of the gpuherd agent on its server: the
// API's client serves it over the local socket.
type Agent interface {
	Status(ctx context.Context) (api.Status, error)
	WatchStatus(ctx context.Context, after uint64, wait time.Duration) (api.Status, error)
	Claim(ctx context.Context, id string, req api.ClaimRequest) (api.Claim, error)
	Get(ctx context.Context, id string) (api.Claim, error)
	Release(ctx context.Context, id string) (api.Claim, error)
	UseClaim(ctx context.Context, id string, req api.UseRequest) (api.Claim, error)
	EndUse(ctx context.Context, id, domainUUID string, release bool) (api.UseEnd, error)
}

// Recorder counts what the driver does, for the metrics.
type Recorder interface {
	Prepared(result string)
	Unprepared(result string)
	// Published is a new ResourceSlice of n devices, d after the agent's
	// change was seen.
	Published(devices int, d time.Duration)
}

// Config is what the driver needs.
type Config struct {
	// DriverName names the driver and the attributes' domain.
	DriverName string
	// NodeName is this server's Kubernetes node: the pool of its slice.
	NodeName string
	// KubeClient talks to the API server.
	KubeClient kubernetes.Interface
	// Agent is the gpuherd agent of this server.
	Agent Agent
	// PluginDataDir holds the plugin's socket, the device metadata files
	// and the checkpoint of prepared claims
	// (/var/lib/kubelet/plugins/DRIVER by default).
	PluginDataDir string
	// RegistrarDir is where the kubelet looks for plugins to register
	// (/var/lib/kubelet/plugins_registry by default).
	RegistrarDir string
	// CDIDir is where the container runtime reads CDI specs (/var/run/cdi).
	CDIDir string
	// DevRoot is the host's /dev as the agent sees it ("" or /dev on a
	// real server; the simulated machine's otherwise).
	DevRoot string
	// WatchWait bounds one wait for the agent's next change (the agent
	// is asked again then even when nothing changed).
	WatchWait time.Duration
	// ClaimAtPrepareOnly turns the allocation watcher off: a GPU is
	// claimed when the kubelet prepares its pod, not when the scheduler
	// allocates it (allocations.go).
	ClaimAtPrepareOnly bool
	Log                *slog.Logger
	Recorder           Recorder
}

func (c *Config) defaults() error {
	if c.DriverName == "" {
		c.DriverName = DefaultDriverName
	}
	if err := validDriverName(c.DriverName); err != nil {
		return err
	}
	if c.NodeName == "" {
		return errors.New("the Kubernetes node name is not set (kubernetes.node_name, default node_name)")
	}
	if c.Agent == nil {
		return errors.New("the gpuherd agent's client is needed")
	}
	if c.PluginDataDir == "" {
		c.PluginDataDir = filepath.Join(kubeletplugin.KubeletPluginsDir, c.DriverName)
	}
	if c.RegistrarDir == "" {
		c.RegistrarDir = kubeletplugin.KubeletRegistryDir
	}
	if c.CDIDir == "" {
		c.CDIDir = kubeletplugin.DefaultCDIDir
	}
	if c.WatchWait <= 0 {
		c.WatchWait = api.DefaultWatchWait
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Recorder == nil {
		c.Recorder = nopRecorder{}
	}
	return nil
}

// Driver is the kubelet plugin of one server.
type Driver struct {
	cfg    Config
	agent  Agent
	log    *slog.Logger
	rec    Recorder
	state  *checkpoint
	helper *kubeletplugin.Helper
	pub    publisher // the helper; a fake in benchmarks

	ctx    context.Context // until Stop
	cancel context.CancelFunc
	done   chan struct{}

	// work runs prepares, unprepares and the allocation watcher's
	// adoptions one at a time: each reads the checkpoint and then acts.
	work     sync.Mutex
	watching chan struct{} // closed once the allocation watcher caught up

	mu        sync.Mutex
	published []resourceapi.Device
	gen       uint64 // the agent's generation last published
	synced    chan struct{}
}

// Start registers the plugin with the kubelet, serves its gRPC API and
// publishes this server's ResourceSlice, kept up to date from the agent's
// change feed until Stop.
func Start(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.KubeClient == nil {
		return nil, errors.New("kubernetes driver: no Kubernetes client")
	}
	d, err := newDriver(cfg)
	if err != nil {
		return nil, err
	}
	cfg = d.cfg
	// The kubelet's and the runtime's directories may not exist before
	// they first ran; the plugin's sockets and specs must have them.
	for _, dir := range []string{cfg.RegistrarDir, cfg.CDIDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("kubernetes driver: %w", err)
		}
	}
	ctx = klog.NewContext(ctx, logr.FromSlogHandler(d.log.Handler()))
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(cfg.DriverName),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.KubeClient(cfg.KubeClient),
		kubeletplugin.PluginDataDirectoryPath(cfg.PluginDataDir),
		kubeletplugin.RegistrarDirectoryPath(cfg.RegistrarDir),
		kubeletplugin.CDIDirectory(cfg.CDIDir),
		// The file holds one object per version, in this order. KubeVirt's
		// virt-launcher decodes only the first and wants v1alpha1; the
		// helper insists on the latest (v1beta1) too, which newer
		// consumers find by reading on.
		kubeletplugin.EnableDeviceMetadata(true, []schema.GroupVersion{metadatav1alpha1.SchemeGroupVersion, metadatav1beta1.SchemeGroupVersion}),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return nil, fmt.Errorf("kubernetes driver: starting the kubelet plugin: %w", err)
	}
	d.helper, d.pub = helper, helper
	d.startPublishing(ctx)
	if !cfg.ClaimAtPrepareOnly {
		d.watchAllocations(d.ctx)
	}
	d.log.Info("kubelet plugin started", "node", cfg.NodeName, "plugin_dir", cfg.PluginDataDir, "registrar_dir", cfg.RegistrarDir, "cdi_dir", cfg.CDIDir)
	return d, nil
}

// newDriver is the driver of cfg with its checkpoint, not yet serving.
func newDriver(cfg Config) (*Driver, error) {
	if err := cfg.defaults(); err != nil {
		return nil, fmt.Errorf("kubernetes driver: %w", err)
	}
	if err := os.MkdirAll(cfg.PluginDataDir, 0o750); err != nil {
		return nil, fmt.Errorf("kubernetes driver: %w", err)
	}
	state, err := openCheckpoint(cfg.PluginDataDir)
	if err != nil {
		return nil, fmt.Errorf("kubernetes driver: %w", err)
	}
	return &Driver{cfg: cfg, agent: cfg.Agent, log: cfg.Log.With("driver", cfg.DriverName), rec: cfg.Recorder,
		state: state, done: make(chan struct{}), synced: make(chan struct{}), watching: make(chan struct{})}, nil
}

// publisher takes this node's devices to the API server.
type publisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

func (d *Driver) startPublishing(ctx context.Context) {
	wctx, cancel := context.WithCancel(ctx)
	d.ctx, d.cancel = wctx, cancel
	go d.publishLoop(wctx)
}

// WatchingAllocations is closed once the allocation watcher has caught up
// with the API server (never, when it cannot run).
func (d *Driver) WatchingAllocations() <-chan struct{} { return d.watching }

// Stop stops publishing and serving; the ResourceSlice stays (the kubelet
// removes it when the plugin does not come back).
func (d *Driver) Stop() {
	d.cancel()
	<-d.done
	if d.helper != nil {
		d.helper.Stop()
	}
}

// Synced is closed once the first ResourceSlice was published.
func (d *Driver) Synced() <-chan struct{} { return d.synced }

// PublishedGeneration is the agent's generation the last published slice
// reflects.
func (d *Driver) PublishedGeneration() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gen
}

// publishLoop mirrors the agent's GPUs into the slice: a status, then a
// watch from its generation, again and again; a change is published as
// soon as the agent answers the watch.
func (d *Driver) publishLoop(ctx context.Context) {
	defer close(d.done)
	var (
		have    bool
		gen     uint64
		backoff = 100 * time.Millisecond
		failing bool
	)
	for ctx.Err() == nil {
		var (
			st  api.Status
			err error
		)
		if have {
			st, err = d.agent.WatchStatus(ctx, gen, d.cfg.WatchWait)
		} else {
			st, err = d.agent.Status(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !failing {
				d.log.Warn("the gpuherd agent does not answer; the slice stays as last published", "err", err)
			}
			failing, have = true, false
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		if failing {
			d.log.Info("the gpuherd agent answers again")
		}
		failing, backoff = false, 100*time.Millisecond
		seen := time.Now()
		if err := d.publish(ctx, st); err != nil {
			d.log.Error("publishing the ResourceSlice", "err", err)
			have = false
			continue
		}
		d.rec.Published(len(d.published), time.Since(seen))
		have, gen = true, st.Generation
	}
}

// publish hands the slice of st to the helper when its devices changed.
func (d *Driver) publish(ctx context.Context, st api.Status) error {
	devs := Devices(st, d.cfg.DriverName)
	d.mu.Lock()
	same := d.gen != 0 && equality.Semantic.DeepEqual(devs, d.published)
	d.mu.Unlock()
	if !same {
		res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
			d.cfg.NodeName: {Slices: []resourceslice.Slice{{Devices: devs}}},
		}}
		if err := d.pub.PublishResources(ctx, res); err != nil {
			return err
		}
		d.log.Debug("ResourceSlice published", "devices", len(devs), "generation", st.Generation)
	}
	d.mu.Lock()
	d.published, d.gen = devs, max(st.Generation, 1)
	d.mu.Unlock()
	select {
	case <-d.synced:
	default:
		close(d.synced)
	}
	return nil
}

// HandleError logs what the helper met in the background (publishing the
// slice); the publish loop tries again on the next change
// (kubeletplugin.DRAPlugin).
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.log.Warn(msg, "err", err)
		return
	}
	d.log.Error(msg, "err", err)
}

// WatchHealthStatus is not offered: a GPU that turns unhealthy leaves the
// slice instead (kubeletplugin.DRAPlugin).
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

type nopRecorder struct{}

func (nopRecorder) Prepared(string)              {}
func (nopRecorder) Unprepared(string)            {}
func (nopRecorder) Published(int, time.Duration) {}
