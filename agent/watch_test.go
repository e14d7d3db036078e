package agent

import (
	"context"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/vfio"
)

// TestWatchPutsBackAGPUReboundBehindTheLedger: with the agent running and
// the periodic driver check an hour away, a claimed GPU and a free one
// rebound to nvidia behind the ledger are put back by the PCI watch alone,
// and an unusable GPU left on nvidia is not taken for one.
func TestWatchPutsBackAGPUReboundBehindTheLedger(t *testing.T) {
	k := readinessKernel(t)
	ra := newReadinessAgentWith(t, k, "vfio-pci", func(c *Config) { c.DriverCheckInterval = Duration(time.Hour) })
	ctx := context.Background()
	c, err := ra.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	claimed := c.GPUs[0].PCIAddress
	free := gpuB
	if claimed == gpuB {
		free = gpuC
	}
	b := vfio.NewBinder(vfio.New(k))
	start := time.Now()
	for _, addr := range []string{claimed, free} {
		if _, err := b.Release(ctx, addr, vfio.IdleNVIDIA); err != nil {
			t.Fatal(err)
		}
	}
	ra.await(t, "both GPUs back on vfio-pci", func() bool {
		return driverOf(t, k, claimed) == vfio.DriverVFIO && driverOf(t, k, free) == vfio.DriverVFIO
	})
	t.Logf("rebound behind the ledger -> put back by the watch in %v", time.Since(start))
	if n := counter(t, ra.Agent, "gpuherd_driver_changes_unexpected_total"); n != 2 {
		t.Errorf("gpuherd_driver_changes_unexpected_total = %v, want 2", n)
	}
	if d := driverOf(t, k, gpuA); d != "nvidia" {
		t.Errorf("the unusable GPU moved to %q", d)
	}
	if n := ra.host.CheckDrivers(ctx, nil); n != 0 {
		t.Errorf("the periodic check still found %d GPUs off their driver (the unusable one must not count)", n)
	}
}
