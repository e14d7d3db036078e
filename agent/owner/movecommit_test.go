package owner

import (
	"context"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
)

// lateConfirm is a registry whose confirms take effect, and whose answer
// then comes back after the reservation's lease ran out (the owner was
// paused, or the registry slow): the ledger refuses the commit that the
// confirm allowed. With sweep, the owner's sweep drops the lapsed
// reservation meanwhile too.
type lateConfirm struct {
	*names.Registry
	t     *testing.T
	o     *testOwner
	sweep bool
	swept chan struct{}
}

func (r *lateConfirm) Confirm(ctx context.Context, key names.Key, token uint64, owner string, members []string) (names.Record, error) {
	rec, err := r.Registry.Confirm(ctx, key, token, owner, members)
	c, gerr := r.o.ledger.Get(key.Name)
	if gerr != nil {
		r.t.Fatalf("the reservation being committed: %v", gerr)
	}
	r.o.h.Clock.Advance(31 * time.Second)
	if r.sweep {
		// The sweep drops it from the ledger, then waits for its GPUs,
		// which the commit holds.
		go func() {
			r.o.Sweep(context.Background())
			close(r.swept)
		}()
		r.o.awaitLockWaiter(r.t, c.GPUs[0])
	}
	return rec, err
}

// A resize's move reserves the claim on this server under the move's
// token; the commit confirms the move (the name is held here from then
// on) and the ledger then refuses it: the reservation lapsed while the
// confirm was answered. The name must go back to the server it came from,
// whose copy is the claim, not be released: released, it left that copy
// nameless, the group's resize reported the node released, and its copy
// stayed held after the group's delete (chaos seed 2: group g1 held 2 of
// its 3 nodes, then kept one after the acknowledged delete).
func TestFailedCommitOfAMoveHandsTheNameBack(t *testing.T) {
	for _, swept := range []bool{false, true} {
		name := "lease ran out"
		if swept {
			name = "swept"
		}
		t.Run(name, func(t *testing.T) {
			o := newTestOwner(t, "l40s-4", nil)
			reg := &lateConfirm{Registry: names.NewLocal(o.clk.Now, 5*time.Minute), t: t, o: o, sweep: swept, swept: make(chan struct{})}
			o.namesNow = func() Names { return reg }
			origin := &originPeer{}
			o.peers = func() []Peer { return []Peer{{Name: "gpu-0", Owner: origin}} }
			ctx := context.Background()
			key := names.Claim("vm-m")
			held, err := reg.Hold(ctx, key, "coord", "gpu-0", "req", false)
			if err != nil {
				t.Fatal(err)
			}
			mv, err := reg.Move(ctx, key, held.Token, "gpu-0", "gpu-1", "coord")
			if err != nil {
				t.Fatal(err)
			}
			rr := api.ReserveRequest{Items: []api.Item{{Model: l40s, Count: 1}}, Coordinator: "coord", Token: mv.Move.Token}
			if _, err := o.Reserve(ctx, "vm-m", rr); err != nil {
				t.Fatal(err)
			}
			if c, err := o.Commit(ctx, "vm-m"); err == nil {
				t.Fatalf("commit of a reservation that lapsed while its name was confirmed answered %+v", c)
			}
			if swept {
				<-reg.swept
			}
			if c, err := o.ledger.Get("vm-m"); err == nil && c.State == ledger.StateCommitted {
				t.Fatalf("the lapsed reservation was committed: %+v", c)
			}
			rec, err := reg.Lookup(ctx, key, names.Linearizable)
			if err != nil {
				t.Fatalf("the moved name after the failed commit: %v; want it handed back to gpu-0, not released", err)
			}
			if rec.State != names.StateHeld || rec.Move == nil || rec.Move.To != "gpu-0" {
				t.Fatalf("the moved name after the failed commit: %+v; want it moving back to gpu-0", rec)
			}
			if origin.nudged != 1 {
				t.Fatalf("gpu-0 was asked %d times to take the name back, want once", origin.nudged)
			}
			// gpu-0 takes it onto its copy (as its commit does).
			if _, err := reg.Registry.Confirm(ctx, key, rec.Move.Token, "gpu-0", nil); err != nil {
				t.Fatalf("gpu-0 taking its name back: %v", err)
			}
			// This server's pass leaves it there.
			if rep := o.AntiEntropyPass(ctx); len(rep.Freed)+len(rep.HandedBack) > 0 {
				t.Fatalf("pass after the hand-back: %+v", rep)
			}
			if rec, err := reg.Lookup(ctx, key, names.Linearizable); err != nil || rec.Owner != "gpu-0" {
				t.Fatalf("vm-m after gpu-0 took it back: %+v, %v", rec, err)
			}
		})
	}
}
