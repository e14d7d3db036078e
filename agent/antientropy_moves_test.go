package agent

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
)

// namedClaim commits claim id for one L40S straight through a's ledger
// under name token token, as the claim path records it.
func namedClaim(t *testing.T, a *Agent, id string, token uint64) ledger.Claim {
	t.Helper()
	now := a.clk.Now()
	if _, err := a.ledger.Reserve(id, ledger.Request{Items: []ledger.Item{{Model: l40s, Count: 1}}, NameToken: token}, "", now, time.Minute); err != nil {
		t.Fatalf("reserving %s on %s: %v", id, a.cfg.NodeName, err)
	}
	c, err := a.ledger.Commit(id, now)
	if err != nil {
		t.Fatalf("committing %s on %s: %v", id, a.cfg.NodeName, err)
	}
	return c
}

// moveName moves id's name, held on from under token, to to, as a
// coordinator on from does; it returns the move's token.
func moveName(t *testing.T, n *testNames, id string, token uint64, from, to string) uint64 {
	t.Helper()
	m, err := n.Move(context.Background(), names.Claim(id), token, from, to, from)
	if err != nil || m.Move == nil {
		t.Fatalf("moving %s from %s to %s: %+v, %v", id, from, to, m, err)
	}
	return m.Move.Token
}

// A committed copy whose ledger records a name token, while the registry
// has no name for its ID, is what a released claim left behind (a move's
// old copy that could not be released). It is never adopted: the first
// pass marks it, the second releases it and counts it as a duplicate.
func TestAntiEntropyReleasesLeftoverOfReleasedName(t *testing.T) {
	tc, n, logs := namedCluster(t)
	a := settled(t, tc.start("a", "l40s-4"))
	namedClaim(t, a, "vm-left", 41)

	rep := a.AntiEntropyPass(context.Background())
	if len(rep.Adopted) != 0 || len(rep.Released) != 0 || len(rep.Kept) != 1 || rep.Kept[0] != "vm-left" {
		t.Fatalf("first pass: %+v, want vm-left kept (marked), not adopted", rep)
	}
	if _, held := nameOf(t, n, "vm-left"); held {
		t.Fatal("the leftover's released name was taken again")
	}
	if c, err := a.Lookup(context.Background(), "vm-left"); err != nil || !c.Duplicate {
		t.Errorf("leftover after the first pass: %+v, %v; want marked", c, err)
	}
	rep = a.AntiEntropyPass(context.Background())
	if len(rep.Released) != 1 || rep.Released[0] != "vm-left" {
		t.Fatalf("second pass: %+v, want vm-left released", rep)
	}
	if _, err := a.ledger.Get("vm-left"); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("a still holds vm-left: %v", err)
	}
	if free := a.ledger.Totals(a.clk.Now())[l40s].Free; free != 4 {
		t.Errorf("a has %d L40S free, want 4", free)
	}
	if got := counter(t, a, "gpuherd_claim_duplicates_released_total"); got != 1 {
		t.Errorf("gpuherd_claim_duplicates_released_total = %v, want 1", got)
	}
	if logs.count("a", "level=WARN", "leftover claim released", "claim=vm-left") != 1 {
		t.Error("the released leftover was not logged")
	}
}

// A leftover a VM uses stays, marked and counted, however many passes see
// it.
func TestAntiEntropyKeepsLeftoverInUse(t *testing.T) {
	tc, _, logs := namedCluster(t)
	a := settled(t, tc.start("a", "l40s-4"))
	c := namedClaim(t, a, "vm-left", 41)
	use := ledger.Use{Domain: "5b0c2c7e-8f0a-4b7e-9d55-0f0d1e2a3b4c", Name: "vm-left", Started: true}
	if _, err := a.ledger.MarkUse("vm-left", c.GPUs, use, a.clk.Now()); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if rep := a.AntiEntropyPass(context.Background()); len(rep.Kept) != 1 || len(rep.Released)+len(rep.Adopted) != 0 {
			t.Fatalf("pass %d: %+v, want the leftover in use kept", i+1, rep)
		}
	}
	if got := gauge(t, a, "gpuherd_claim_duplicates", "", ""); got != 1 {
		t.Errorf("gpuherd_claim_duplicates = %v, want 1", got)
	}
	if logs.count("a", "level=WARN", "leftover kept while a VM uses it", "claim=vm-left") != 1 {
		t.Error("a did not log once why it kept the leftover")
	}
}

// A name moved to b whose copy there is gone (b confirmed the move, then
// crashed before its commit) while a still holds the old copy: b's pass
// hands the name back to a instead of releasing it and asks a to take it,
// and a confirms the move onto its copy at once, which keeps its name and
// GPUs.
func TestAntiEntropyHandsMovedNameBack(t *testing.T) {
	tc, n, _ := namedCluster(t)
	a := settled(t, tc.start("a", "l40s-4"))
	b := settled(t, tc.start("b", "l40s-4"))
	r := holdName(t, n, "vm-m", "a")
	kept := namedClaim(t, a, "vm-m", r.Token)
	mv := moveName(t, n, "vm-m", r.Token, "a", "b")
	if _, err := n.ConfirmMove(context.Background(), names.Claim("vm-m"), mv, "b", "b"); err != nil {
		t.Fatal(err)
	}

	rep := b.AntiEntropyPass(context.Background())
	if len(rep.HandedBack) != 1 || rep.HandedBack[0] != "vm-m" || len(rep.Freed) != 0 {
		t.Fatalf("b's pass: %+v, want vm-m handed back", rep)
	}
	got, held := nameOf(t, n, "vm-m")
	if !held || got.Owner != "a" || got.State != names.StateHeld || got.Move != nil {
		t.Fatalf("vm-m's name after b's pass: %+v, want held on a, which took it when asked", got)
	}
	c, err := a.ledger.Get("vm-m")
	if err != nil || c.NameToken != got.Token || !c.CommittedAt.Equal(kept.CommittedAt) {
		t.Fatalf("a's copy: %+v, %v; want the same copy under token %d", c, err, got.Token)
	}
	for _, x := range []*Agent{a, b} {
		if rep := x.AntiEntropyPass(context.Background()); len(rep.Freed)+len(rep.HandedBack)+len(rep.Confirmed)+len(rep.Released)+len(rep.Kept) != 0 {
			t.Errorf("%s's pass after it settled: %+v", x.cfg.NodeName, rep)
		}
	}
}

// A name moved to b whose claim b committed and released (the release of
// the name did not reach the registry) is released, not handed back: the
// claim was released, and a's old copy is a leftover of that release.
func TestAntiEntropyFreesMovedNameOfAReleasedClaim(t *testing.T) {
	tc, n, _ := namedCluster(t)
	settled(t, tc.start("a", "l40s-4"))
	b := settled(t, tc.start("b", "l40s-4"))
	r := holdName(t, n, "vm-m", "a")
	mv := moveName(t, n, "vm-m", r.Token, "a", "b")
	if _, err := n.ConfirmMove(context.Background(), names.Claim("vm-m"), mv, "b", "b"); err != nil {
		t.Fatal(err)
	}
	namedClaim(t, b, "vm-m", mv)
	c, err := b.ledger.Release("vm-m", b.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ledger.Remember(c, b.clk.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	rep := b.AntiEntropyPass(context.Background())
	if len(rep.Freed) != 1 || len(rep.HandedBack) != 0 {
		t.Fatalf("b's pass: %+v, want vm-m freed, not handed back", rep)
	}
	if _, held := nameOf(t, n, "vm-m"); held {
		t.Error("vm-m is still held")
	}
}

// A name handed back that its old server does not take (it holds no
// copy) comes back when the move lapses, and is released then: once per
// token.
func TestAntiEntropyReleasesNameHandedBackInVain(t *testing.T) {
	tc := newTestCluster(t)
	tc.names = newTestNames(t, func(c *names.Config) { c.Lease = 200 * time.Millisecond })
	n := tc.names
	settled(t, tc.start("a", "l40s-4"))
	b := settled(t, tc.start("b", "l40s-4"))
	r := holdName(t, n, "vm-m", "a")
	mv := moveName(t, n, "vm-m", r.Token, "a", "b")
	if _, err := n.ConfirmMove(context.Background(), names.Claim("vm-m"), mv, "b", "b"); err != nil {
		t.Fatal(err)
	}
	if rep := b.AntiEntropyPass(context.Background()); len(rep.HandedBack) != 1 {
		t.Fatalf("b's pass: %+v, want vm-m handed back", rep)
	}
	got, _ := nameOf(t, n, "vm-m")
	if got.Move == nil {
		t.Fatalf("vm-m after b's pass: %+v, want moving to a", got)
	}
	// The registry's time moves with its writes: wait out the move's
	// lease, then write something.
	time.Sleep(time.Until(got.Move.Deadline) + 10*time.Millisecond)
	holdName(t, n, "vm-tick", "a")
	if got, _ := nameOf(t, n, "vm-m"); got.Move != nil || got.Owner != "b" {
		t.Fatalf("vm-m after its move back lapsed: %+v, want on b, no move", got)
	}
	rep := b.AntiEntropyPass(context.Background())
	if len(rep.Freed) != 1 || len(rep.HandedBack) != 0 {
		t.Fatalf("b's pass after the move back lapsed: %+v, want vm-m freed", rep)
	}
	if _, held := nameOf(t, n, "vm-m"); held {
		t.Error("vm-m is still held")
	}
}

// A committed copy here whose name is moving here (the move's coordinator
// stopped before it confirmed) takes the name: the pass confirms the move
// as this server instead of treating the copy as a duplicate.
func TestAntiEntropyConfirmsMoveToItsCopy(t *testing.T) {
	tc, n, _ := namedCluster(t)
	a := settled(t, tc.start("a", "l40s-4"))
	settled(t, tc.start("b", "l40s-4"))
	r := holdName(t, n, "vm-m", "b")
	namedClaim(t, a, "vm-m", r.Token)
	mv := moveName(t, n, "vm-m", r.Token, "b", "a")

	rep := a.AntiEntropyPass(context.Background())
	if len(rep.Confirmed) != 1 || rep.Confirmed[0] != "vm-m" || len(rep.Kept)+len(rep.Released) != 0 {
		t.Fatalf("a's pass: %+v, want vm-m's move confirmed", rep)
	}
	got, _ := nameOf(t, n, "vm-m")
	if got.Owner != "a" || got.Token != mv {
		t.Fatalf("vm-m's name: %+v, want held on a under the move's token %d", got, mv)
	}
	if c, err := a.ledger.Get("vm-m"); err != nil || c.NameToken != mv {
		t.Fatalf("a's copy: %+v, %v; want token %d recorded", c, err, mv)
	}
}

// A duplicate is released only once the server the registry names says
// it holds the claim committed: while it answers that it does not (its
// copy is gone, and the name with it soon), or is not seen, this copy,
// maybe the only one, stays.
func TestAntiEntropyKeepsDuplicateTheHolderDoesNotHold(t *testing.T) {
	tc, n, logs := namedCluster(t)
	a := settled(t, tc.start("a", "l40s-4"))
	b := settled(t, tc.start("b", "l40s-4"))
	tc.converge("membership", func(x *Agent) bool { return len(x.targets()) == 2 })
	r := holdName(t, n, "vm-d", "a")
	namedClaim(t, b, "vm-d", r.Token)

	for i := range 3 {
		if rep := b.AntiEntropyPass(context.Background()); len(rep.Kept) != 1 || len(rep.Released) != 0 {
			t.Fatalf("b's pass %d while a holds no copy: %+v, want b's copy kept", i+1, rep)
		}
	}
	if _, err := b.ledger.Get("vm-d"); err != nil {
		t.Fatalf("b's copy was released though a holds none: %v", err)
	}
	if logs.count("b", "level=WARN", "does not confirm it holds the claim", "claim=vm-d", "kept_on=a", "a does not hold it") == 0 {
		t.Error("b did not log why it kept its copy")
	}
	namedClaim(t, a, "vm-d", r.Token)
	if rep := b.AntiEntropyPass(context.Background()); len(rep.Released) != 1 {
		t.Fatalf("b's pass once a holds its copy: %+v, want b's copy released", rep)
	}
	if _, err := a.ledger.Get("vm-d"); err != nil {
		t.Errorf("a's copy: %v", err)
	}
}

// A holder that does not answer (stopped) keeps the duplicate too.
func TestAntiEntropyKeepsDuplicateWhenTheHolderIsGone(t *testing.T) {
	tc, n, _ := namedCluster(t)
	a := settled(t, tc.start("a", "l40s-4"))
	b := settled(t, tc.start("b", "l40s-4"))
	r := holdName(t, n, "vm-d", "a")
	namedClaim(t, a, "vm-d", r.Token)
	namedClaim(t, b, "vm-d", r.Token)
	tc.stop("a")
	for i := range 2 {
		if rep := b.AntiEntropyPass(context.Background()); len(rep.Kept) != 1 || len(rep.Released) != 0 {
			t.Fatalf("b's pass %d with a gone: %+v, want b's copy kept", i+1, rep)
		}
	}
}
