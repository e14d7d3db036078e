package agent

import (
	"context"
	"fmt"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

// BenchmarkClusterClaimRelease is the hot path end to end in one process:
// a claim of one GPU through a coordinator that owns nothing (the ID's home
// vouching, reserve and commit on the owner over mutual TLS, one fsync),
// then its release through the owner. cmd/gpuherd-bench measures the same at
// 10 to 100 agents; this one is for profiles (-cpuprofile).
func BenchmarkClusterClaimRelease(b *testing.B) {
	tc := newTestCluster(b)
	tc.adjust = func(c *Config) { c.DirectorySettle = 0; c.IdleDriver = "vfio-pci" }
	coord := tc.start("a", "a100-pcie-4")
	owner := tc.start("b", "l40s-4")
	tc.start("c", "a100-pcie-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 4 })
	ctx := context.Background()
	req := api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}}
	for i := range 20 { // warm the connections
		id := fmt.Sprintf("warm-%d", i)
		if _, err := coord.Claim(ctx, id, req); err != nil {
			b.Fatal(err)
		}
		if _, err := owner.Release(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("vm-%d", i)
		c, err := coord.Claim(ctx, id, req)
		if err != nil || c.Node != "b" {
			b.Fatalf("claim %s: %+v, %v", id, c, err)
		}
		if _, err := owner.Release(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}
