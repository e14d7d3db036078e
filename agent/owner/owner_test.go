package owner

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/host/hosttest"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/internal/keyedlock"
)

const (
	l40s = "NVIDIA L40S"
	a100 = "NVIDIA A100 80GB"
)

// counters is a fake of the anti-entropy counters.
type counters struct{}

func (counters) SetClaimDuplicates(int)    {}
func (counters) AntiEntropySkipped()       {}
func (counters) ClaimNameFreed()           {}
func (counters) ClaimNameAdopted()         {}
func (counters) ClaimDuplicateReleased()   {}
func (counters) ClaimAwaitingDecided(bool) {}

// alone is the server of a test owner: in no cluster, never drained.
type alone struct{ h *hosttest.Host }

func (alone) Cluster() Cluster { return nil }
func (alone) Peers() []Peer    { return nil }
func (alone) Drained() bool    { return false }
func (s alone) Changed()       { s.h.Changed() }

// testOwner is an owner on a simulated machine (hosttest), alone in its
// cluster, with reg as its name registry when set.
type testOwner struct {
	*Owner
	h *hosttest.Host
}

func newTestOwner(t *testing.T, profile string, reg Names, opts ...ledger.Option) *testOwner {
	t.Helper()
	h := hosttest.New(t, profile, opts...)
	o := New(Deps{
		Config:     Config{NodeName: "gpu-1", ReservationLease: 30 * time.Second, RememberReleased: time.Hour},
		Ledger:     h.Ledger,
		Host:       h.Host,
		Clock:      h.Clock,
		Recorder:   h.Recorder,
		Counters:   counters{},
		Log:        h.Log,
		Names:      func() Names { return reg },
		Server:     alone{h},
		ClaimLocks: &keyedlock.Set{},
	})
	return &testOwner{Owner: o, h: h}
}

// awaitLockWaiter returns once someone waits for the device lock of addr
// (the test holds it).
func (o *testOwner) awaitLockWaiter(t *testing.T, addr string) {
	t.Helper()
	awaitUsers(t, "the device lock of "+addr, func() int { return o.host.DeviceLockUsers(addr) }, 2)
}

// awaitUsers returns once n callers hold or wait for the lock what names
// (users counts them).
func awaitUsers(t *testing.T, what string, users func() int, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for users() < n {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d callers at %s", n, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A commit reads the reservation, then waits for its GPUs' device locks;
// an abort (or a sweep) that drops the reservation and returns its GPUs to
// the idle driver first must not be undone by the commit binding them
// again.
func TestCommitOfAnAbortedReservationBindsNothing(t *testing.T) {
	o := newTestOwner(t, "a100-pcie-4", nil)
	ctx := context.Background()
	r, err := o.Reserve(ctx, "vm-1", api.ReserveRequest{Items: []api.Item{{Model: a100, Count: 1}}, Coordinator: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	addr := r.GPUs[0].PCIAddress

	unlock := o.host.LockGPUs(addr)
	committed := make(chan error, 1)
	go func() {
		_, err := o.Commit(ctx, "vm-1")
		committed <- err
	}()
	o.awaitLockWaiter(t, addr)
	o.bound.Delete("vm-1") // what the abort does first
	if _, err := o.ledger.AbortReservation("vm-1", o.clk.Now()); err != nil {
		t.Fatal(err)
	}
	o.host.ToIdleLocked(ctx, "test abort", []string{addr}, "")
	unlock()

	if err := <-committed; !api.IsCode(err, api.CodeNotFound) {
		t.Errorf("commit of a reservation aborted while it waited: %v, want not_found", err)
	}
	if d := o.h.Driver(t, addr); d != "" {
		t.Errorf("free GPU %s is on %q after a commit of an aborted reservation, want the idle policy's none", addr, d)
	}
}

// The owner's hold goes out while the GPUs are still being reserved and
// bound (holdEarly), under the ID's commit lock. A hold whose reservation
// failed is let go before the answer when no claim of the ID is on the
// server (settleEarly), so the next server is not refused with the ID held
// here; one with a claim here is kept. The anti-entropy pass frees a name
// held with no claim only under the same lock (freeName), so it never
// frees an early hold before its reservation is made.
func TestEarlyHoldSettles(t *testing.T) {
	o := newTestOwner(t, "l40s-4", nil)
	reg := names.NewLocal(o.clk.Now, 30*time.Second)
	o.namesNow = func() Names { return reg }
	ctx := context.Background()
	rr := api.ReserveRequest{Items: []api.Item{{Model: l40s, Count: 1}}, Coordinator: "a", Commit: true}
	req := ledger.Request{Items: []ledger.Item{{Model: l40s, Count: 1}}}
	held := func(id string) (names.Record, bool) {
		rec, err := reg.Lookup(ctx, names.Claim(id), names.Linearizable)
		return rec, err == nil
	}

	// The reservation failed: let go.
	early := o.holdEarly(ctx, "vm-failed", rr, req)
	if early == nil {
		t.Fatal("no early hold on a server with room")
	}
	if rec, err := early.wait(); err != nil || rec.Owner != "gpu-1" {
		t.Fatalf("early hold: %+v, %v", rec, err)
	}
	o.settleEarly(ctx, early)
	if rec, ok := held("vm-failed"); ok {
		t.Fatalf("vm-failed still held (%+v) after its reservation failed", rec)
	}

	// A reservation stands: kept for its commit.
	early = o.holdEarly(ctx, "vm-kept", rr, req)
	if _, err := o.ledger.Reserve("vm-kept", req, "a", o.clk.Now(), time.Minute); err != nil {
		t.Fatal(err)
	}
	o.settleEarly(ctx, early)
	if rec, ok := held("vm-kept"); !ok || rec.Owner != "gpu-1" {
		t.Fatalf("vm-kept: %+v, %v; want held on gpu-1", rec, ok)
	}

	// No early hold without room, or with the ID already here.
	if h := o.holdEarly(ctx, "vm-kept", rr, req); h != nil {
		t.Fatal("early hold of an ID this server already has")
	}
	// A lapsed reservation is no claim: the reservation replacing it
	// holds early, under the commit lock, so a commit of the lapsed one
	// waits until the new one is made and committed.
	if _, err := o.ledger.Reserve("vm-lapsed", req, "b", o.clk.Now(), time.Second); err != nil {
		t.Fatal(err)
	}
	o.h.Clock.Advance(2 * time.Second)
	h := o.holdEarly(ctx, "vm-lapsed", rr, req)
	if h == nil {
		t.Fatal("no early hold of an ID whose reservation lapsed")
	}
	if o.commitLocks.Users("vm-lapsed") != 1 {
		t.Fatal("the early hold of vm-lapsed does not hold its commit lock")
	}
	o.settleEarly(ctx, h)
	big := rr
	big.Items = []api.Item{{Model: l40s, Count: 5}}
	if h := o.holdEarly(ctx, "vm-big", big, ledger.Request{Items: []ledger.Item{{Model: l40s, Count: 5}}}); h != nil {
		t.Fatal("early hold on a server without room")
	}

	// The pass waits for the commit lock before it frees a name held
	// here with no claim, and reads the ledger again.
	early = o.holdEarly(ctx, "vm-racing", rr, req)
	rec, err := early.wait()
	if err != nil {
		t.Fatal(err)
	}
	freed := make(chan bool)
	go func() { freed <- o.freeName(ctx, rec) }()
	select {
	case <-freed:
		t.Fatal("the pass freed an early hold while its commit lock was held")
	case <-time.After(50 * time.Millisecond):
	}
	if _, err := o.ledger.Reserve("vm-racing", req, "a", o.clk.Now(), time.Minute); err != nil {
		t.Fatal(err)
	}
	o.settleEarly(ctx, early)
	if <-freed {
		t.Fatal("the pass freed the name of a reservation made under its lock")
	}
	if _, ok := held("vm-racing"); !ok {
		t.Fatal("vm-racing lost its name")
	}
}

// TestCommittedCopyIsTheClaimOnlyWhileNamedHere: a reserve-and-commit (or
// a retried commit) of a claim already committed here is answered with it
// only while the registry holds its ID here under its token; a copy a move
// left behind is a conflict naming where the ID is held, and stays for the
// anti-entropy pass.
func TestCommittedCopyIsTheClaimOnlyWhileNamedHere(t *testing.T) {
	o := newTestOwner(t, "l40s-4", nil)
	reg := names.NewLocal(o.clk.Now, 30*time.Second)
	o.namesNow = func() Names { return reg }
	ctx := context.Background()
	rr := api.ReserveRequest{Items: []api.Item{{Model: l40s, Count: 1}}, Coordinator: "a", Commit: true}
	c, err := o.Reserve(ctx, "vm-1", rr)
	if err != nil || c.State != api.StateClaimed {
		t.Fatalf("first claim: %+v, %v", c, err)
	}
	again, err := o.Reserve(ctx, "vm-1", rr)
	if err != nil || again.State != api.StateClaimed || again.GPUs[0].PCIAddress != c.GPUs[0].PCIAddress {
		t.Fatalf("the same claim again, held here: %+v, %v; want the claim", again, err)
	}

	// A move took the name to gpu-2, which confirmed it: this copy is a
	// leftover.
	rec, err := reg.Lookup(ctx, names.Claim("vm-1"), names.Linearizable)
	if err != nil {
		t.Fatal(err)
	}
	mv, err := reg.Move(ctx, names.Claim("vm-1"), rec.Token, "gpu-1", "gpu-2", "a")
	if err != nil {
		t.Fatal(err)
	}
	if mv.Move == nil {
		t.Fatalf("move: %+v", mv)
	}
	if _, err := reg.Confirm(ctx, names.Claim("vm-1"), mv.Move.Token, "gpu-2", nil); err != nil {
		t.Fatal(err)
	}
	for _, call := range []func() (api.Claim, error){
		func() (api.Claim, error) { return o.Reserve(ctx, "vm-1", rr) },
		func() (api.Claim, error) { return o.Commit(ctx, "vm-1") },
	} {
		got, err := call()
		if !api.IsCode(err, api.CodeConflict) || !strings.Contains(err.Error(), "on gpu-2") {
			t.Fatalf("a leftover copy answered %+v, %v; want a conflict naming gpu-2", got, err)
		}
	}
	if l, err := o.ledger.Get("vm-1"); err != nil || l.State != ledger.StateCommitted {
		t.Fatalf("the leftover copy: %+v, %v; want it kept for the pass", l, err)
	}
}

// originPeer is the server a moved name came from, as the pass asks it:
// whether it holds a copy, and to take the name (which it does not here).
type originPeer struct {
	api.Owner // the other calls are not made
	lookup    error
	nudged    int
}

func (p *originPeer) Lookup(_ context.Context, id string) (api.Claim, error) {
	if p.lookup != nil {
		return api.Claim{}, p.lookup
	}
	return api.Claim{ID: id, State: api.StateClaimed}, nil
}

func (p *originPeer) Commit(context.Context, string) (api.Claim, error) {
	p.nudged++
	return api.Claim{}, &api.Error{Code: api.CodeUnavailable, Message: "busy"}
}

// TestHandBackUntilTheOriginTakesIt: a name moved here with no claim here
// is handed back to the server it came from, which is asked to take it at
// once; while that server holds a copy and did not take it (cut off, busy),
// the name is handed back again at each pass, never released: that copy
// may be the claim's only one. It is released once that server answers
// that it holds no copy, and kept while it does not answer.
func TestHandBackUntilTheOriginTakesIt(t *testing.T) {
	o := newTestOwner(t, "l40s-4", nil)
	reg := names.NewLocal(o.clk.Now, 5*time.Second)
	o.namesNow = func() Names { return reg }
	origin := &originPeer{}
	o.peers = func() []Peer { return []Peer{{Name: "gpu-0", Owner: origin}} }
	ctx := context.Background()
	key := names.Claim("vm-m")
	r, err := reg.Hold(ctx, key, "coord", "gpu-0", "req", false)
	if err != nil {
		t.Fatal(err)
	}
	mv, err := reg.Move(ctx, key, r.Token, "gpu-0", "gpu-1", "coord")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Confirm(ctx, key, mv.Move.Token, "gpu-1", nil); err != nil {
		t.Fatal(err)
	}
	current := func() names.Record {
		t.Helper()
		rec, err := reg.Lookup(ctx, key, names.Linearizable)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	lapse := func() {
		t.Helper()
		o.h.Clock.Advance(6 * time.Second)
		if _, err := reg.ExpirePending(ctx); err != nil { // the registry's time moves with its writes
			t.Fatal(err)
		}
		if rec := current(); rec.Move != nil || rec.Owner != "gpu-1" {
			t.Fatalf("after the hand-back lapsed: %+v, want held here, no move", rec)
		}
	}

	if got := o.nameWithoutClaim(ctx, current()); got != nameHandedBack || origin.nudged != 1 {
		t.Fatalf("first pass: %v, origin asked %d times; want handed back and asked once", got, origin.nudged)
	}
	lapse()
	if got := o.nameWithoutClaim(ctx, current()); got != nameHandedBack || origin.nudged != 2 {
		t.Fatalf("the origin holds a copy and did not take it: %v (asked %d times); want handed back again", got, origin.nudged)
	}
	lapse()
	origin.lookup = errors.New("no answer")
	if got := o.nameWithoutClaim(ctx, current()); got != nameKept {
		t.Fatalf("the origin does not answer: %v, want the name kept", got)
	}
	origin.lookup = &api.Error{Code: api.CodeNotFound, Message: "no such claim"}
	if got := o.nameWithoutClaim(ctx, current()); got != nameFreed {
		t.Fatalf("the origin holds no copy: %v, want the name freed", got)
	}
	if _, err := reg.Lookup(ctx, key, names.Linearizable); !errors.Is(err, names.ErrNotFound) {
		t.Fatalf("vm-m after it was freed: %v", err)
	}
}

// TestCommitOfALapsedReservationCommitsNoOther: a commit that read a
// reservation which had lapsed must not commit the one another call's
// reserve made under the same ID meanwhile (that reserve, finding the
// lapsed one there, takes no lock of the ID before its ledger write). The
// new reservation has no name yet: committed by the old commit, it was a
// claim the registry did not hold (DST_SEED=6 with the nearest-servers
// probe, replayed under -race: committed under token 0 and answered as
// claimed to both coordinators).
func TestCommitOfALapsedReservationCommitsNoOther(t *testing.T) {
	o := newTestOwner(t, "l40s-4", nil)
	reg := names.NewLocal(o.clk.Now, 30*time.Second)
	ctx := context.Background()
	req := ledger.Request{Items: []ledger.Item{{Model: l40s, Count: 1}}}
	if _, err := o.ledger.Reserve("vm-1", req, "a", o.clk.Now(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	o.h.Clock.Advance(6 * time.Second) // lapsed
	var again ledger.Claim
	o.namesNow = func() Names {
		// The other call's reserve, run between the commit's reads of the
		// ledger and its write.
		if again.ID == "" {
			c, err := o.ledger.Reserve("vm-1", req, "b", o.clk.Now(), 30*time.Second)
			if err != nil {
				t.Error(err)
			}
			again = c
		}
		return reg
	}
	c, err := o.Commit(ctx, "vm-1")
	if err == nil {
		t.Fatalf("commit of a lapsed reservation answered %+v", c)
	}
	if again.ID == "" {
		t.Fatal("the commit never asked for the registry: the test no longer runs the reserve in its window")
	}
	got, gerr := o.ledger.Get("vm-1")
	if gerr != nil || got.State != ledger.StateReserved || !got.CreatedAt.Equal(again.CreatedAt) {
		t.Fatalf("after the commit of the lapsed reservation: %+v, %v; want the new reservation, still reserved", got, gerr)
	}
}
