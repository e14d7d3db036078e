package agent

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
)

// logBook keeps every agent's log lines of a test, by agent.
type logBook struct {
	mu    sync.Mutex
	lines map[string]*strings.Builder
}

func (b *logBook) logger(name string) *slog.Logger {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lines == nil {
		b.lines = map[string]*strings.Builder{}
	}
	sb := &strings.Builder{}
	b.lines[name] = sb
	return slog.New(slog.NewTextHandler(lockedWriter{mu: &b.mu, w: sb}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// count is how many of name's log lines contain every one of parts.
func (b *logBook) count(name string, parts ...string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, line := range strings.Split(b.lines[name].String(), "\n") {
		ok := line != ""
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			n++
		}
	}
	return n
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// namedCluster is an in-memory cluster whose agents share one name
// registry, with their logs kept.
func namedCluster(t *testing.T) (*testCluster, *testNames, *logBook) {
	t.Helper()
	tc := newTestCluster(t)
	logs := &logBook{}
	tc.logFor = logs.logger
	return tc, tc.names, logs
}

// settled waits for a's first anti-entropy pass, which runs when it
// starts; the next one is more than 20 s away, after the test.
func settled(t *testing.T, a *Agent) *Agent {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for a.AntiEntropyPasses() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s ran no anti-entropy pass at start", a.cfg.NodeName)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return a
}

// olderClaim commits claim id for one L40S straight through a's ledger,
// as a version without the name registry did: no name, no token.
func olderClaim(t *testing.T, a *Agent, id string) ledger.Claim {
	t.Helper()
	now := a.clk.Now()
	if _, err := a.ledger.Reserve(id, ledger.Request{Items: []ledger.Item{{Model: l40s, Count: 1}}}, "", now, time.Minute); err != nil {
		t.Fatalf("reserving %s on %s: %v", id, a.cfg.NodeName, err)
	}
	c, err := a.ledger.Commit(id, now)
	if err != nil {
		t.Fatalf("committing %s on %s: %v", id, a.cfg.NodeName, err)
	}
	return c
}

// holdName acquires id and confirms it on owner, as the claim path does.
func holdName(t *testing.T, n NameAuthority, id, owner string) names.Record {
	t.Helper()
	ctx := context.Background()
	g, err := n.Acquire(ctx, names.Claim(id), owner, owner, "req-"+id, nil)
	if err != nil {
		t.Fatalf("acquiring %s: %v", id, err)
	}
	r, err := n.Confirm(ctx, names.Claim(id), g.Record.Token, owner, nil)
	if err != nil {
		t.Fatalf("confirming %s on %s: %v", id, owner, err)
	}
	return r
}

func nameOf(t *testing.T, n NameAuthority, id string) (names.Record, bool) {
	t.Helper()
	r, err := n.Lookup(context.Background(), names.Claim(id), names.Linearizable)
	if errors.Is(err, names.ErrNotFound) {
		return names.Record{}, false
	}
	if err != nil {
		t.Fatalf("looking %s up: %v", id, err)
	}
	return r, true
}

// A name the registry holds on a server whose ledger has no claim (the
// release reached the ledger, not the registry) is released by that
// server's pass; a name whose claim is still only reserved (a commit in
// progress) is left alone.
func TestAntiEntropyReleasesNamesWithoutClaim(t *testing.T) {
	tc, n, logs := namedCluster(t)
	a := settled(t, tc.start("a", "l40s-4"))
	holdName(t, n, "vm-gone", "a")
	if _, err := a.ledger.Reserve("vm-committing", ledger.Request{Items: []ledger.Item{{Model: l40s, Count: 1}}}, "b", a.clk.Now(), time.Minute); err != nil {
		t.Fatal(err)
	}
	holdName(t, n, "vm-committing", "a")

	rep := a.AntiEntropyPass(context.Background())
	if rep.Skipped || len(rep.Freed) != 1 || rep.Freed[0] != "vm-gone" {
		t.Fatalf("pass: %+v, want vm-gone freed", rep)
	}
	if _, held := nameOf(t, n, "vm-gone"); held {
		t.Error("vm-gone is still held in the registry")
	}
	if r, held := nameOf(t, n, "vm-committing"); !held || r.Owner != "a" {
		t.Errorf("the name of a reservation being committed was released: %+v", r)
	}
	if got := counter(t, a, "gpuherd_claim_names_freed_total"); got != 1 {
		t.Errorf("gpuherd_claim_names_freed_total = %v, want 1", got)
	}
	if logs.count("a", "level=WARN", "no claim in its ledger released", "claim=vm-gone") != 1 {
		t.Error("the freed name was not logged")
	}
	if rep := a.AntiEntropyPass(context.Background()); len(rep.Freed) != 0 {
		t.Errorf("second pass freed %v", rep.Freed)
	}
}

// A committed claim from a ledger written before the registry has no
// name: its owner's pass acquires and confirms it for itself and records
// the token in the ledger, so a claim of the same ID elsewhere is refused.
func TestAntiEntropyAdoptsClaimsOfAnOlderLedger(t *testing.T) {
	tc, n, _ := namedCluster(t)
	a := settled(t, tc.start("a", "l40s-4"))
	olderClaim(t, a, "vm-old")

	rep := a.AntiEntropyPass(context.Background())
	if len(rep.Adopted) != 1 || rep.Adopted[0] != "vm-old" {
		t.Fatalf("pass: %+v, want vm-old adopted", rep)
	}
	r, held := nameOf(t, n, "vm-old")
	if !held || r.State != names.StateHeld || r.Owner != "a" {
		t.Fatalf("vm-old's name: %+v, held %v; want held on a", r, held)
	}
	c, err := a.ledger.Get("vm-old")
	if err != nil || c.NameToken != r.Token {
		t.Fatalf("ledger token %d (%v), want the name's %d", c.NameToken, err, r.Token)
	}
	if _, err := n.Acquire(context.Background(), names.Claim("vm-old"), "b", "", "another request", nil); !errors.Is(err, names.ErrConflict) {
		t.Errorf("acquiring the adopted name for another request: %v, want conflict", err)
	}
	if got := counter(t, a, "gpuherd_claim_names_adopted_total"); got != 1 {
		t.Errorf("gpuherd_claim_names_adopted_total = %v, want 1", got)
	}
	if rep := a.AntiEntropyPass(context.Background()); len(rep.Adopted)+len(rep.Freed)+len(rep.Released) != 0 {
		t.Errorf("second pass changed something: %+v", rep)
	}
}

// Two ledgers hold the same committed ID (one written straight through
// the ledger package, as an older version would have, while the registry
// names the other). The pass of the server whose copy the registry does
// not name logs both servers and marks its copy; the next pass releases it
// and counts it; the other copy is untouched.
func TestAntiEntropyReleasesUnusedDuplicate(t *testing.T) {
	tc, n, logs := namedCluster(t)
	a := settled(t, tc.start("a", "l40s-4"))
	b := settled(t, tc.start("b", "l40s-4"))
	kept := olderClaim(t, a, "vm-d")
	if rep := a.AntiEntropyPass(context.Background()); len(rep.Adopted) != 1 {
		t.Fatalf("a's pass: %+v, want vm-d adopted", rep)
	}
	olderClaim(t, b, "vm-d")

	// The first pass that sees it marks it; the next one, seeing the same
	// record, releases it.
	rep := b.AntiEntropyPass(context.Background())
	if len(rep.Released) != 0 || len(rep.Kept) != 1 || rep.Kept[0] != "vm-d" {
		t.Fatalf("b's first pass: %+v, want its copy of vm-d marked", rep)
	}
	if got := gauge(t, b, "gpuherd_claim_duplicates", "", ""); got != 1 {
		t.Errorf("gpuherd_claim_duplicates = %v after the first pass, want 1", got)
	}
	if c, err := b.Lookup(context.Background(), "vm-d"); err != nil || !c.Duplicate || c.KeptOn != "a" {
		t.Errorf("b's copy after the first pass: %+v, %v; want marked duplicate, kept on a", c, err)
	}
	tc.converge("membership", func(x *Agent) bool { return len(x.targets()) == 2 })
	rep = b.AntiEntropyPass(context.Background())
	if len(rep.Released) != 1 || rep.Released[0] != "vm-d" || len(rep.Kept) != 0 {
		t.Fatalf("b's second pass: %+v, want its copy of vm-d released", rep)
	}
	if _, err := b.ledger.Get("vm-d"); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("b still holds vm-d: %v", err)
	}
	if free := b.ledger.Totals(b.clk.Now())[l40s].Free; free != 4 {
		t.Errorf("b has %d L40S free after the release, want 4", free)
	}
	if c, err := a.ledger.Get("vm-d"); err != nil || !c.CommittedAt.Equal(kept.CommittedAt) {
		t.Errorf("a's copy, the one the registry names: %+v, %v", c, err)
	}
	if r, _ := nameOf(t, n, "vm-d"); r.Owner != "a" || r.State != names.StateHeld {
		t.Errorf("vm-d's name after the release: %+v, want held on a", r)
	}
	if logs.count("b", "level=WARN", `msg="claim held on several servers"`, "claim=vm-d", "kept_on=a", "copy_on=b") != 1 {
		t.Error(`b did not log "claim held on several servers" naming a and b`)
	}
	if got := counter(t, b, "gpuherd_claim_duplicates_released_total"); got != 1 {
		t.Errorf("gpuherd_claim_duplicates_released_total = %v, want 1", got)
	}
	if got := gauge(t, b, "gpuherd_claim_duplicates", "", ""); got != 0 {
		t.Errorf("gpuherd_claim_duplicates = %v after the release, want 0", got)
	}
	if rep := a.AntiEntropyPass(context.Background()); len(rep.Released)+len(rep.Kept)+len(rep.Freed) != 0 {
		t.Errorf("a's pass touched the kept copy: %+v", rep)
	}
}

// A duplicate a VM uses is never taken from it: it stays, marked in the
// claim list with the server of the kept copy and counted, until the VM
// stops; the next pass then releases it.
func TestAntiEntropyKeepsDuplicateInUseUntilItsVMStops(t *testing.T) {
	tc, _, logs := namedCluster(t)
	a := settled(t, tc.start("a", "l40s-4"))
	b := settled(t, tc.start("b", "l40s-4"))
	olderClaim(t, a, "vm-d")
	if rep := a.AntiEntropyPass(context.Background()); len(rep.Adopted) != 1 {
		t.Fatalf("a's pass: %+v, want vm-d adopted", rep)
	}
	dup := olderClaim(t, b, "vm-d")
	use := ledger.Use{Domain: "0d6a1f5e-2b7c-4c1e-9a3e-5f1d2c3b4a59", Name: "vm-d", Started: true}
	if _, err := b.ledger.MarkUse("vm-d", dup.GPUs, use, b.clk.Now()); err != nil {
		t.Fatal(err)
	}

	rep := b.AntiEntropyPass(context.Background())
	if len(rep.Kept) != 1 || rep.Kept[0] != "vm-d" || len(rep.Released) != 0 {
		t.Fatalf("b's pass: %+v, want its copy kept", rep)
	}
	if _, err := b.ledger.Get("vm-d"); err != nil {
		t.Fatalf("b's copy in use was released: %v", err)
	}
	if got := gauge(t, b, "gpuherd_claim_duplicates", "", ""); got != 1 {
		t.Errorf("gpuherd_claim_duplicates = %v, want 1", got)
	}
	if logs.count("b", "level=WARN", "duplicate kept while a VM uses it", "claim=vm-d", "kept_on=a") != 1 {
		t.Error("b did not log why it kept its copy")
	}
	tc.converge("membership", func(x *Agent) bool { return len(x.targets()) == 2 })
	list, err := a.ListClaims(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var marks []string
	for _, c := range list.Claims {
		if c.ID == "vm-d" {
			marks = append(marks, c.Node+":"+map[bool]string{true: "duplicate kept on " + c.KeptOn, false: "plain"}[c.Duplicate])
		}
	}
	if strings.Join(marks, ",") != "a:plain,b:duplicate kept on a" {
		t.Errorf("claims of vm-d through a: %v, want a's plain and b's marked", marks)
	}

	if rep := b.AntiEntropyPass(context.Background()); len(rep.Kept) != 1 || len(rep.Released) != 0 {
		t.Fatalf("b's second pass with the VM running: %+v, want its copy still kept", rep)
	}
	if logs.count("b", "held on several servers") != 1 {
		t.Error(`"held on several servers" logged again for the same duplicate`)
	}
	// The VM stops; its claim would normally be released with it, but
	// this copy stayed: the next pass releases it.
	if _, _, err := b.ledger.EndUse("vm-d", use.Domain, false, b.clk.Now()); err != nil {
		t.Fatal(err)
	}
	rep = b.AntiEntropyPass(context.Background())
	if len(rep.Released) != 1 {
		t.Fatalf("b's pass after the VM stopped: %+v, want its copy released", rep)
	}
	if got := gauge(t, b, "gpuherd_claim_duplicates", "", ""); got != 0 {
		t.Errorf("gpuherd_claim_duplicates = %v after the release, want 0", got)
	}
	if c, err := b.Lookup(context.Background(), "vm-d"); err == nil {
		t.Errorf("b still answers vm-d: %+v", c)
	}
}

// A registry that does not answer skips the pass — changing nothing,
// logged once however many passes it lasts — and the pass after it comes
// back does the work.
func TestAntiEntropySkipsWhileRegistryIsDown(t *testing.T) {
	tc, n, logs := namedCluster(t)
	a := settled(t, tc.start("a", "l40s-4"))
	holdName(t, n, "vm-gone", "a")
	before := counter(t, a, "gpuherd_anti_entropy_skipped_total")
	n.SetDown(true)
	for range 3 {
		if rep := a.AntiEntropyPass(context.Background()); !rep.Skipped {
			t.Fatalf("pass with the registry down: %+v, want skipped", rep)
		}
	}
	if got := logs.count("a", "level=WARN", "name registry does not answer"); got != 1 {
		t.Errorf("the registry being down was logged %d times in 3 passes, want once", got)
	}
	if got := counter(t, a, "gpuherd_anti_entropy_skipped_total") - before; got != 3 {
		t.Errorf("skipped passes counted: %v, want 3", got)
	}
	n.SetDown(false)
	if _, held := nameOf(t, n, "vm-gone"); !held {
		t.Fatal("a skipped pass released a name")
	}
	if rep := a.AntiEntropyPass(context.Background()); len(rep.Freed) != 1 {
		t.Fatalf("pass after the registry came back: %+v, want vm-gone freed", rep)
	}
	if logs.count("a", "answers again") != 1 {
		t.Error("the registry answering again was not logged")
	}
}

// claimViewOf finds claim id on node in a claim list.
func claimViewOf(l api.ClaimList, id, node string) (api.Claim, bool) {
	for _, c := range l.Claims {
		if c.ID == id && c.Node == node {
			return c, true
		}
	}
	return api.Claim{}, false
}
