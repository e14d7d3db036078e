// Package hosttest builds a host.Host on a simulated machine for the tests
// of the roles above it: the fake kernel, a real ledger in a temporary
// directory, a manual clock and fakes of the metrics.
package hosttest

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/internal/clock"
	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// Epoch is where every manual clock of these tests starts.
var Epoch = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// Host is a host.Host with what a test looks at beside it.
type Host struct {
	*host.Host
	Kernel   *fakekernel.Kernel
	Ledger   *ledger.Ledger
	Clock    *clock.Manual
	Counters *Counters
	Recorder *Recorder
	Log      *slog.Logger

	mu      sync.Mutex
	changes int
}

// Changes is how often the host said that capacity may have changed.
func (h *Host) Changes() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changes
}

// Changed is the change callback the host was built with, for the roles
// built beside it.
func (h *Host) Changed() {
	h.mu.Lock()
	h.changes++
	h.mu.Unlock()
}

// New builds a host on the simulated machine profile, discovered, assessed
// and reconciled (free GPUs on no driver), as an agent's start leaves it.
// Its ledger is opened with opts.
func New(t testing.TB, profile string, opts ...ledger.Option) *Host {
	t.Helper()
	dir := t.TempDir()
	p, err := sim.Load(profile)
	if err != nil {
		t.Fatal(err)
	}
	m, err := sim.Start(p, filepath.Join(dir, "machine"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := ledger.Open(filepath.Join(dir, "ledger.db"), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	h := &Host{Kernel: m.Kernel, Ledger: l, Clock: clock.NewManual(Epoch), Counters: &Counters{}, Recorder: &Recorder{},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	h.Host, err = On(Parts{Kernel: m.Kernel, Ledger: l, Clock: h.Clock, Node: "gpu-1",
		Counters: h.Counters, Recorder: h.Recorder, Log: h.Log, Changed: h.Changed})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// Parts are what On builds a host from.
type Parts struct {
	Kernel   *fakekernel.Kernel
	Ledger   *ledger.Ledger
	Clock    clock.Clock
	Node     string
	Counters host.Counters
	Recorder events.Recorder
	Log      *slog.Logger
	Changed  func()
}

// On builds a host on a simulated machine's kernel, discovered, assessed
// and reconciled, as an agent's start leaves it. The simulation builds
// each server's host with it, again at each restart.
func On(p Parts) (*host.Host, error) {
	allow, err := vfio.ParseAllowList([]string{"10de:*"})
	if err != nil {
		return nil, err
	}
	pci := vfio.New(p.Kernel)
	h := host.New(host.Deps{
		Config:    host.Config{NodeName: p.Node, BindTimeout: 5 * time.Second, IdlePolicy: vfio.IdleNone, FabricMode: host.FabricAuto},
		PCI:       pci,
		Binder:    vfio.NewBinder(pci, vfio.WithAllowList(allow), vfio.WithWriteTimeout(5*time.Second)),
		Inventory: inventory.New(pci, inventory.WithFactStore(p.Ledger)),
		Ledger:    p.Ledger,
		Proc:      host.ProcFor(p.Kernel, "/proc", true),
		Clock:     p.Clock,
		Recorder:  p.Recorder,
		Counters:  p.Counters,
		Log:       p.Log,
		Changed:   p.Changed,
	})
	if err := h.Discover(); err != nil {
		return nil, err
	}
	if err := h.InitReadiness(allow); err != nil {
		return nil, err
	}
	if err := h.Reconcile(context.Background()); err != nil {
		return nil, err
	}
	return h, nil
}

// Driver is the driver of the device at addr now.
func (h *Host) Driver(t testing.TB, addr string) string {
	t.Helper()
	d, err := h.Device(addr)
	if err != nil {
		t.Fatal(err)
	}
	return d.Driver
}

// Counters is a fake of the metrics' host counters.
type Counters struct {
	mu                             sync.Mutex
	RefusedInUse, Adopted, Rebound int
}

func (c *Counters) ReleaseRefusedInUse() { c.mu.Lock(); c.RefusedInUse++; c.mu.Unlock() }
func (c *Counters) ClaimAdopted()        { c.mu.Lock(); c.Adopted++; c.mu.Unlock() }

// DriverChangeUnexpected counts a GPU found off its driver.
func (c *Counters) DriverChangeUnexpected(string, string) { c.mu.Lock(); c.Rebound++; c.mu.Unlock() }

// Recorder is a fake Recorder: it counts successful VFIO operations and
// reservation steps.
type Recorder struct {
	mu           sync.Mutex
	ops          map[string]int
	reservations map[string]int
}

func (r *Recorder) ClaimDone(string, time.Duration) {}
func (r *Recorder) XID(string, string, uint64)      {}
func (r *Recorder) ClaimLookup(string)              {}

// Reservation counts a reservation step.
func (r *Recorder) Reservation(step string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reservations == nil {
		r.reservations = map[string]int{}
	}
	r.reservations[step]++
}

// VFIOOperation counts an operation that succeeded.
func (r *Recorder) VFIOOperation(op string, _ time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ops == nil {
		r.ops = map[string]int{}
	}
	if err == nil {
		r.ops[op]++
	}
}

// Ops is how many operations op succeeded.
func (r *Recorder) Ops(op string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ops[op]
}

// Reservations is how many times step was recorded.
func (r *Recorder) Reservations(step string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reservations[step]
}
