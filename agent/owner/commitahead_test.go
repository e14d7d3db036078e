package owner

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/vfio"
)

// gatedHold is a registry whose holds are answered only once the test's
// check has run (the ledger's commit is then in flight or written), or
// not at all: with down set they fail as an unreachable registry does,
// after taking no effect.
type gatedHold struct {
	*names.Registry
	before func()
	down   bool
}

func (r *gatedHold) Hold(ctx context.Context, key names.Key, caller, owner, request string, recall bool) (names.Record, error) {
	if r.before != nil {
		r.before()
	}
	if r.down {
		return names.Record{}, &names.UnavailableError{Op: names.OpHold, Key: key, Reason: "test: no leader answered"}
	}
	return r.Registry.Hold(ctx, key, caller, owner, request, recall)
}

func (r *gatedHold) Lookup(ctx context.Context, key names.Key, mode names.ReadMode) (names.Record, error) {
	if r.down {
		return names.Record{}, &names.UnavailableError{Op: names.OpLookup, Key: key, Reason: "test: no leader answered"}
	}
	return r.Registry.Lookup(ctx, key, mode)
}

// awaitAwaiting returns once the ledger holds claim id committed ahead of
// its name, or fails the test (from any goroutine: it does not stop the
// caller) after 10 s.
func awaitAwaiting(t *testing.T, l *ledger.Ledger, id string) {
	awaitLedger(t, l, id, "the ledger's commit of "+id+" was not written while its hold was unanswered",
		func(c ledger.Claim, err error) bool { return err == nil && c.AwaitingName })
}

// awaitGone returns once the ledger no longer holds claim id, or fails the
// test (from any goroutine) after 10 s.
func awaitGone(t *testing.T, l *ledger.Ledger, id string) {
	awaitLedger(t, l, id, "the ledger still holds "+id+" after its deadline",
		func(_ ledger.Claim, err error) bool { return err != nil })
}

// awaitLedger returns once done holds for what the ledger has under id,
// or fails the test with failure after 10 s.
func awaitLedger(t *testing.T, l *ledger.Ledger, id, failure string, done func(ledger.Claim, error) bool) {
	deadline := time.Now().Add(10 * time.Second)
	for !done(l.Get(id)) {
		if time.Now().After(deadline) {
			t.Error(failure)
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// killedCommit leaves what a commit killed between its two writes leaves:
// a reservation of items under id, bound, committed ahead of its name. It
// returns the reservation.
func (o *testOwner) killedCommit(t *testing.T, id string, items []api.Item) ledger.Claim {
	t.Helper()
	if _, err := o.Reserve(context.Background(), id, api.ReserveRequest{Items: items, Coordinator: "a"}); err != nil {
		t.Fatal(err)
	}
	r, err := o.ledger.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.ledger.CommitAwaitingName(id, r.CreatedAt, o.clk.Now()); err != nil {
		t.Fatal(err)
	}
	return r
}

// newOverlapOwner is a test owner whose free GPUs stay on vfio-pci (the
// default), so that an early hold overlaps the reservation, with reg, a
// gated local registry, as its name registry.
func newOverlapOwner(t *testing.T) (*testOwner, *gatedHold) {
	o := newTestOwner(t, "l40s-4", nil)
	o.cfg.IdlePolicy = vfio.IdleVFIO
	reg := &gatedHold{Registry: names.NewLocal(o.clk.Now, 30*time.Second)}
	o.namesNow = func() Names { return reg }
	return o, reg
}

// A new claim's two durable writes go side by side: the ledger's commit is
// written while the registry's hold is still unanswered, and the claim is
// answered once both are, settled under the hold's token.
func TestCommitWrittenWhileTheHoldIsAnswered(t *testing.T) {
	for _, early := range []bool{true, false} {
		name := "early hold"
		if !early {
			name = "hold at commit"
		}
		t.Run(name, func(t *testing.T) {
			o, reg := newOverlapOwner(t)
			ctx := context.Background()
			rr := api.ReserveRequest{Items: []api.Item{{Model: l40s, Count: 2}}, Coordinator: "a", Commit: early}
			if !early {
				if _, err := o.Reserve(ctx, "vm-1", rr); err != nil {
					t.Fatal(err)
				}
			}
			reg.before = func() { awaitAwaiting(t, o.ledger, "vm-1") }
			var (
				c   api.Claim
				err error
			)
			if early {
				c, err = o.Reserve(ctx, "vm-1", rr)
			} else {
				c, err = o.Commit(ctx, "vm-1")
			}
			if err != nil || c.State != api.StateClaimed || len(c.GPUs) != 2 {
				t.Fatalf("claim = %+v, %v; want claimed on 2 GPUs", c, err)
			}
			rec, err := reg.Lookup(ctx, names.Claim("vm-1"), names.Linearizable)
			if err != nil || rec.Owner != "gpu-1" {
				t.Fatalf("the name: %+v, %v; want held on gpu-1", rec, err)
			}
			lc, err := o.ledger.Get("vm-1")
			if err != nil || !lc.Named() || lc.NameToken != rec.Token {
				t.Fatalf("the ledger's claim: %+v, %v; want committed under token %d", lc, err, rec.Token)
			}
		})
	}
}

// A hold refused after the commit was written takes the commit back, and
// its GPUs go back to the idle driver: nothing of it stays, in memory or
// on disk. A registry that does not answer gives the coordinator its
// reservation back, to commit again.
func TestCommitTakenBackWhenTheHoldFails(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		o, reg := newOverlapOwner(t)
		ctx := context.Background()
		if _, err := reg.Registry.Hold(ctx, names.Claim("vm-1"), "b", "gpu-0", "another request", false); err != nil {
			t.Fatal(err)
		}
		reg.before = func() { awaitAwaiting(t, o.ledger, "vm-1") }
		rr := api.ReserveRequest{Items: []api.Item{{Model: l40s, Count: 2}}, Coordinator: "a", Commit: true}
		if c, err := o.Reserve(ctx, "vm-1", rr); !api.IsCode(err, api.CodeConflict) {
			t.Fatalf("claim of an ID held on gpu-0 = %+v, %v; want a conflict", c, err)
		}
		if c, err := o.ledger.Get("vm-1"); err == nil {
			t.Fatalf("the ledger keeps %+v after the refusal", c)
		}
		if free := o.ledger.Free(o.clk.Now())[l40s]; free != 4 {
			t.Fatalf("free L40S = %d after the refusal; want 4", free)
		}
		l := o.h.Ledger
		if err := l.Abandon(); err != nil {
			t.Fatal(err)
		}
		again, err := ledger.Open(l.Path())
		if err != nil {
			t.Fatal(err)
		}
		defer again.Close()
		if c, err := again.Get("vm-1"); err == nil {
			t.Fatalf("the ledger's file keeps %+v after the refusal", c)
		}
	})
	t.Run("unavailable", func(t *testing.T) {
		o, reg := newOverlapOwner(t)
		reg.down = true
		ctx := context.Background()
		reg.before = func() { awaitAwaiting(t, o.ledger, "vm-1") }
		rr := api.ReserveRequest{Items: []api.Item{{Model: l40s, Count: 2}}, Coordinator: "a", Commit: true}
		c, err := o.Reserve(ctx, "vm-1", rr)
		if err != nil || c.State != api.StateReserved {
			t.Fatalf("claim with the registry down = %+v, %v; want the reservation back", c, err)
		}
		if lc, err := o.ledger.Get("vm-1"); err != nil || lc.State != ledger.StateReserved || lc.AwaitingName || !lc.ExpiresAt.After(o.clk.Now()) {
			t.Fatalf("the ledger has %+v, %v; want the live reservation", lc, err)
		}
		reg.down, reg.before = false, nil
		if c, err := o.Commit(ctx, "vm-1"); err != nil || c.State != api.StateClaimed {
			t.Fatalf("commit once the registry answers = %+v, %v; want claimed", c, err)
		}
	})
}

// Awaiting its name, a commit is listed as the reservation it was, under
// its deadline, and it is decided by then: a hold still unanswered when
// the lease ends takes the commit back and frees its GPUs, as the sweep
// drops a reservation, and the name the late hold took is let go. A
// reservation is never listed past its deadline while its owner runs.
func TestCommitAwaitingItsNameDecidedByItsDeadline(t *testing.T) {
	for _, tc := range []struct {
		name string
		held bool
	}{{"hold answered late", true}, {"hold failed late", false}} {
		held := tc.held
		t.Run(tc.name, func(t *testing.T) {
			o, reg := newOverlapOwner(t)
			ctx := context.Background()
			rr := api.ReserveRequest{Items: []api.Item{{Model: l40s, Count: 2}}, Coordinator: "a"}
			r, err := o.Reserve(ctx, "vm-1", rr)
			if err != nil {
				t.Fatal(err)
			}
			reg.before = func() {
				awaitAwaiting(t, o.ledger, "vm-1")
				lc, err := o.ledger.Get("vm-1")
				if v := o.ClaimView(lc); err != nil || v.State != api.StateReserved || !v.ExpiresAt.Equal(r.ExpiresAt) {
					t.Errorf("awaiting its name, the claim is listed as %+v, %v; want reserved until %s", v, err, r.ExpiresAt)
				}
				o.h.Clock.Set(r.ExpiresAt)
				awaitGone(t, o.ledger, "vm-1")
				reg.down = !held
			}
			c, err := o.Commit(ctx, "vm-1")
			if !api.IsCode(err, api.CodeLeaseExpired) {
				t.Fatalf("commit whose hold answered after the lease = %+v, %v; want lease expired", c, err)
			}
			reg.down = false
			if rec, err := reg.Lookup(ctx, names.Claim("vm-1"), names.Linearizable); err == nil {
				t.Fatalf("the name is %+v after the commit was taken back; want it let go", rec)
			}
			if free := o.ledger.Free(o.clk.Now())[l40s]; free != 4 {
				t.Fatalf("free L40S = %d; want 4", free)
			}
			if c, err := o.Commit(ctx, "vm-1"); !api.IsCode(err, api.CodeNotFound) {
				t.Fatalf("commit again = %+v, %v; want not found", c, err)
			}
		})
	}
}

// What a crash between the two writes leaves, a commit awaiting its name,
// is decided from the registry, by the anti-entropy pass or a retried
// commit: kept under the registry's token when it holds the ID here for
// the claim's request; taken back, its GPUs freed, when it holds the ID
// nowhere, elsewhere or for another request; left awaiting while the
// registry does not answer.
func TestCommitAwaitingItsNameDecidedByTheRegistry(t *testing.T) {
	items := []api.Item{{Model: l40s, Count: 2}}
	digest := RequestDigest(api.ReserveRequest{Items: items})
	cases := []struct {
		name   string
		held   func(ctx context.Context, reg *names.Registry) uint64 // the registry's token for a name held here, else 0
		down   bool
		retry  bool // decided by a retried commit, not the pass
		stands bool
	}{
		{name: "held here", stands: true, held: func(ctx context.Context, reg *names.Registry) uint64 {
			rec, err := reg.Hold(ctx, names.Claim("vm-1"), "a", "gpu-1", digest, false)
			if err != nil {
				panic(err)
			}
			return rec.Token
		}},
		{name: "held here, retried commit", stands: true, retry: true, held: func(ctx context.Context, reg *names.Registry) uint64 {
			rec, err := reg.Hold(ctx, names.Claim("vm-1"), "a", "gpu-1", digest, false)
			if err != nil {
				panic(err)
			}
			return rec.Token
		}},
		{name: "held nowhere"},
		{name: "held nowhere, retried commit", retry: true},
		{name: "held elsewhere", held: func(ctx context.Context, reg *names.Registry) uint64 {
			if _, err := reg.Hold(ctx, names.Claim("vm-1"), "a", "gpu-0", digest, false); err != nil {
				panic(err)
			}
			return 0
		}},
		{name: "held here for another request", held: func(ctx context.Context, reg *names.Registry) uint64 {
			if _, err := reg.Hold(ctx, names.Claim("vm-1"), "a", "gpu-1", "another request", false); err != nil {
				panic(err)
			}
			return 0
		}},
		{name: "registry down", down: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, reg := newOverlapOwner(t)
			ctx := context.Background()
			var token uint64
			if tc.held != nil {
				token = tc.held(ctx, reg.Registry)
			}
			r := o.killedCommit(t, "vm-1", items)
			if v, err := o.Lookup(ctx, "vm-1"); err != nil || v.State != api.StateReserved {
				t.Fatalf("Lookup of the undecided commit = %+v, %v; want it shown reserved, not claimed", v, err)
			}
			reg.down = tc.down
			var (
				answer api.Claim
				err    error
			)
			if tc.retry {
				answer, err = o.Commit(ctx, "vm-1")
			} else {
				rep := o.AntiEntropyPass(ctx)
				switch {
				case tc.down && (len(rep.Settled)+len(rep.Undone) > 0 || !slices.Equal(rep.Undecided, []string{"vm-1"})):
					t.Fatalf("pass with the registry's lookups down: %+v; want vm-1 undecided", rep)
				case tc.stands && (len(rep.Settled) != 1 || len(rep.Undone) != 0):
					t.Fatalf("pass: %+v; want vm-1 settled", rep)
				case !tc.stands && !tc.down && (len(rep.Undone) != 1 || len(rep.Settled) != 0):
					t.Fatalf("pass: %+v; want vm-1 undone", rep)
				}
			}
			lc, lerr := o.ledger.Get("vm-1")
			switch {
			case tc.down:
				if lerr != nil || !lc.AwaitingName {
					t.Fatalf("with the registry down: %+v, %v; want the commit still awaiting its name", lc, lerr)
				}
			case tc.stands:
				if lerr != nil || !lc.Named() || lc.NameToken != token {
					t.Fatalf("the claim: %+v, %v; want it under token %d", lc, lerr, token)
				}
				if tc.retry && (err != nil || answer.State != api.StateClaimed) {
					t.Fatalf("retried commit = %+v, %v; want claimed", answer, err)
				}
			default:
				if lerr == nil {
					t.Fatalf("the ledger keeps %+v", lc)
				}
				if free := o.ledger.Free(o.clk.Now())[l40s]; free != 4 {
					t.Fatalf("free L40S = %d; want 4", free)
				}
				for _, addr := range r.GPUs {
					if d := o.h.Driver(t, addr); d == "vfio-pci" {
						t.Errorf("freed GPU %s is still on vfio-pci", addr)
					}
				}
				if tc.retry && !api.IsCode(err, api.CodeNotFound) {
					t.Fatalf("retried commit = %+v, %v; want not found", answer, err)
				}
			}
		})
	}
}

// A commit awaiting its name that a pass could not decide holds its GPUs
// past its deadline: the passes ask again from undecidedRetry on, doubling,
// not a whole antiEntropyEvery later, and go back to their pace once it is
// decided.
func TestUndecidedCommitAskedAgainSoon(t *testing.T) {
	o, reg := newOverlapOwner(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o.killedCommit(t, "vm-1", []api.Item{{Model: l40s, Count: 2}})
	reg.down = true
	done := make(chan struct{})
	go func() { defer close(done); o.RunAntiEntropy(ctx) }()
	defer func() { cancel(); <-done }()
	clk := o.h.Clock
	// next waits for the n-th pass and for the timer of the next one, and
	// says when that one comes.
	next := func(n int) time.Duration {
		t.Helper()
		awaitUsers(t, "pass", func() int { return int(o.AntiEntropyPasses()) }, n)
		awaitUsers(t, "the next pass's timer", clk.Pending, 1)
		d, _ := clk.Next()
		return d
	}
	if d := next(1); d != undecidedRetry {
		t.Fatalf("undecided after the first pass, the next comes in %v; want %v", d, undecidedRetry)
	}
	clk.Advance(undecidedRetry)
	if d := next(2); d != 2*undecidedRetry {
		t.Fatalf("undecided after the second pass, the next comes in %v; want %v", d, 2*undecidedRetry)
	}
	reg.down = false
	clk.Advance(2 * undecidedRetry)
	if d := next(3); d < antiEntropyEvery*4/5 {
		t.Fatalf("decided, the next pass comes in %v; want the pace, at least %v", d, antiEntropyEvery*4/5)
	}
	if c, err := o.ledger.Get("vm-1"); err == nil {
		t.Fatalf("the ledger keeps %+v after the registry answered that it holds the ID nowhere", c)
	}
}
