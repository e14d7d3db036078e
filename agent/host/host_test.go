package host

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/internal/clock"
	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// counters is a fake of the metrics' host counters.
type counters struct {
	mu                         sync.Mutex
	refusedInUse, adopted, off int
}

func (c *counters) ReleaseRefusedInUse() { c.mu.Lock(); c.refusedInUse++; c.mu.Unlock() }
func (c *counters) ClaimAdopted()        { c.mu.Lock(); c.adopted++; c.mu.Unlock() }
func (c *counters) DriverChangeUnexpected(string, string) {
	c.mu.Lock()
	c.off++
	c.mu.Unlock()
}

// recorder is a fake Recorder that counts VFIO operations.
type recorder struct {
	mu  sync.Mutex
	ops map[string]int
}

func (r *recorder) ClaimDone(string, time.Duration) {}
func (r *recorder) Reservation(string)              {}
func (r *recorder) XID(string, string, uint64)      {}
func (r *recorder) ClaimLookup(string)              {}
func (r *recorder) VFIOOperation(op string, _ time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ops == nil {
		r.ops = map[string]int{}
	}
	if err == nil {
		r.ops[op]++
	}
}

// testHost is a Host on a simulated machine, a real ledger and a manual
// clock, with fakes for the metrics.
type testHost struct {
	*Host
	k       *fakekernel.Kernel
	ledger  *ledger.Ledger
	clk     *clock.Manual
	counts  *counters
	rec     *recorder
	changes int
}

func newTestHost(t *testing.T, profile string) *testHost {
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
	l, err := ledger.Open(filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	allow, err := vfio.ParseAllowList([]string{"10de:*"})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	pci := vfio.New(m.Kernel)
	th := &testHost{k: m.Kernel, ledger: l, clk: clock.NewManual(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)),
		counts: &counters{}, rec: &recorder{}}
	th.Host = New(Deps{
		Config:    Config{NodeName: "gpu-1", BindTimeout: 5 * time.Second, IdlePolicy: vfio.IdleNone, FabricMode: FabricAuto},
		PCI:       pci,
		Binder:    vfio.NewBinder(pci, vfio.WithAllowList(allow), vfio.WithWriteTimeout(5*time.Second)),
		Inventory: inventory.New(pci, inventory.WithFactStore(l)),
		Ledger:    l,
		Proc:      ProcFor(m.Kernel, "/proc", true),
		Clock:     th.clk,
		Recorder:  th.rec,
		Counters:  th.counts,
		Log:       log,
		Changed:   func() { th.changes++ },
	})
	if err := th.Discover(); err != nil {
		t.Fatal(err)
	}
	if err := th.InitReadiness(allow); err != nil {
		t.Fatal(err)
	}
	if err := th.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	return th
}

func (th *testHost) driver(t *testing.T, addr string) string {
	t.Helper()
	d, err := th.Device(addr)
	if err != nil {
		t.Fatal(err)
	}
	return d.Driver
}

// A release whose GPU a VM still holds open is refused, and when forced the
// GPU is kept back from the idle driver and from new claims until the VM
// lets go; then it goes to the idle driver and is offered again.
func TestHostKeepsAGPUBackWhileAVMHoldsItOpen(t *testing.T) {
	th := newTestHost(t, "a100-pcie-4")
	ctx := context.Background()
	addrs := th.Addresses()
	if len(addrs) != 4 {
		t.Fatalf("%d GPUs discovered, want 4", len(addrs))
	}
	addr := addrs[0]
	if d := th.driver(t, addr); d != "" {
		t.Fatalf("free GPU on %q after reconcile with idle policy none, want no driver", d)
	}
	c, err := th.ledger.Adopt("vm-1", []string{addr}, nil, th.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	unlock := th.LockGPUs(addr)
	err = th.Bind(ctx, "claim vm-1", addr)
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	if d := th.driver(t, addr); d != vfio.DriverVFIO {
		t.Fatalf("bound GPU on %q", d)
	}
	g, _ := th.GPU(addr)
	closeGroup, err := th.k.OpenGroup(g.IOMMUGroup, fakekernel.Process{PID: 4242, Comm: "qemu-system-x86"})
	if err != nil {
		t.Fatal(err)
	}

	var ae *api.Error
	if err := th.RefuseInUse(c.ID, c.GPUs); !errors.As(err, &ae) || ae.Code != api.CodeInUse {
		t.Fatalf("release of a claim whose GPU is open: %v, want in_use", err)
	}
	if th.counts.refusedInUse != 1 {
		t.Errorf("refused releases counted %d, want 1", th.counts.refusedInUse)
	}

	// The release goes through (forced): the GPU is kept back.
	_, scan, unlock, err := th.ReleaseLocked(c.ID, "release vm-1", func() (ledger.Claim, error) {
		return th.ledger.Release(c.ID, th.clk.Now())
	})
	if err != nil {
		t.Fatal(err)
	}
	th.ToIdleScanned(ctx, "release vm-1", c.GPUs, "", scan)
	unlock()
	if !th.IsReturning(addr) {
		t.Fatal("a released GPU a VM holds open is not kept back")
	}
	if d := th.driver(t, addr); d != vfio.DriverVFIO {
		t.Fatalf("a GPU a VM holds open went to %q", d)
	}
	if free := th.ledger.Totals(th.clk.Now())[g.Model].Free; free != 3 {
		t.Fatalf("%d GPUs free while one is kept back, want 3", free)
	}

	th.CheckReturning(ctx) // still open: nothing moves
	if !th.IsReturning(addr) {
		t.Fatal("CheckReturning returned a GPU still held open")
	}
	closeGroup()
	changes := th.changes
	th.CheckReturning(ctx)
	if th.IsReturning(addr) {
		t.Fatal("GPU still kept back after its group was closed")
	}
	if d := th.driver(t, addr); d != "" {
		t.Fatalf("returned GPU on %q, want the idle policy's none", d)
	}
	if free := th.ledger.Totals(th.clk.Now())[g.Model].Free; free != 4 {
		t.Fatalf("%d GPUs free after the return, want 4", free)
	}
	if th.changes == changes {
		t.Error("the return did not tell that capacity changed")
	}
	if th.rec.ops["bind"] == 0 || th.rec.ops["release"] == 0 {
		t.Errorf("VFIO operations recorded %v, want binds and releases", th.rec.ops)
	}
}

// A GPU that vanishes from the bus is fenced: out of the ledger's capacity,
// its reason kept, and the change told.
func TestHostFencesAGPUGoneFromTheBus(t *testing.T) {
	th := newTestHost(t, "a100-pcie-4")
	addr := th.Addresses()[1]
	g, _ := th.GPU(addr)
	if err := th.k.Remove(addr); err != nil {
		t.Fatal(err)
	}
	th.CheckHealth()
	if th.Health(addr) == "" {
		t.Fatal("a GPU gone from the bus is not fenced")
	}
	if free := th.ledger.Totals(th.clk.Now())[g.Model].Free; free != 3 {
		t.Fatalf("%d GPUs free with one fenced, want 3", free)
	}
	if th.changes == 0 {
		t.Error("the fence did not tell that capacity changed")
	}
}
