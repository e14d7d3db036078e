package names

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkNameCycle measures what the claim path will add per claim: an
// Acquire, a Confirm and a Release of one claim ID, on three voters with
// raft over mutual TLS on loopback and their stores on disk. "leader"
// calls the leader's Registry; "follower" calls a follower's, which
// forwards each operation to the leader (in process here; the peer API's
// HTTPS round trip in the agent). Reported besides ns/op: the cycle's p50
// and p99, and the store commits (each one fsync of bbolt's data pages
// and one of its meta page) per cycle, on all voters and on the leader.
func BenchmarkNameCycle(b *testing.B) {
	voters := []string{"node-a", "node-b", "node-c"}
	ca := newTLSCA(b, voters...)
	regs := tlsCluster(b, ca, voters, LANTiming())
	leader := waitLeader(b, regs)
	follower := "node-a"
	if follower == leader {
		follower = "node-b"
	}
	for _, via := range []string{"leader", "follower"} {
		b.Run(via, func(b *testing.B) {
			node := leader
			if via == "follower" {
				node = follower
			}
			reg := regs[node]
			ctx := context.Background()
			commits := func() (all, lead uint64) {
				for id, r := range regs {
					n := r.Store().Commits()
					all += n
					if id == leader {
						lead = n
					}
				}
				return all, lead
			}
			lat := make([]time.Duration, 0, b.N)
			all0, lead0 := commits()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				k := Claim(fmt.Sprintf("bench-%s-%d", via, i))
				start := time.Now()
				g, err := reg.Acquire(ctx, k, node, "", "req", nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := reg.Confirm(ctx, k, g.Record.Token, node, nil); err != nil {
					b.Fatal(err)
				}
				if _, err := reg.Release(ctx, k, g.Record.Token, node); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			all1, lead1 := commits()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(all1-all0)/float64(b.N), "commits/cycle")
			b.ReportMetric(float64(lead1-lead0)/float64(b.N), "leader-commits/cycle")
		})
	}
}
