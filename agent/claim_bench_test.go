package agent

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// BenchmarkClusterClaimRelease is the hot path end to end in one process:
// a claim of one GPU through a coordinator that owns nothing (with the name
// registry: acquire, reserve, commit with the owner's confirmation; without
// it: the ID's home vouching, reserve and commit), one fsync on the owner,
// then its release through the owner. It reports the claims' p50 and the
// releases' besides the mean of a claim and a release. tools/cmd/gpuherd-bench measures the
// same at 10 to 100 agents; this one is for profiles (-cpuprofile).
func BenchmarkClusterClaimRelease(b *testing.B) {
	for _, registry := range []bool{true, false} {
		name := "registry"
		if !registry {
			name = "directory"
		}
		b.Run(name, func(b *testing.B) {
			tc := newTestCluster(b)
			if !registry {
				tc.names = nil
			}
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
			var took, released []time.Duration
			for i := 0; b.Loop(); i++ {
				id := fmt.Sprintf("vm-%d", i)
				start := time.Now()
				c, err := coord.Claim(ctx, id, req)
				took = append(took, time.Since(start))
				if err != nil || c.Node != "b" {
					b.Fatalf("claim %s: %+v, %v", id, c, err)
				}
				start = time.Now()
				if _, err := owner.Release(ctx, id); err != nil {
					b.Fatal(err)
				}
				released = append(released, time.Since(start))
			}
			slices.Sort(took)
			slices.Sort(released)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "claim-p50-ms")
			b.ReportMetric(float64(released[len(released)/2].Microseconds())/1000, "release-p50-ms")
		})
	}
}

// BenchmarkClusterClaimOverSlowNetwork is BenchmarkClusterClaimRelease with
// every request from the coordinator to the other agents held for a
// network's round trip first (a proxy in between): what a claim costs when
// round trips wait on the network rather than on this machine's CPU, as
// between servers or data centres. The release runs on the owner, with no
// request across the slow links. The delays start at a millisecond: Go's
// timers are no finer than that while the process waits on the network.
func BenchmarkClusterClaimOverSlowNetwork(b *testing.B) {
	for _, rtt := range []time.Duration{time.Millisecond, 5 * time.Millisecond} {
		b.Run("rtt="+rtt.String(), func(b *testing.B) {
			tc := newTestCluster(b)
			tc.adjust = func(c *Config) { c.DirectorySettle = 0; c.IdleDriver = "vfio-pci" }
			coord := tc.start("a", "a100-pcie-4")
			owner := tc.start("b", "l40s-4")
			other := tc.start("c", "a100-pcie-4")
			tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 4 })
			slow := func(*http.Request) fault { return latency }
			newFaultProxy(b, tc, coord, owner, rtt, slow)
			newFaultProxy(b, tc, coord, other, rtt, slow)
			ctx := context.Background()
			req := api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}}
			claim := func(id string) {
				c, err := coord.Claim(ctx, id, req)
				if err != nil || c.Node != "b" {
					b.Fatalf("claim %s: %+v, %v", id, c, err)
				}
				if _, err := owner.Release(ctx, id); err != nil {
					b.Fatal(err)
				}
			}
			for i := range 20 { // warm the connections
				claim(fmt.Sprintf("warm-%d", i))
			}
			for i := 0; b.Loop(); i++ {
				claim(fmt.Sprintf("vm-%d", i))
			}
		})
	}
}
