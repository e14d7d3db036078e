// Package host is this server's hardware as the protocol uses it: the GPU
// table (discovery, health, fences), binding a claim's GPUs to vfio-pci and
// returning free ones to the idle driver, the device locks that serialise
// those moves, the VMs that hold GPUs open, passthrough readiness, the PCI
// uevent watch, the driver check and the NVSwitch fabric. The owner and the
// agent's wiring call it; it knows nothing of claims beyond the ledger's
// records.
package host

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/internal/clock"
	"github.com/gpuherd/gpuherd/internal/keyedlock"
	"github.com/gpuherd/gpuherd/vfio"
)

// Config is what the host reads of the agent's configuration.
type Config struct {
	NodeName              string
	BindTimeout           time.Duration // of one sysfs write
	IdlePolicy            vfio.IdlePolicy
	ProcRoot              string // where VFIO users are looked for (messages)
	FabricMode            string // fabric_mode: auto or a stated mode
	AllowUnsafeInterrupts bool
	NVML                  bool // NVML answered at start (logged with the inventory)
}

// Counters are the events of the host that the metrics count beside the
// Recorder's.
type Counters interface {
	ReleaseRefusedInUse()
	ClaimAdopted()
	DriverChangeUnexpected(addr, driver string)
}

// Deps is what the host uses, by name.
type Deps struct {
	Config    Config
	PCI       *vfio.PCI
	Binder    *vfio.Binder
	Inventory *inventory.Inventory
	Ledger    *ledger.Ledger
	Proc      vfio.ProcFS         // the /proc that VFIO users are found in
	Events    vfio.PCIEventSource // nil: groups are re-read on reload only
	Clock     clock.Clock
	Recorder  events.Recorder
	Counters  Counters
	Log       *slog.Logger
	// Changed is called whenever this server's capacity may have changed.
	Changed func()
}

// Host is this server's GPUs and the moves of their drivers.
type Host struct {
	cfg      Config
	log      *slog.Logger
	clk      clock.Clock
	rec      events.Recorder
	counters Counters
	ledger   *ledger.Ledger
	pci      *vfio.PCI
	binder   *vfio.Binder
	inv      *inventory.Inventory
	policy   vfio.IdlePolicy
	events   vfio.PCIEventSource
	changed  func()

	locks keyedlock.Set // device locks, by PCI address

	mu     sync.RWMutex
	gpus   map[string]inventory.GPU // by PCI address, from the last discovery
	order  []string                 // addresses, sorted
	fenced map[string]string        // address → why the agent stopped offering it
	// invMu makes PushInventory's read of the GPUs and its hand-over to
	// the ledger one step, so a stale push never undoes a fence.
	invMu sync.Mutex

	use    vmUse       // the VMs holding GPUs open (inuse.go)
	pass   passState   // passthrough readiness per GPU (passthrough.go)
	watch  pciWatch    // PCI uevents and their handlers (watch.go)
	fabric fabricState // the NVSwitch fabric mode (fabric.go)
}

// New builds the host over d. Nothing is read until Discover.
func New(d Deps) *Host {
	h := &Host{cfg: d.Config, log: d.Log, clk: d.Clock, rec: d.Recorder, counters: d.Counters,
		ledger: d.Ledger, pci: d.PCI, binder: d.Binder, inv: d.Inventory, policy: d.Config.IdlePolicy,
		events: d.Events, changed: d.Changed, fenced: map[string]string{}}
	h.use.proc = d.Proc
	h.watch.resync = make(chan struct{}, 1)
	h.OnPCIChange(h.CheckDriversOnEvents)
	return h
}

// LockGPUs takes the device locks of addrs, in order, and returns the
// function that releases them. Every driver move of a GPU runs under its
// lock.
func (h *Host) LockGPUs(addrs ...string) (unlock func()) { return h.locks.Lock(addrs...) }

// DeviceLockUsers is how many callers hold or wait for the device lock of
// addr (tests await a waiter with it).
func (h *Host) DeviceLockUsers(addr string) int { return h.locks.Users(addr) }

// Discover scans the hardware and hands the GPUs, with their health, to
// the ledger.
func (h *Host) Discover() error {
	gpus, err := h.inv.Discover()
	if err != nil {
		return fmt.Errorf("discovering GPUs: %w", err)
	}
	h.mu.Lock()
	h.gpus = make(map[string]inventory.GPU, len(gpus))
	h.order = h.order[:0]
	for _, g := range gpus {
		h.gpus[g.Address] = g
		h.order = append(h.order, g.Address)
	}
	h.mu.Unlock()
	h.log.Info("inventory", "gpus", len(gpus), "nvml", h.cfg.NVML)
	for _, g := range gpus {
		h.log.Debug("gpu", "pci_address", g.Address, "model", g.Model, "numa_node", g.NUMANode,
			"iommu_group", g.IOMMUGroup, "driver", g.Driver, "healthy", g.Healthy, "health", g.Health)
	}
	return h.PushInventory()
}

// PushInventory gives the ledger the GPUs with their current health: the
// inventory's view plus what the agent fenced off.
func (h *Host) PushInventory() error {
	h.invMu.Lock()
	defer h.invMu.Unlock()
	h.mu.RLock()
	out := make([]ledger.GPU, 0, len(h.order))
	for _, addr := range h.order {
		g := h.gpus[addr]
		_, fenced := h.fenced[addr]
		out = append(out, ledger.GPU{
			Address:  g.Address,
			Model:    g.Model,
			NUMANode: g.NUMANode,
			Healthy:  g.Healthy && !fenced && !h.use.isReturning(addr),
			Unusable: h.Unusable(addr) != "",
			Distance: g.Distance,
		})
	}
	h.mu.RUnlock()
	if err := h.ledger.SetInventory(out); err != nil {
		return fmt.Errorf("handing the inventory to the ledger: %w", err)
	}
	return nil
}

// Fence stops offering a GPU that misbehaved. It stays fenced until the
// agent restarts and finds it healthy again.
func (h *Host) Fence(addr, reason string) {
	h.mu.Lock()
	_, was := h.fenced[addr]
	h.fenced[addr] = reason
	h.mu.Unlock()
	if !was {
		h.log.Error("GPU fenced off: no new claims until it is fixed and the agent restarts",
			"pci_address", addr, "reason", reason)
	}
	if err := h.PushInventory(); err != nil {
		h.log.Error("fencing GPU", "pci_address", addr, "err", err)
	}
	h.changed()
}

// Health returns why a GPU is not offered, or "".
func (h *Host) Health(addr string) string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if r, ok := h.fenced[addr]; ok {
		return r
	}
	if g, ok := h.gpus[addr]; ok && !g.Healthy {
		return g.Health
	}
	return ""
}

// GPU is the GPU at addr as last discovered.
func (h *Host) GPU(addr string) (inventory.GPU, bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	g, ok := h.gpus[addr]
	return g, ok
}

// Addresses are the GPUs' PCI addresses, sorted.
func (h *Host) Addresses() []string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return slices.Clone(h.order)
}

// Device reads the PCI device at addr now.
func (h *Host) Device(addr string) (vfio.Device, error) { return h.pci.Device(addr) }

// CheckHealth looks at every GPU once: one that vanished from the bus or
// whose config space reads as all-ones is fenced off.
func (h *Host) CheckHealth() {
	for _, addr := range h.Addresses() {
		if err := h.pci.Health(addr); err != nil {
			h.Fence(addr, err.Error())
		}
	}
}

// IsReturning reports whether the GPU at addr is kept back while a VM
// holds its VFIO group open.
func (h *Host) IsReturning(addr string) bool { return h.use.isReturning(addr) }

// WaitUnstuck waits until no sysfs write to the device at addr is still
// blocked in the kernel, or ctx ends (tests let leaked writes finish).
func (h *Host) WaitUnstuck(ctx context.Context, addr string) error {
	return h.binder.WaitUnstuck(ctx, addr)
}

// Unfence forgets the fence of addr, as a restart that finds the GPU healthy
// does (tests play a restart with it); the caller pushes the inventory.
func (h *Host) Unfence(addr string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.fenced, addr)
}
