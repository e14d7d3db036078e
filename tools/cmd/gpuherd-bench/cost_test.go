package main

import (
	"log/slog"
	"math"
	"testing"
	"time"
)

// TestCostPerOperationDoesNotGrow runs the cost measurement at 3 and 6
// servers and holds every figure to what docs/protocol.md states for any
// number of servers: a figure that grew with the servers (asking every
// server, a broadcast) would pass the bound at 6 servers already. The
// figures that do not depend on which agents happen to coordinate, own or
// lead (raft appends, fsyncs) must be the same at both sizes, and none may
// be zero where the protocol cannot do without it.
func TestCostPerOperationDoesNotGrow(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 9 agents and a registry")
	}
	cc := costConfig{
		sizes:    []int{3, 6},
		ops:      8,
		quiet:    100 * time.Millisecond,
		converge: time.Minute,
		seed:     1,
		log:      slog.New(slog.DiscardHandler),
		progress: t.Logf,
	}
	rs := runCost(cc)
	for _, r := range rs {
		if r.err != nil {
			t.Fatalf("%d servers: %v", r.n, r.err)
		}
		if r.unsettled > 0 || r.strayAppends > 0 {
			t.Errorf("%d servers: %d windows closed with something still moving, %d raft appends inside windows not naming the operation's ID", r.n, r.unsettled, r.strayAppends)
		}
		for k := range opKinds {
			// An election (a loaded machine missing heartbeats) writes
			// the voters' stores: such operations are left out, and
			// reported; most must remain.
			if len(r.ops[k]) < cc.ops/2 {
				t.Fatalf("%d servers: %d of %d %ss measured (%d operations left out: registry elections, 503s retried)", r.n, len(r.ops[k]), cc.ops, k, r.leftOut)
			}
			f, s := r.figures(k), stated[k]
			for _, c := range []struct {
				what  string
				got   meanMax
				bound int
			}{{"peer API requests (less redirects)", figure(r.ops[k], func(s opSample) int { return s.peer - s.redirects }), s.peer}, {"raft appends", f.appends, s.appends}, {"ledger fsyncs", f.ledger, s.ledger}, {"registry fsyncs", f.store, s.store}} {
				if c.got.max > c.bound {
					t.Errorf("%d servers: a %s cost %d %s; docs/protocol.md states at most %d whatever the number of servers", r.n, k, c.got.max, c.what, c.bound)
				}
			}
			t.Logf("%d servers, %s: peer %v, raft appends %v, fsyncs ledger %v registry %v", r.n, k, f.peer, f.appends, f.ledger, f.store)
		}
		// What cannot be zero: the claim's commit and the release on the
		// owner's disk, each registry write on a majority of three voters
		// and appended to at least one follower before it commits, and a
		// request between agents in most operations.
		for _, need := range []struct {
			k                      opKind
			ledger, store, appends int
			somePeer               bool
		}{{opClaim, 1, 2, 1, true}, {opGet, 0, 0, 0, true}, {opRelease, 1, 2, 1, true}} {
			for i, s := range r.ops[need.k] {
				if s.ledger < need.ledger || s.store < need.store || s.appends < need.appends {
					t.Errorf("%d servers, %s %d: ledger %d, registry %d fsyncs, %d raft appends; it cannot do with fewer than %d, %d, %d",
						r.n, need.k, i, s.ledger, s.store, s.appends, need.ledger, need.store, need.appends)
				}
			}
			if f := r.figures(need.k); need.somePeer && f.peer.mean == 0 {
				t.Errorf("%d servers: no %s sent a single peer API request", r.n, need.k)
			}
		}
	}
	small, large := rs[0], rs[1]
	for k := range opKinds {
		a, b := small.figures(k), large.figures(k)
		for _, c := range []struct {
			what string
			x, y float64
		}{{"raft appends", a.appends.mean, b.appends.mean}, {"ledger fsyncs", a.ledger.mean, b.ledger.mean}, {"registry fsyncs", a.store.mean, b.store.mean}} {
			if math.Abs(c.y-c.x) > 0.5 {
				t.Errorf("%s %s per operation: %.2f at %d servers, %.2f at %d", k, c.what, c.x, small.n, c.y, large.n)
			}
		}
	}
}
