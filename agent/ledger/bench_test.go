package ledger

import (
	"fmt"
	"sync"
	"testing"
)

// BenchmarkReserveCommit measures one claim's round trip on a real file
// with fsync: Reserve, Commit, and the Release that makes room for the next
// iteration — the cost a coordinator pays on the owner. Reserve writes no
// file (reservations live in memory), so that is two durable transactions
// per op: the Commit and the Release.
func BenchmarkReserveCommit(b *testing.B) {
	l := newLedger(b)
	r := req(Item{Model: h100, Count: 2})
	i := 0
	for b.Loop() {
		id := fmt.Sprintf("vm-%d", i)
		i++
		if _, err := l.Reserve(id, r, "coord", t0, lease); err != nil {
			b.Fatal(err)
		}
		if _, err := l.Commit(id, t0); err != nil {
			b.Fatal(err)
		}
		if _, err := l.Release(id, t0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReserveRelease measures a reservation that is given up (a
// coordinator that placed the claim elsewhere): Reserve and Release, with
// a committed claim and a live reservation of someone else on the server.
// No durable transaction.
func BenchmarkReserveRelease(b *testing.B) {
	l := newLedger(b)
	if _, err := l.Reserve("committed", req(Item{Model: h100, Count: 2}), "coord", t0, lease); err != nil {
		b.Fatal(err)
	}
	if _, err := l.Commit("committed", t0); err != nil {
		b.Fatal(err)
	}
	if _, err := l.Reserve("other", req(Item{Model: l40s, Count: 1}), "coord", t0, lease); err != nil {
		b.Fatal(err)
	}
	r := req(Item{Model: h100, Count: 2})
	i := 0
	for b.Loop() {
		id := fmt.Sprintf("vm-%d", i)
		i++
		if _, err := l.Reserve(id, r, "coord", t0, lease); err != nil {
			b.Fatal(err)
		}
		if _, err := l.Release(id, t0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParallelCommits is 8 claims committed and released at once on
// one server (a VM pool scaled up on it): the commits that wait on the
// same disk share journal records (group commit). It reports the durable
// writes per claim, without group commit 2 (its commit and its release),
// and the fdatasyncs they cost (one a write, and the checkpoints').
func BenchmarkParallelCommits(b *testing.B) {
	l := newLedger(b)
	r := req(Item{Model: h100, Count: 1})
	before, syncs := l.Syncs(), l.Fdatasyncs()
	round := 0
	for b.Loop() {
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("vm-%d-%d", round, w)
				if _, err := l.Reserve(id, r, "coord", t0, lease); err != nil {
					b.Error(err)
					return
				}
				if _, err := l.Commit(id, t0); err != nil {
					b.Error(err)
				}
				if _, err := l.Release(id, t0); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
		round++
	}
	b.ReportMetric(float64(l.Syncs()-before)/float64(8*round), "writes/claim")
	b.ReportMetric(float64(l.Fdatasyncs()-syncs)/float64(8*round), "fdatasyncs/claim")
	b.ReportMetric(float64(b.Elapsed())/float64(8*round)/1e6, "ms/claim")
}
