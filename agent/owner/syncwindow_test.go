package owner

import (
	"context"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/vfio"
)

// gatedNames is a registry whose holds and name releases each wait for
// the test to let one through (open).
type gatedNames struct {
	Names
	open chan struct{}
}

func (r *gatedNames) Hold(ctx context.Context, key names.Key, caller, owner, request string, recall bool) (names.Record, error) {
	<-r.open
	return r.Names.Hold(ctx, key, caller, owner, request, recall)
}

func (r *gatedNames) ReleaseRemembering(ctx context.Context, key names.Key, token uint64, node string, keep time.Duration) (names.Record, error) {
	<-r.open
	return r.Names.ReleaseRemembering(ctx, key, token, node, keep)
}

// awaitSyncs returns once the ledger has asked for want fdatasyncs since
// from, or fails the test after 10 s; tick runs between two looks.
func awaitSyncs(t *testing.T, l *ledger.Ledger, from, want uint64, tick func()) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.Fdatasyncs()-from < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d fdatasyncs; want %d", l.Fdatasyncs()-from, want)
		}
		tick()
		time.Sleep(time.Millisecond)
	}
}

// Claims committed on one server while their holds are unanswered share
// fdatasyncs, and so do their releases while the registry lets their
// names go: a record written while another already waits beside its
// registry write (durableBeside) waits for its own registry answer, or
// for its lead, and the first such fdatasync covers the others. The
// first record, alone, syncs at once. Each record synced at once, as
// before, costs three fdatasyncs where this test wants two.
func TestFdatasyncsSharedWhileTheRegistryWrites(t *testing.T) {
	o := newTestOwner(t, "l40s-4", nil)
	o.cfg.IdlePolicy = vfio.IdleVFIO // no driver moves: the early hold overlaps the reservation
	reg := &gatedNames{Names: names.NewLocal(o.clk.Now, 30*time.Second), open: make(chan struct{})}
	o.namesNow = func() Names { return reg }
	// A lead of 5 ms of the test's clock, which moves only when the test
	// moves it: the fdatasyncs wait for the registry's answers.
	o.nameTime.observe(10 * time.Millisecond)
	ctx := context.Background()
	rr := api.ReserveRequest{Items: []api.Item{{Model: l40s, Count: 1}}, Coordinator: "a", Commit: true}
	// A first claim and release, answered as they come: the ledger's
	// first write also writes what its file lacks.
	go func() {
		for range 2 {
			reg.open <- struct{}{}
		}
	}()
	if _, err := o.Reserve(ctx, "vm-0", rr); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Abort(ctx, "vm-0"); err != nil {
		t.Fatal(err)
	}

	// burst runs op on ids[0], alone, then on the others at once; once
	// every op's ledger record is written (written), tick runs until the
	// ledger asked for beforeAnswers fdatasyncs, and the registry then
	// answers them one at a time. The burst must cost 2 fdatasyncs.
	burst := func(what string, ids []string, op func(id string) error, written func(id string), beforeAnswers uint64, tick func()) {
		t.Helper()
		syncs := o.ledger.Fdatasyncs()
		done := make(chan error, len(ids))
		go func() { done <- op(ids[0]) }()
		written(ids[0])
		awaitSyncs(t, o.ledger, syncs, 1, func() {}) // alone: at once
		for _, id := range ids[1:] {
			go func() { done <- op(id) }()
		}
		for _, id := range ids[1:] {
			written(id)
		}
		awaitSyncs(t, o.ledger, syncs, beforeAnswers, tick)
		if n := o.ledger.Fdatasyncs() - syncs; n != beforeAnswers {
			t.Fatalf("%s: %d fdatasyncs before the registry answered; want %d", what, n, beforeAnswers)
		}
		for range ids {
			reg.open <- struct{}{}
			if err := <-done; err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		if n := o.ledger.Fdatasyncs() - syncs; n != 2 {
			t.Fatalf("%s of %d claims cost %d fdatasyncs; want 2: one alone, one shared", what, len(ids), n)
		}
	}
	claim := func(id string) error {
		c, err := o.Reserve(ctx, id, rr)
		if err == nil && (c.State != api.StateClaimed || len(c.GPUs) != 1) {
			t.Errorf("claim %s = %+v; want claimed on 1 GPU", id, c)
		}
		return err
	}
	release := func(id string) error {
		c, err := o.Abort(ctx, id)
		if err == nil && !c.NameReleased {
			t.Errorf("release of %s answered %+v; want its name let go", id, c)
		}
		return err
	}
	awaiting := func(id string) { awaitAwaiting(t, o.ledger, id) }
	gone := func(id string) { awaitGone(t, o.ledger, id) }
	ids := []string{"vm-1", "vm-2", "vm-3"}
	burst("commit", ids, claim, awaiting, 1, func() {})
	burst("release", ids, release, gone, 1, func() {})
	for _, id := range ids {
		if _, err := reg.Lookup(ctx, names.Claim(id), names.Linearizable); err == nil {
			t.Errorf("the name of %s is still held after its release", id)
		}
	}
	// Unanswered, the waiting records are synced once their lead has
	// passed, before the registry answers.
	burst("commit with its lead passed", []string{"vm-4", "vm-5", "vm-6"}, claim, awaiting, 2,
		func() { o.h.Clock.Advance(5 * time.Millisecond) })
}
