package host_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/host/hosttest"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// A release whose GPU a VM still holds open is refused, and when forced the
// GPU is kept back from the idle driver and from new claims until the VM
// lets go; then it goes to the idle driver and is offered again.
func TestHostKeepsAGPUBackWhileAVMHoldsItOpen(t *testing.T) {
	th := hosttest.New(t, "a100-pcie-4")
	ctx := context.Background()
	addrs := th.Addresses()
	if len(addrs) != 4 {
		t.Fatalf("%d GPUs discovered, want 4", len(addrs))
	}
	addr := addrs[0]
	if d := th.Driver(t, addr); d != "" {
		t.Fatalf("free GPU on %q after reconcile with idle policy none, want no driver", d)
	}
	c, err := th.Ledger.Adopt("vm-1", []string{addr}, nil, th.Clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	unlock := th.LockGPUs(addr)
	err = th.Bind(ctx, "claim vm-1", addr)
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	if d := th.Driver(t, addr); d != vfio.DriverVFIO {
		t.Fatalf("bound GPU on %q", d)
	}
	g, _ := th.GPU(addr)
	closeGroup, err := th.Kernel.OpenGroup(g.IOMMUGroup, fakekernel.Process{PID: 4242, Comm: "qemu-system-x86"})
	if err != nil {
		t.Fatal(err)
	}

	var ae *api.Error
	if err := th.RefuseInUse(c.ID, c.GPUs); !errors.As(err, &ae) || ae.Code != api.CodeInUse {
		t.Fatalf("release of a claim whose GPU is open: %v, want in_use", err)
	}
	if th.Counters.RefusedInUse != 1 {
		t.Errorf("refused releases counted %d, want 1", th.Counters.RefusedInUse)
	}

	// The release goes through (forced): the GPU is kept back.
	_, scan, unlock, err := th.ReleaseLocked(c.ID, "release vm-1", func() (ledger.Claim, error) {
		return th.Ledger.Release(c.ID, th.Clock.Now())
	})
	if err != nil {
		t.Fatal(err)
	}
	th.ToIdleScanned(ctx, "release vm-1", c.GPUs, "", scan)
	unlock()
	if !th.IsReturning(addr) {
		t.Fatal("a released GPU a VM holds open is not kept back")
	}
	if d := th.Driver(t, addr); d != vfio.DriverVFIO {
		t.Fatalf("a GPU a VM holds open went to %q", d)
	}
	if free := th.Ledger.Totals(th.Clock.Now())[g.Model].Free; free != 3 {
		t.Fatalf("%d GPUs free while one is kept back, want 3", free)
	}

	th.CheckReturning(ctx) // still open: nothing moves
	if !th.IsReturning(addr) {
		t.Fatal("CheckReturning returned a GPU still held open")
	}
	closeGroup()
	changes := th.Changes()
	th.CheckReturning(ctx)
	if th.IsReturning(addr) {
		t.Fatal("GPU still kept back after its group was closed")
	}
	if d := th.Driver(t, addr); d != "" {
		t.Fatalf("returned GPU on %q, want the idle policy's none", d)
	}
	if free := th.Ledger.Totals(th.Clock.Now())[g.Model].Free; free != 4 {
		t.Fatalf("%d GPUs free after the return, want 4", free)
	}
	if th.Changes() == changes {
		t.Error("the return did not tell that capacity changed")
	}
	if th.Recorder.Ops("bind") == 0 || th.Recorder.Ops("release") == 0 {
		t.Errorf("VFIO operations recorded: %d binds, %d releases; want some of both", th.Recorder.Ops("bind"), th.Recorder.Ops("release"))
	}
}

// A GPU that vanishes from the bus is fenced: out of the ledger's capacity,
// its reason kept, and the change told.
func TestHostFencesAGPUGoneFromTheBus(t *testing.T) {
	th := hosttest.New(t, "a100-pcie-4")
	addr := th.Addresses()[1]
	g, _ := th.GPU(addr)
	if err := th.Kernel.Remove(addr); err != nil {
		t.Fatal(err)
	}
	th.CheckHealth()
	if th.Health(addr) == "" {
		t.Fatal("a GPU gone from the bus is not fenced")
	}
	if free := th.Ledger.Totals(th.Clock.Now())[g.Model].Free; free != 3 {
		t.Fatalf("%d GPUs free with one fenced, want 3", free)
	}
	if th.Changes() == 0 {
		t.Error("the fence did not tell that capacity changed")
	}
}
