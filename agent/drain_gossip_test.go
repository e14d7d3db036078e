package agent

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// Draining and undraining one GPU is a capacity change: the other agents see
// it through the re-advertised summary at once, not at the next periodic
// push/pull (set to an hour here, so only the immediate publish can pass).
func TestDrainGPUIsGossipedAtOnce(t *testing.T) {
	tc := newTestCluster(t)
	tc.tune = func(c *memberlist.Config) {
		fastGossip(c)
		c.PushPullInterval = time.Hour
	}
	a := tc.start("a", "l40s-4")
	b := tc.start("b", "l40s-4")
	const model = "NVIDIA L40S"
	tc.converge("both servers' L40S", func(x *Agent) bool { return freeOf(x, model) == 8 })

	ctx := context.Background()
	st, err := a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	addr := st.GPUs[0].PCIAddress
	if _, err := a.Drain(ctx, addr, "fan"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b sees a's drained GPU", 5*time.Second, func() bool { return freeOf(b, model) == 7 })
	if _, err := a.Undrain(ctx, addr); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b sees a's undrained GPU", 5*time.Second, func() bool { return freeOf(b, model) == 8 })
}
