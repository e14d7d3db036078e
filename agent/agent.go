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
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/hashicorp/memberlist"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/claim"
	"github.com/gpuherd/gpuherd/agent/drain"
	"github.com/gpuherd/gpuherd/agent/groups"
	"github.com/gpuherd/gpuherd/agent/home"
	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/owner"
	"github.com/gpuherd/gpuherd/agent/registry"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/agent/status"
	"github.com/gpuherd/gpuherd/agent/telemetry"
	"github.com/gpuherd/gpuherd/internal/clock"
	"github.com/gpuherd/gpuherd/internal/keyedlock"
	"github.com/gpuherd/gpuherd/metrics"
	"github.com/gpuherd/gpuherd/vfio"
)

// Agent owns this server's GPUs. It wires the hardware, the ledger, gossip
// and the servers, and runs the lifecycle; the claim protocol is its three
// roles (docs/protocol.md): the coordinator, the owner and the home, and
// the node groups over them. The coordinator's, the owner's and the
// groups' methods are promoted, as are the name registry's calls and the
// drains, and the home's forwarded, so an *Agent serves the whole API.
type Agent struct {
	*claim.Coordinator
	*owner.Owner
	*groups.Groups
	*registry.Service            // the registry's calls: ServeNames, RemoveMember
	*drain.Drains                // GPU and server drains; nil until New read the cordon
	home              *home.Home // the home role: the claim directory's records of the IDs homed here

	cfg    Config
	log    *slog.Logger
	clk    clock.Clock // every lease, timer and deadline (internal/clock)
	policy vfio.IdlePolicy

	inv    *inventory.Inventory
	ledger *ledger.Ledger
	nvml   *inventory.NVMLSource // nil when NVML does not answer
	sim    *sim.Machine          // nil on real hardware

	host       *host.Host     // the GPUs and their drivers (agent/host)
	status     *status.Reader // the GPUs as the status API shows them (agent/status)
	claimLocks keyedlock.Set  // by claim ID
	rec        Recorder
	cluster    *clusterState // nil when this server runs alone
	// gossipTune adjusts memberlist's configuration (tests shorten its timers).
	gossipTune func(*memberlist.Config)
	onChange   func()
	// onGroupStep, when set (tests), runs before a group operation
	// changes a node (agent/groups).
	onGroupStep func(group, node string)
	feed        changeFeed
	peerNet     PeerNetwork   // nil: mutual TLS on cfg.PeerAddr
	readTimeout time.Duration // of one request on the socket and the peer API; 0: the default
	boot        uint64        // this run's identity in gossip

	metrics *metrics.Metrics
	storage *storageHealth     // every store's last write (storage.go)
	tele    *telemetry.Watcher // NVML's readings and XID errors (agent/telemetry)
	ready   atomic.Bool        // serving: /readyz says so
	// lns are the sockets bound before any driver moves (listeners.go).
	lns        *listeners
	startPhase atomic.Value // string: what start-up is doing
	started    atomic.Bool  // New has finished: every field is set

	// names is the authority over claim IDs and group names; nil when this
	// server runs alone (nameauthority.go).
	names NameAuthority
	// registry runs the name registry on this agent (registry.go); nil
	// when this server runs alone or its authority was injected.
	registry *registry.Registry
}

var (
	_ api.Service   = (*Agent)(nil)
	_ api.Directory = (*Agent)(nil)
)

// BeginClaim is the home's (agent/home): an intent to place claim id.
func (a *Agent) BeginClaim(ctx context.Context, id string, req api.DirBegin) (api.DirAnswer, error) {
	return a.home.BeginClaim(ctx, id, req)
}

// LookupDirectory is the home's (agent/home): where claim id is.
func (a *Agent) LookupDirectory(ctx context.Context, id string) (api.DirAnswer, error) {
	return a.home.LookupDirectory(ctx, id)
}

// UpdateDirectory is the home's (agent/home): owners' and coordinators'
// notifications.
func (a *Agent) UpdateDirectory(ctx context.Context, u api.DirUpdate) error {
	return a.home.UpdateDirectory(ctx, u)
}

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
	a := &Agent{cfg: cfg, log: log, clk: o.clk, policy: policy,
		rec: o.rec, gossipTune: o.gossipTune, onChange: o.onChange, peerNet: o.peerNet, readTimeout: o.readTimeout, boot: newBoot(), names: o.names}
	// Each run counts from a random point: a watcher that saw an earlier
	// run's generation is answered at once, not after its whole wait.
	a.feed.gen = rand.Uint64() >> 1
	a.home = home.New(home.Deps{
		NodeName:         cfg.NodeName,
		Clock:            a.clk,
		Members:          homeMembership{a},
		DirectorySettle:  time.Duration(cfg.DirectorySettle),
		RememberReleased: time.Duration(cfg.RememberReleased),
		PendingTTL:       claim.PendingTTL(time.Duration(cfg.ReservationLease)),
	})
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
		ledger.WithWriteResult(func(op string, err error) { a.storageResult(storeLedger, op, err) }),
		ledger.WithWriteTime(func(op string, d time.Duration) { a.storage.took(storeLedger, op, d) }))
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
	pci := vfio.New(fs, vfio.WithLogger(log))
	events := o.events
	if src, ok := fs.(vfio.PCIEventSource); ok && events == nil {
		events = src // the simulated kernel tells of its own changes
	} else if events == nil {
		events = vfio.NetlinkUevents{Log: log}
	}
	binder := vfio.NewBinder(pci,
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
	a.inv = inventory.New(pci, invOpts...)
	a.host = host.New(host.Deps{
		Config: host.Config{NodeName: cfg.NodeName, BindTimeout: time.Duration(cfg.BindTimeout), IdlePolicy: policy,
			ProcRoot: cfg.ProcRoot, FabricMode: cfg.FabricMode, AllowUnsafeInterrupts: cfg.AllowUnsafeInterrupts, NVML: a.nvml != nil},
		PCI: pci, Binder: binder, Inventory: a.inv, Ledger: a.ledger, Proc: host.ProcFor(fs, cfg.ProcRoot, o.fs != nil),
		Events: events, Clock: a.clk, Recorder: a.rec, Counters: a.metrics, Log: log, Changed: a.changed,
	})
	a.status = newStatus(a)
	a.tele = newTelemetry(a)
	a.Owner = owner.New(owner.Deps{
		Config: owner.Config{NodeName: cfg.NodeName, ReservationLease: time.Duration(cfg.ReservationLease),
			RememberReleased: time.Duration(cfg.RememberReleased), IdlePolicy: policy},
		Ledger: a.ledger, Host: a.host, Home: a.home, Clock: a.clk, Recorder: a.rec, Counters: a.metrics, Log: log,
		Names: namesFor[owner.Names](a), Server: ownerServer{a}, ClaimLocks: &a.claimLocks,
	})
	a.Coordinator = claim.New(claim.Deps{
		Config: claim.Config{NodeName: cfg.NodeName, ReservationLease: time.Duration(cfg.ReservationLease),
			MaxGPUsPerClaim: cfg.MaxGPUsPerClaim},
		Clock: a.clk, Recorder: a.rec, Log: log, Ledger: a.ledger, Host: a.host, Home: a.home,
		View: agentView{a}, Names: namesFor[claim.Names](a), Registry: agentRegistry{a}, Catalog: a.inv.Catalog(),
		ClaimLocks: &a.claimLocks,
	})
	a.Groups = newGroups(a)
	a.Service = newRegistryService(a)
	a.setPhase(phaseDiscovering)
	if err := a.host.Discover(); err != nil {
		a.Close()
		return nil, err
	}
	if err := a.host.InitReadiness(allow); err != nil {
		a.Close()
		return nil, err
	}
	if a.Drains, err = openDrains(a); err != nil {
		a.Close()
		return nil, err
	}
	if err := a.host.FindFabric(); err != nil {
		a.Close()
		return nil, err
	}
	a.setPhase(phaseReconciling)
	if err := a.host.Reconcile(ctx); err != nil {
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
	a.registry.Transfer()
	if a.cluster != nil {
		a.cluster.stop(context.Background())
	}
	a.registry.Close()
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

// ReloadReadiness applies a reloaded allow list and interrupt setting:
// every GPU's passthrough readiness is assessed again (agent/host).
func (a *Agent) ReloadReadiness(ctx context.Context, allow vfio.AllowList, allowUnsafeInterrupts bool) {
	a.host.ReloadReadiness(ctx, allow, allowUnsafeInterrupts)
}

// Node is this server's name.
func (a *Agent) Node() string { return a.cfg.NodeName }

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
	if a.ServerDrained() {
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

// newBoot is a random, non-zero identity of this agent's run.
func newBoot() uint64 { return rand.Uint64() | 1 }
