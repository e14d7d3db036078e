// Package agent is the gpuherd daemon: it wires the hardware (real or
// simulated) to the inventory, the ledger and the API, reconciles the
// machine with the ledger at start, and serves claims.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/hashicorp/memberlist"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/groups"
	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/internal/clock"
	"github.com/gpuherd/gpuherd/metrics"
	"github.com/gpuherd/gpuherd/vfio"
)

// Agent owns this server's GPUs. It wires the hardware, the ledger, gossip
// and the servers, and runs the lifecycle; the claim protocol is its three
// roles (docs/protocol.md): the coordinator, the owner and the home, and
// the node groups over them. Their methods are promoted, so an *Agent
// serves the whole API.
type Agent struct {
	*coordinator
	*owner
	*home
	*groups.Groups

	cfg    Config
	log    *slog.Logger
	clk    clock.Clock // every lease, timer and deadline (internal/clock)
	policy vfio.IdlePolicy

	pci    *vfio.PCI
	binder *vfio.Binder
	inv    *inventory.Inventory
	ledger *ledger.Ledger
	nvml   *inventory.NVMLSource // nil when NVML does not answer
	sim    *sim.Machine          // nil on real hardware

	locks      keyedLocks // by PCI address
	claimLocks keyedLocks // by claim ID
	// commitLocks run an owner's commits of one claim ID one at a time
	// (owner.Commit): a commit that failed after its hold lets the name
	// go before another reservation of the ID holds it.
	commitLocks keyedLocks
	rec         Recorder
	cluster     *clusterState // nil when this server runs alone
	// gossipTune adjusts memberlist's configuration (tests shorten its timers).
	gossipTune func(*memberlist.Config)
	onChange   func()
	// onGroupStep, when set (tests), runs before a group operation
	// changes a node (agent/groups).
	onGroupStep func(group, node string)
	feed        changeFeed
	peerNet     PeerNetwork   // nil: mutual TLS on cfg.PeerAddr
	readTimeout time.Duration // of one request on the socket and the peer API; 0: the default
	dir         *directory
	boot        uint64 // this run's identity in gossip
	// lastRefusal is when an owner last refused this coordinator (a.now
	// UnixNano; 0 never): see contended.
	lastRefusal atomic.Int64
	// readFirstUntil is until when claims through this agent read their
	// ID in the registry before placing it (a.now, UnixNano; readNameFirst).
	readFirstUntil atomic.Int64
	// bound maps a claim ID to the CreatedAt of its reservation once
	// reserveAndBind has bound all of its GPUs: its commit then need not
	// check them again (see Commit).
	bound sync.Map

	drainMu sync.RWMutex
	drained *serverDrain // nil when the server takes new claims

	metrics *metrics.Metrics
	storage *storageHealth // every store's last write (storage.go)
	tele    telemetry
	ready   atomic.Bool // serving: /readyz says so
	// lns are the sockets bound before any driver moves (listeners.go).
	lns        *listeners
	startPhase atomic.Value // string: what start-up is doing
	started    atomic.Bool  // New has finished: every field is set
	fabric     fabricState  // the NVSwitch fabric mode (fabric.go)

	pass   passState           // passthrough readiness per GPU (passthrough.go)
	watch  pciWatch            // PCI uevents and their handlers (watch.go)
	events vfio.PCIEventSource // nil: groups are re-read on reload only

	mu     sync.RWMutex
	gpus   map[string]inventory.GPU // by PCI address, from the last discovery
	order  []string                 // addresses, sorted
	fenced map[string]string        // address → why the agent stopped offering it
	// invMu makes pushInventory's read of the GPUs and its hand-over to
	// the ledger one step, so a stale push never undoes a fence.
	invMu sync.Mutex

	use vmUse // the VMs holding GPUs open (inuse.go)

	// names is the authority over claim IDs and group names; nil when this
	// server runs alone (nameauthority.go).
	names NameAuthority
	ae    antiEntropy // the owner's pass over names and ledger (antientropy.go)
	// registry runs the name registry on this agent (registry.go); nil
	// when this server runs alone or its authority was injected.
	registry *registryState
}

var _ api.Service = (*Agent)(nil)

// Option changes how New builds the agent; tests use them.
type Option func(*options)

type options struct {
	clk         clock.Clock
	wall        func() time.Time
	fs          vfio.FS
	nvml        nvml.Interface
	rec         Recorder
	gossipTune  func(*memberlist.Config)
	onChange    func()
	peerNet     PeerNetwork
	readTimeout time.Duration
	events      vfio.PCIEventSource
	names       NameAuthority
}

// WithPCIEvents replaces the source of PCI uevents (by default the kernel's
// netlink socket, or the simulated kernel itself).
func WithPCIEvents(src vfio.PCIEventSource) Option { return func(o *options) { o.events = src } }

// WithOnChange calls f (which must be quick) whenever this server's
// capacity may have changed; the systemd STATUS line follows it.
func WithOnChange(f func()) Option { return func(o *options) { o.onChange = f } }

// WithRecorder sends the agent's events (claims, reservations, vfio
// operations) to r, normally the metrics.
func WithRecorder(r Recorder) Option { return func(o *options) { o.rec = r } }

// WithPeerNetwork carries the peer API over n instead of a mutual-TLS
// listener and clients; tests pass an in-memory network (agent/claimtest).
func WithPeerNetwork(n PeerNetwork) Option { return func(o *options) { o.peerNet = n } }

// WithGossipTune adjusts memberlist's configuration; tests shorten timers.
func WithGossipTune(f func(*memberlist.Config)) Option { return func(o *options) { o.gossipTune = f } }

// WithClock replaces the Now of the agent's clock (leases, expiry); its
// timers stay the runtime's. Tests move leases by hand with it.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.clk = clock.WithNow(now) }
}

// WithTimeSource replaces the agent's whole clock, its timers included (a
// clock.Manual in tests and the simulation).
func WithTimeSource(c clock.Clock) Option { return func(o *options) { o.clk = c } }

// WithWallClock replaces the wall clock the agent's clock starts from (see
// clock.Monotonic); fault tests step it to play a clock step.
func WithWallClock(wall func() time.Time) Option { return func(o *options) { o.wall = wall } }

// WithSysfs runs the agent on the given sysfs (and NVML, may be nil) instead
// of the configured one; tests pass a fakekernel.Kernel.
func WithSysfs(fs vfio.FS, lib nvml.Interface) Option {
	return func(o *options) { o.fs, o.nvml = fs, lib }
}

// New opens the hardware, the ledger and the inventory, and reconciles the
// machine with the ledger. The caller must Close the agent.
func New(ctx context.Context, cfg Config, log *slog.Logger, opts ...Option) (*Agent, error) {
	// Every check before anything changes on the machine (configcheck.go).
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	cat, _ := cfg.Catalog()
	cfg.OfferedModels, _ = cfg.canonicalOffered(cat)
	o := options{rec: nopRecorder{}, wall: clock.Wall}
	for _, opt := range opts {
		opt(&o)
	}
	if o.clk == nil {
		o.clk = clock.Monotonic(o.wall)
	}
	policy, _ := vfio.ParseIdlePolicy(cfg.IdleDriver)
	allow, _ := vfio.ParseAllowList(cfg.AllowDevices)
	a := &Agent{cfg: cfg, log: log, clk: o.clk, policy: policy, fenced: make(map[string]string),
		rec: o.rec, gossipTune: o.gossipTune, onChange: o.onChange, peerNet: o.peerNet, readTimeout: o.readTimeout, boot: newBoot(), names: o.names}
	a.coordinator, a.owner, a.home = &coordinator{a}, &owner{a}, &home{a}
	a.Groups = newGroups(a)
	// Each run counts from a random point: a watcher that saw an earlier
	// run's generation is answered at once, not after its whole wait.
	a.feed.gen = rand.Uint64() >> 1
	a.watch.resync = make(chan struct{}, 1)
	a.OnPCIChange(a.checkDriversOnEvents)
	a.dir = newDirectory(a.clk.Now())
	a.metrics = metrics.New(metrics.SourceFunc(a.startedSnapshot), metrics.WithLogger(log))
	if _, nop := o.rec.(nopRecorder); nop {
		a.rec = a.metrics
	}
	a.setPhase(phaseChecking)
	a.metrics.Registry().MustRegister(newPhaseCollector(a))
	a.storage = newStorageHealth(a.clk.Now)
	a.metrics.Registry().MustRegister(a.storage)

	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data_dir %s: %w", cfg.DataDir, err)
	}
	// The ledger first: its lock keeps a second agent on this data directory
	// from touching anything, the simulated machine included.
	var err error
	a.ledger, err = ledger.Open(cfg.LedgerPath(), ledger.WithMaxGPUs(cfg.MaxGPUsPerClaim),
		ledger.WithWriteResult(func(op string, err error) { a.storageResult(storeLedger, op, err) }))
	if err != nil {
		return nil, fmt.Errorf("opening the ledger: %w", err)
	}
	// Every socket before any driver moves: one the agent cannot have
	// fails the start with the machine as it was.
	if err := a.bindListeners(); err != nil {
		a.ledger.Close()
		return nil, err
	}
	fs, lib, err := a.openHardware(o)
	if err != nil {
		a.Close()
		return nil, err
	}
	a.pci = vfio.New(fs, vfio.WithLogger(log))
	a.use.proc = procFor(fs, cfg.ProcRoot, o.fs != nil)
	a.events = o.events
	if src, ok := fs.(vfio.PCIEventSource); ok && a.events == nil {
		a.events = src // the simulated kernel tells of its own changes
	} else if a.events == nil {
		a.events = vfio.NetlinkUevents{Log: log}
	}
	a.binder = vfio.NewBinder(a.pci,
		vfio.WithAllowList(allow),
		vfio.WithWriteTimeout(time.Duration(cfg.BindTimeout)),
		vfio.WithBinderLogger(log))

	gpuIDs, _ := cfg.gpuDevices()
	invOpts := []inventory.Option{inventory.WithFactStore(a.ledger), inventory.WithLogger(log), inventory.WithGPUDevices(gpuIDs),
		inventory.WithCatalog(cat), inventory.WithDenyAddresses(cfg.DenyDevices)}
	if lib != nil {
		src := inventory.NewNVML(lib, log)
		if _, err := src.Snapshot(); err != nil {
			if errors.Is(err, inventory.ErrNVMLUnavailable) {
				log.Info("NVML not available; inventory from sysfs only", "reason", err)
			} else {
				log.Warn("NVML failed; inventory from sysfs only", "err", err)
			}
		} else {
			a.nvml = src
			invOpts = append(invOpts, inventory.WithNVML(src))
		}
	}
	a.inv = inventory.New(a.pci, invOpts...)
	a.setPhase(phaseDiscovering)
	if err := a.discover(); err != nil {
		a.Close()
		return nil, err
	}
	if err := a.initReadiness(allow); err != nil {
		a.Close()
		return nil, err
	}
	if err := a.loadServerDrain(); err != nil {
		a.Close()
		return nil, err
	}
	if err := a.detectFabric(); err != nil {
		a.Close()
		return nil, err
	}
	a.setPhase(phaseReconciling)
	if err := a.reconcile(ctx); err != nil {
		a.Close()
		return nil, err
	}
	a.setPhase(phaseJoining)
	if cfg.GossipAddr != "" {
		if err := a.startCluster(); err != nil {
			a.Close()
			return nil, err
		}
	}
	a.started.Store(true)
	return a, nil
}

// openHardware picks the sysfs and NVML the agent runs on: injected by a
// test, simulated, or the real machine's.
func (a *Agent) openHardware(o options) (vfio.FS, nvml.Interface, error) {
	if o.fs != nil {
		return o.fs, o.nvml, nil
	}
	if a.cfg.Simulate != "" {
		p, err := sim.Load(a.cfg.Simulate)
		if err != nil {
			return nil, nil, fmt.Errorf("simulate: %w", err)
		}
		m, err := sim.Start(p, a.cfg.DataDir)
		if err != nil {
			return nil, nil, fmt.Errorf("simulate %s: %w", a.cfg.Simulate, err)
		}
		a.sim = m
		a.log.Info("running on simulated hardware", "profile", p.Name, "state", a.cfg.DataDir)
		var lib nvml.Interface
		if m.NVML != nil && a.cfg.NVML != "off" {
			lib = m.NVML
		}
		return m.Kernel, lib, nil
	}
	var lib nvml.Interface
	if a.cfg.NVML != "off" {
		lib = nvml.New()
	}
	return vfio.NewOSFS(a.cfg.SysfsRoot, a.cfg.DevRoot), lib, nil
}

// Close releases the ledger and NVML. A sysfs write still blocked in the
// kernel stays blocked; nothing can cancel it.
func (a *Agent) Close() error {
	var err error
	a.registry.transfer()
	if a.cluster != nil {
		a.cluster.stop(context.Background())
	}
	a.registry.close()
	a.lns.close()
	if a.ledger != nil {
		err = a.ledger.Close()
	}
	a.closeNVML()
	return err
}

func (a *Agent) closeNVML() {
	if a.nvml != nil {
		a.nvml.Shutdown()
	}
}

// Node is this server's name.
func (a *Agent) Node() string { return a.cfg.NodeName }

// discover scans the hardware and hands the GPUs, with their health, to the ledger.
func (a *Agent) discover() error {
	gpus, err := a.inv.Discover()
	if err != nil {
		return fmt.Errorf("discovering GPUs: %w", err)
	}
	a.mu.Lock()
	a.gpus = make(map[string]inventory.GPU, len(gpus))
	a.order = a.order[:0]
	for _, g := range gpus {
		a.gpus[g.Address] = g
		a.order = append(a.order, g.Address)
	}
	a.mu.Unlock()
	a.log.Info("inventory", "gpus", len(gpus), "nvml", a.nvml != nil)
	for _, g := range gpus {
		a.log.Debug("gpu", "pci_address", g.Address, "model", g.Model, "numa_node", g.NUMANode,
			"iommu_group", g.IOMMUGroup, "driver", g.Driver, "healthy", g.Healthy, "health", g.Health)
	}
	return a.pushInventory()
}

// pushInventory gives the ledger the GPUs with their current health: the
// inventory's view plus what the agent fenced off.
func (a *Agent) pushInventory() error {
	a.invMu.Lock()
	defer a.invMu.Unlock()
	a.mu.RLock()
	out := make([]ledger.GPU, 0, len(a.order))
	for _, addr := range a.order {
		g := a.gpus[addr]
		_, fenced := a.fenced[addr]
		out = append(out, ledger.GPU{
			Address:  g.Address,
			Model:    g.Model,
			NUMANode: g.NUMANode,
			Healthy:  g.Healthy && !fenced && !a.use.isReturning(addr),
			Unusable: a.unusable(addr) != "",
			Distance: g.Distance,
		})
	}
	a.mu.RUnlock()
	if err := a.ledger.SetInventory(out); err != nil {
		return fmt.Errorf("handing the inventory to the ledger: %w", err)
	}
	return nil
}

// fence stops offering a GPU that misbehaved. It stays fenced until the
// agent restarts and finds it healthy again.
func (a *Agent) fence(addr, reason string) {
	a.mu.Lock()
	_, was := a.fenced[addr]
	a.fenced[addr] = reason
	a.mu.Unlock()
	if !was {
		a.log.Error("GPU fenced off: no new claims until it is fixed and the agent restarts",
			"pci_address", addr, "reason", reason)
	}
	if err := a.pushInventory(); err != nil {
		a.log.Error("fencing GPU", "pci_address", addr, "err", err)
	}
	a.changed()
}

// changed tells the cluster that this server's capacity may have moved.
func (a *Agent) changed() {
	a.feed.bump()
	if c := a.cluster; c != nil {
		c.publish()
	}
	if a.onChange != nil {
		a.onChange()
	}
}

// StatusLine sums this server up in one line (systemd's STATUS=).
func (a *Agent) StatusLine() string {
	total, free := 0, 0
	for _, t := range a.ledger.Totals(a.clk.Now()) {
		total += t.Total
		free += t.Free
	}
	s := fmt.Sprintf("%d GPUs, %d free, %d claims", total, free, len(a.ledger.List()))
	if a.serverDrained() {
		s += ", drained"
	}
	if c := a.cluster; c != nil {
		s += fmt.Sprintf("; cluster of %d", len(c.g.Members()))
	}
	return s
}

// ReloadGossipKeys applies the gossip key file again (key rotation).
func (a *Agent) ReloadGossipKeys(path string) error {
	if a.cluster == nil || path == "" {
		return nil
	}
	return a.cluster.g.ReloadKeys(path)
}

// rnd breaks ties between equally good servers; each call gets its own
// generator, so concurrent claims need no lock.
func (a *Agent) rnd() *rand.Rand { return rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())) }

// health returns why a GPU is not offered, or "".
func (a *Agent) health(addr string) string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if r, ok := a.fenced[addr]; ok {
		return r
	}
	if g, ok := a.gpus[addr]; ok && !g.Healthy {
		return g.Health
	}
	return ""
}

func (a *Agent) gpu(addr string) (inventory.GPU, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	g, ok := a.gpus[addr]
	return g, ok
}

// CheckHealth looks at every GPU once: one that vanished from the bus or
// whose config space reads as all-ones is fenced off.
func (a *Agent) CheckHealth() {
	a.mu.RLock()
	addrs := append([]string(nil), a.order...)
	a.mu.RUnlock()
	for _, addr := range addrs {
		if err := a.pci.Health(addr); err != nil {
			a.fence(addr, err.Error())
		}
	}
}
