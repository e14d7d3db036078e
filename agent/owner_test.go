package agent

import (
	"context"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/vfio"
)

// A second Reserve of the same claim (a client's retry through another
// coordinator) adopts the reservation in the ledger, then waits for its
// GPUs' device locks. When the first coordinator aborts the reservation
// meanwhile, the abort returns the GPUs to the idle driver first; the
// adopting Reserve must not bind them again for a reservation that is gone.
// go test -race ./agent failed on this in a loop of runs
// (TestFaultConcurrentRetriesOfOneClaim: "free GPU … is still on vfio-pci").
func TestReserveOfAnAbortedReservationBindsNothing(t *testing.T) {
	dir := t.TempDir()
	m := machine(t, "a100-pcie-4", dir)
	a := startAgent(t, testConfig(t, dir), m, nil)
	defer a.Close()
	ctx := context.Background()
	rr := api.ReserveRequest{Items: []api.Item{{Model: "NVIDIA A100 80GB", Count: 1}}, Coordinator: "c1"}
	r, err := a.Reserve(ctx, "vm-1", rr)
	if err != nil {
		t.Fatal(err)
	}
	addr := r.GPUs[0].PCIAddress

	unlock := a.host.LockGPUs(addr) // as the first coordinator's abort holds it
	second := make(chan error, 1)
	go func() {
		_, err := a.Reserve(ctx, "vm-1", api.ReserveRequest{Items: rr.Items, Coordinator: "c2"})
		second <- err
	}()
	awaitLockWaiter(t, a, addr)
	// The abort's own steps: the ledger drops the reservation, its GPU goes
	// back to the idle driver under the device lock.
	if _, err := a.ledger.AbortReservation("vm-1", a.clk.Now()); err != nil {
		t.Fatal(err)
	}
	a.host.ToIdleLocked(ctx, "test abort", []string{addr}, "")
	unlock()

	if err := <-second; !api.IsCode(err, api.CodeNotFound) {
		t.Errorf("reserve that adopted an aborted reservation: %v, want not_found", err)
	}
	if d := driverOf(t, m.Kernel, addr); d != vfio.DriverNVIDIA {
		t.Errorf("free GPU %s is on %q after a reserve of an aborted reservation, want the idle driver", addr, d)
	}
	if _, err := a.ledger.Get("vm-1"); err == nil {
		t.Error("the aborted reservation is back in the ledger")
	}
}

// awaitLockWaiter returns once someone besides the test waits for addr's
// device lock.
func awaitLockWaiter(t *testing.T, a *Agent, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		waiting := a.host.DeviceLockUsers(addr) >= 2
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Reserve waited for the device lock of %s", addr)
		}
		time.Sleep(time.Millisecond)
	}
}
