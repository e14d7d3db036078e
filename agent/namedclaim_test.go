package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/owner"
)

// The claim path through the name registry (namedclaim.go, ownernames.go):
// the scenarios of issue 11, points 1, 2 and 6, on the in-memory network
// with the shared test registry.

const l40s = "NVIDIA L40S"

// namedThree starts a coordinator without L40S (a, on A100s) and two
// servers of 4 L40S each (b, c), sharing the test registry, and waits
// until each sees all three.
func namedThree(t *testing.T) (tc *testCluster, a, b, c *Agent) {
	t.Helper()
	tc = newTestCluster(t)
	a, b, c = tc.start("a", "a100-pcie-4"), tc.start("b", "l40s-4"), tc.start("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, l40s) == 8 })
	return tc, a, b, c
}

// copiesOf lists the servers whose ledger holds claim id (reserved or
// committed).
func copiesOf(id string, agents ...*Agent) []string {
	var on []string
	for _, x := range agents {
		if _, err := x.ledger.Get(id); err == nil {
			on = append(on, x.cfg.NodeName)
		}
	}
	return on
}

func l40sReq(n int) api.ClaimRequest {
	return api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: n}}}
}

// Issue 11, point 1: vm-x is held on its owner; the owner is killed,
// frozen, cut off or stopped, and the client retries through another
// agent. The same request answers 503 naming the owner, another request a
// conflict naming it (or a 503, when it was asked of the owner itself);
// never a second copy, never "not available". Once the
// owner is back the retry answers the one claim.
func TestClusterNamedRetryWhileOwnerIsDown(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{"killed", "paused", "cut-off", "stopped"} {
		t.Run(fault, func(t *testing.T) {
			tc, a, b, c := namedThree(t)
			ctx := context.Background()
			first, err := a.Claim(ctx, "vm-x", l40sReq(2))
			if err != nil {
				t.Fatalf("claim vm-x: %v", err)
			}
			ownerName := first.Node
			other := c
			if ownerName == "c" {
				other = b
			}
			var heal func()
			switch fault {
			case "killed":
				tc.peers.Kill(ownerName)
				heal = func() { tc.stop(ownerName); tc.start(ownerName, "l40s-4") }
			case "paused":
				tc.peers.Pause(ownerName)
				heal = func() { tc.peers.Resume(ownerName) }
			case "cut-off":
				tc.peers.Partition([]string{ownerName}, []string{"a", other.cfg.NodeName})
				heal = tc.peers.Heal
			case "stopped":
				tc.stop(ownerName)
				waitFor(t, "the others to see "+ownerName+" gone", 10*time.Second, func() bool {
					_, ok := targetNamed(other.targets(), ownerName)
					return !ok
				})
				heal = func() { tc.start(ownerName, "l40s-4") }
			}

			_, err = other.Claim(ctx, "vm-x", l40sReq(2))
			if !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), ownerName) {
				t.Errorf("retry of vm-x through %s with its owner %s: %v; want a 503 naming %s", other.cfg.NodeName, fault, err, ownerName)
			}
			// A claim is placed at once, its ID checked by the hold of
			// the owner that takes it: asked of the owner itself, whose
			// answer never comes, it is a 503 naming it; asked of
			// another server, whose hold is refused, a conflict naming
			// it. Never "not available", never a copy.
			_, err = other.Claim(ctx, "vm-x", l40sReq(1))
			if !api.IsCode(err, api.CodeConflict) && !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), ownerName) {
				t.Errorf("claim of vm-x with another request while its owner is %s: %v; want a conflict or a 503 naming %s", fault, err, ownerName)
			}
			if on := copiesOf("vm-x", a, other); len(on) > 0 {
				t.Fatalf("a second copy of vm-x was placed on %v while its owner was %s", on, fault)
			}

			heal()
			tc.converge("the owner back", func(x *Agent) bool { return freeOf(x, l40s) == 6 })
			again, err := other.Claim(ctx, "vm-x", l40sReq(2))
			if err != nil || again.Node != ownerName || !slices.Equal(gpuAddrs(again), gpuAddrs(first)) {
				t.Fatalf("retry after the owner is back: %+v, %v; want the claim on %s with %v", again, err, ownerName, gpuAddrs(first))
			}
			if on := copiesOf("vm-x", tc.agents["a"], tc.agents["b"], tc.agents["c"]); len(on) != 1 {
				t.Fatalf("vm-x held on %v, want exactly one server", on)
			}
		})
	}
}

// Issue 11, point 2: a partition between the coordinator and the owner of
// a claim; the client retries through the same coordinator, which cannot
// reach the owner: 503 naming it, not a second copy on the other server.
// After the heal there is exactly one copy, and its release frees every
// GPU.
func TestClusterNamedPartitionThenHealKeepsOneCopy(t *testing.T) {
	tc, a, b, c := namedThree(t)
	ctx := context.Background()
	first, err := a.Claim(ctx, "vm-x", l40sReq(4))
	if err != nil {
		t.Fatal(err)
	}
	tc.peers.Partition([]string{"a"}, []string{first.Node})
	for range 2 {
		if _, err := a.Claim(ctx, "vm-x", l40sReq(4)); !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), first.Node) {
			t.Fatalf("retry across the partition: %v; want a 503 naming %s", err, first.Node)
		}
	}
	tc.peers.Heal()
	again, err := a.Claim(ctx, "vm-x", l40sReq(4))
	if err != nil || again.Node != first.Node {
		t.Fatalf("retry after the heal: %+v, %v; want the claim on %s", again, err, first.Node)
	}
	if on := copiesOf("vm-x", a, b, c); len(on) != 1 {
		t.Fatalf("vm-x held on %v after the heal, want exactly one server", on)
	}
	if _, err := c.Release(ctx, "vm-x"); err != nil {
		t.Fatal(err)
	}
	if on := copiesOf("vm-x", a, b, c); len(on) != 0 {
		t.Fatalf("vm-x still held on %v after its release", on)
	}
	if got := localFree(b, l40s) + localFree(c, l40s); got != 8 {
		t.Fatalf("%d L40S free after the release, want all 8", got)
	}
	if _, err := tc.names.Lookup(ctx, names.Claim("vm-x"), names.Linearizable); !isNamesNotFound(err) {
		t.Fatalf("the registry still holds vm-x after its release: %v", err)
	}
	checkInvariants(t, a, b, c)
}

func isNamesNotFound(err error) bool {
	r, ok := err.(*names.RefusedError)
	return ok && r.Code == names.CodeNotFound
}

// A registry that cannot answer stops new claims only: a claim answers a
// retryable 503 that names the registry's servers, never "not available"
// and never a placement; gets and releases of existing claims work from
// the owners' ledgers.
func TestClusterNamedRegistryDown(t *testing.T) {
	tc, a, b, c := namedThree(t)
	ctx := context.Background()
	held, err := a.Claim(ctx, "vm-1", l40sReq(1))
	if err != nil {
		t.Fatal(err)
	}
	tc.names.SetDown(true)
	_, err = a.Claim(ctx, "vm-2", l40sReq(1))
	if !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), "registry") {
		t.Fatalf("claim with the registry down: %v; want a 503 naming the registry", err)
	}
	if on := copiesOf("vm-2", a, b, c); len(on) > 0 {
		t.Fatalf("vm-2 placed on %v with the registry down", on)
	}
	other := b
	if held.Node == "b" {
		other = c
	}
	if got, err := other.Get(ctx, "vm-1"); err != nil || got.Node != held.Node {
		t.Fatalf("get with the registry down: %+v, %v; want the claim on %s", got, err, held.Node)
	}
	if _, err := other.Release(ctx, "vm-1"); err != nil {
		t.Fatalf("release with the registry down: %v", err)
	}
	if on := copiesOf("vm-1", a, b, c); len(on) > 0 {
		t.Fatalf("vm-1 still held on %v after its release", on)
	}
	if _, err := a.Get(ctx, "vm-1"); !api.IsCode(err, api.CodeNotFound) {
		t.Fatalf("get of the released claim, every server answering: %v; want not found", err)
	}
}

// A release while the registry does not answer cannot tell which copy of
// a claim the registry names: a move cut short leaves the old one behind
// (here, b's). It releases every copy and says so, never one copy while
// the other stays held; with a member silent, it is a 503 that releases
// nothing.
func TestClusterNamedReleaseWithRegistryDownFreesEveryCopy(t *testing.T) {
	tc, a, b, c := namedThree(t)
	ctx := context.Background()
	held, err := c.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}, PreferNode: "c", SameNode: true})
	if err != nil || held.Node != "c" {
		t.Fatalf("claim on c: %+v, %v", held, err)
	}
	namedClaim(t, b, "vm-1", 1) // the leftover of a move cut short
	tc.names.SetDown(true)

	tc.peers.Pause("b")
	if _, err := a.Release(ctx, "vm-1"); !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), "b") {
		t.Fatalf("release with the registry down and b silent: %v; want a 503 naming b", err)
	}
	if on := copiesOf("vm-1", a, b, c); !slices.Equal(on, []string{"b", "c"}) {
		t.Fatalf("copies after the refused release: %v, want both kept", on)
	}
	tc.peers.Resume("b")

	got, err := a.Release(ctx, "vm-1")
	if err != nil {
		t.Fatalf("release with the registry down: %v", err)
	}
	if on := copiesOf("vm-1", a, b, c); len(on) > 0 {
		t.Fatalf("vm-1 still held on %v after its release", on)
	}
	if len(got.Warnings) != 1 || !strings.Contains(got.Warnings[0], "another copy") {
		t.Errorf("the release's answer: %+v; want a warning about the other copy", got)
	}
}

// Issue 11, point 6: with a member that does not answer, a get or release
// of an ID that never existed is a definite 404 from the registry, not a
// 503 naming the dead member.
func TestClusterNamedUnknownIDWithDeadMemberIsNotFound(t *testing.T) {
	tc, a, _, _ := namedThree(t)
	tc.peers.Kill("c") // gossip still lists it; its peer API refuses
	ctx := context.Background()
	if _, err := a.Get(ctx, "vm-never"); !api.IsCode(err, api.CodeNotFound) {
		t.Errorf("get of an unknown ID with c dead: %v; want not found", err)
	}
	if _, err := a.Release(ctx, "vm-never"); !api.IsCode(err, api.CodeNotFound) {
		t.Errorf("release of an unknown ID with c dead: %v; want not found", err)
	}
	if reg, every := lookupsOf(t, a, events.LookupRegistry), lookupsOf(t, a, events.LookupEveryServer); reg != 2 || every != 0 {
		t.Errorf("lookups answered by the registry %v, by every server %v; want 2 and 0", reg, every)
	}
}

// lookupsOf is a's gpuherd_claim_lookups_total for path.
func lookupsOf(t *testing.T, a *Agent, path string) float64 {
	t.Helper()
	mfs, err := a.metrics.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "gpuherd_claim_lookups_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "path" && l.GetValue() == path {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no gpuherd_claim_lookups_total{path=%q}", path)
	return 0
}

// A coordinator paused past its name's lease cannot commit: while it
// slept the name lapsed and a retry through another agent took a newer
// grant and placed the claim; the paused coordinator's commit is refused
// (stale token), its reservation dropped, and a retry through it answers
// the one claim.
func TestClusterNamedPausedCoordinatorIsFenced(t *testing.T) {
	tc := newTestCluster(t)
	const lease = 300 * time.Millisecond
	tc.names = newTestNames(t, func(c *names.Config) { c.Lease = lease })
	a, b, c := tc.start("a", "a100-pcie-4"), tc.start("b", "l40s-4"), tc.start("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, l40s) == 8 })
	ctx := context.Background()

	// a acquires vm-x and reserves all of b's L40S, then "sleeps".
	rr := api.ReserveRequest{Items: []api.Item{{Model: l40s, Count: 4}}, Coordinator: "a"}
	g, err := tc.names.Acquire(ctx, names.Claim("vm-x"), "a", "", owner.RequestDigest(rr), nil)
	if err != nil {
		t.Fatal(err)
	}
	rr.Token = g.Record.Token
	if _, err := b.Owner.Reserve(ctx, "vm-x", rr); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a's grant to lapse", 10*time.Second, func() bool {
		_, err := tc.names.Lookup(ctx, names.Claim("vm-x"), names.Linearizable)
		return isNamesNotFound(err)
	})
	b.changed() // gossip b's reservation, so that the retry does not pick b
	tc.converge("b's reservation seen", func(x *Agent) bool { return freeOf(x, l40s) == 4 })

	// The client retries through c: a newer grant, placed on c.
	placed, err := c.Claim(ctx, "vm-x", l40sReq(4))
	if err != nil || placed.Node != "c" {
		t.Fatalf("retry through c: %+v, %v; want the claim on c", placed, err)
	}

	// a wakes and commits on b under its old grant: refused.
	if _, err := b.Owner.Commit(ctx, "vm-x"); !api.IsCode(err, api.CodeLeaseExpired) {
		t.Fatalf("commit under the lapsed grant: %v; want lease_expired (stale token)", err)
	}
	if on := copiesOf("vm-x", a, b, c); len(on) != 1 || on[0] != "c" {
		t.Fatalf("vm-x held on %v, want only c", on)
	}
	if free := localFree(b, l40s); free != 4 {
		t.Fatalf("b has %d L40S free after the refused commit, want 4", free)
	}
	rec, err := tc.names.Lookup(ctx, names.Claim("vm-x"), names.Linearizable)
	if err != nil || rec.State != names.StateHeld || rec.Owner != "c" || rec.Token <= g.Record.Token {
		t.Fatalf("registry record %+v, %v; want held on c under a newer token than %d", rec, err, g.Record.Token)
	}
	// The client of the paused coordinator retries through it: the same claim.
	again, err := a.Claim(ctx, "vm-x", l40sReq(4))
	if err != nil || again.Node != "c" || !slices.Equal(gpuAddrs(again), gpuAddrs(placed)) {
		t.Fatalf("retry through a: %+v, %v; want the claim on c", again, err)
	}
	checkInvariants(t, a, b, c)
}

// A placement that ends without a commit lets its name go at once: the ID
// can be claimed again with another request right away.
func TestClusterNamedNotAvailableReleasesTheName(t *testing.T) {
	tc, a, _, _ := namedThree(t)
	ctx := context.Background()
	if _, err := a.Claim(ctx, "vm-x", l40sReq(5)); !api.IsCode(err, api.CodeNotAvailable) {
		t.Fatalf("claim of 5 L40S: %v; want not available", err)
	}
	if _, err := tc.names.Lookup(ctx, names.Claim("vm-x"), names.Linearizable); !isNamesNotFound(err) {
		t.Fatalf("the registry holds vm-x after a placement that failed: %v", err)
	}
	if _, err := a.Claim(ctx, "vm-x", l40sReq(2)); err != nil {
		t.Fatalf("claim of vm-x with another request: %v", err)
	}
}

// gatedNames holds the first Hold back until gate is closed, telling on
// held which owner made it: a placement stopped between its reservation
// and its commit.
type gatedNames struct {
	*testNames
	held chan string
	gate chan struct{}
	once sync.Once
}

func (g *gatedNames) Hold(ctx context.Context, key names.Key, caller, owner, request string, recall bool) (names.Record, error) {
	first := false
	g.once.Do(func() { first = true })
	if first {
		g.held <- owner
		<-g.gate
	}
	return g.testNames.Hold(ctx, key, caller, owner, request, recall)
}

// Two placements of one claim ID at once (a client that retried through
// another agent before the first answered): both reserve, each on its own
// server; the owner that holds the ID first commits, the other's hold is
// refused and it drops its reservation, and both placements answer the
// one claim.
func TestClusterNamedConcurrentPlacementsKeepOneCopy(t *testing.T) {
	tc := newTestCluster(t)
	g := &gatedNames{testNames: tc.names, held: make(chan string, 1), gate: make(chan struct{})}
	tc.opts = append(tc.opts, WithNames(g))
	a, b, c := tc.start("a", "a100-pcie-4"), tc.start("b", "l40s-4"), tc.start("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, l40s) == 8 })
	ctx := context.Background()
	type answer struct {
		c   api.Claim
		err error
	}
	first := make(chan answer, 1)
	go func() {
		cl, err := a.Claim(ctx, "vm-x", l40sReq(4))
		first <- answer{cl, err}
	}()
	stalled := <-g.held // all its 4 reserved, its hold held back
	// The retry goes to the other server (one that reached the stalled
	// one would take that reservation up and wait for its commit).
	retry := l40sReq(4)
	retry.PreferNode = map[string]string{"b": "c", "c": "b"}[stalled]
	second, err := c.Claim(ctx, "vm-x", retry)
	if err != nil {
		t.Fatalf("second placement: %v", err)
	}
	if second.Node == stalled {
		t.Fatalf("second placement landed on %s, whose GPUs the first holds reserved", stalled)
	}
	close(g.gate)
	got := <-first
	if got.err != nil || got.c.Node != second.Node {
		t.Fatalf("first placement: %+v, %v; want the claim on %s", got.c, got.err, second.Node)
	}
	if on := copiesOf("vm-x", a, b, c); len(on) != 1 || on[0] != second.Node {
		t.Fatalf("vm-x on %v; want only %s", on, second.Node)
	}
	loser := map[string]*Agent{"b": b, "c": c}[stalled]
	if n := len(loser.ledger.List()); n != 0 {
		t.Fatalf("%s keeps %d claims or reservations after its hold was refused", stalled, n)
	}
	rec, err := tc.names.Lookup(ctx, names.Claim("vm-x"), names.Linearizable)
	if err != nil || rec.Owner != second.Node {
		t.Fatalf("registry: %+v, %v; want vm-x held on %s", rec, err, second.Node)
	}
	checkInvariants(t, a, b, c)
}

// watchedNames tells, on pending, of every linearizable lookup that found
// a name being placed: a coordinator about to wait.
type watchedNames struct {
	*testNames
	pending chan struct{}
}

func (w *watchedNames) Lookup(ctx context.Context, key names.Key, mode names.ReadMode) (names.Record, error) {
	r, err := w.testNames.Lookup(ctx, key, mode)
	if err == nil && mode == names.Linearizable && r.State == names.StatePending {
		select {
		case w.pending <- struct{}{}:
		default:
		}
	}
	return r, err
}

// A claim ID being placed the two-step way (an agent of an older version
// acquired it and has not confirmed yet) is waited for, not placed a
// second time; once that grant is let go, the claim is placed.
func TestClusterNamedClaimWaitsForAPendingGrant(t *testing.T) {
	tc := newTestCluster(t)
	w := &watchedNames{testNames: tc.names, pending: make(chan struct{}, 1)}
	tc.opts = append(tc.opts, WithNames(w))
	a, b, c := tc.start("a", "a100-pcie-4"), tc.start("b", "l40s-4"), tc.start("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, l40s) == 8 })
	ctx := context.Background()
	rr := api.ReserveRequest{Items: []api.Item{{Model: l40s, Count: 2}}}
	g, err := tc.names.as("a").Acquire(ctx, names.Claim("vm-x"), "a", "", owner.RequestDigest(rr), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "vm-x"); !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), "being placed by a") {
		t.Fatalf("get while vm-x is being placed: %v; want a 503 naming a", err)
	}
	type answer struct {
		c   api.Claim
		err error
	}
	second := make(chan answer, 1)
	go func() {
		cl, err := b.Claim(ctx, "vm-x", l40sReq(2))
		second <- answer{cl, err}
	}()
	<-w.pending
	if on := copiesOf("vm-x", a, b, c); len(on) != 0 {
		t.Fatalf("vm-x reserved on %v while its grant is pending", on)
	}
	if _, err := tc.names.as("a").Release(ctx, names.Claim("vm-x"), g.Record.Token, "a"); err != nil {
		t.Fatal(err)
	}
	got := <-second
	if got.err != nil {
		t.Fatalf("claim once the grant was let go: %v", got.err)
	}
	if on := copiesOf("vm-x", a, b, c); len(on) != 1 || on[0] != got.c.Node {
		t.Fatalf("vm-x held on %v; the claim answered %s", on, got.c.Node)
	}
}

// The owner commits only what the registry holds on it: a reservation
// made without a token is held in one write at commit, and the ledger
// keeps the token; with the registry unavailable the commit is a 503 and
// the reservation stays for the retried commit; an ID held on another
// server is refused, naming it, and the reservation is dropped; a
// reservation made under a token (a coordinator of an older version, a
// resize's move) is confirmed under it. A release lets the name go.
func TestClusterNamedOwnerCommitHolds(t *testing.T) {
	tc, _, b, c := namedThree(t)
	ctx := context.Background()
	rr := api.ReserveRequest{Items: []api.Item{{Model: l40s, Count: 1}}, Coordinator: "a"}

	if _, err := b.Owner.Reserve(ctx, "vm-1", rr); err != nil {
		t.Fatal(err)
	}
	tc.names.SetDown(true)
	if _, err := b.Owner.Commit(ctx, "vm-1"); !api.IsCode(err, api.CodeUnavailable) {
		t.Fatalf("commit with the registry down: %v; want unavailable", err)
	}
	if cl, err := b.ledger.Get("vm-1"); err != nil || cl.State != ledger.StateReserved {
		t.Fatalf("reservation after the unconfirmed commit: %+v, %v; want it kept", cl, err)
	}
	tc.names.SetDown(false)
	if _, err := b.Owner.Commit(ctx, "vm-1"); err != nil {
		t.Fatalf("commit once the registry answers: %v", err)
	}
	rec, err := tc.names.Lookup(ctx, names.Claim("vm-1"), names.Linearizable)
	if err != nil || rec.State != names.StateHeld || rec.Owner != "b" || rec.Caller != "a" || rec.Request != owner.RequestDigest(rr) {
		t.Fatalf("registry record after the commit: %+v, %v; want held on b for a's request", rec, err)
	}
	if cl, _ := b.ledger.Get("vm-1"); cl.NameToken != rec.Token {
		t.Fatalf("ledger token %d, registry token %d", cl.NameToken, rec.Token)
	}

	// Held on b: c's commit of the same ID is refused, and c lets its
	// GPU go.
	if _, err := c.Owner.Reserve(ctx, "vm-1", rr); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Owner.Commit(ctx, "vm-1"); !api.IsCode(err, api.CodeConflict) || !strings.Contains(err.Error(), "held on b") {
		t.Fatalf("commit on c of an ID held on b: %v; want a conflict naming b", err)
	}
	if _, err := c.ledger.Get("vm-1"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("c's reservation after the refused hold: %v; want it dropped", err)
	}

	// The two-step way, under a token.
	g, err := tc.names.as("a").Acquire(ctx, names.Claim("vm-2"), "a", "", owner.RequestDigest(rr), nil)
	if err != nil {
		t.Fatal(err)
	}
	rr.Token = g.Record.Token
	if _, err := c.Owner.Reserve(ctx, "vm-2", rr); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Owner.Commit(ctx, "vm-2"); err != nil {
		t.Fatalf("commit under a token: %v", err)
	}
	if rec, err := tc.names.Lookup(ctx, names.Claim("vm-2"), names.Linearizable); err != nil || rec.Owner != "c" || rec.Token != g.Record.Token {
		t.Fatalf("vm-2 after its commit: %+v, %v; want held on c under %d", rec, err, g.Record.Token)
	}

	for _, x := range []struct {
		a  *Agent
		id string
	}{{b, "vm-1"}, {c, "vm-2"}} {
		if _, err := x.a.Owner.Abort(ctx, x.id); err != nil {
			t.Fatal(err)
		}
		if _, err := tc.names.Lookup(ctx, names.Claim(x.id), names.Linearizable); !isNamesNotFound(err) {
			t.Fatalf("the registry still holds %s after its release: %v", x.id, err)
		}
	}
}

// laggingNames answers every stale lookup "not found": a copy that has
// not caught up yet.
type laggingNames struct{ *testNames }

func (l laggingNames) Lookup(ctx context.Context, key names.Key, mode names.ReadMode) (names.Record, error) {
	if mode == names.Stale {
		return names.Record{}, names.ErrNotFound
	}
	return l.testNames.Lookup(ctx, key, mode)
}

// A retry read from a copy that lags finds the ID free and places it on
// another server, whose hold is refused: the coordinator then reads the
// registry linearizably and answers the claim where it is held, never a
// conflict and never a second copy.
func TestClusterNamedStaleReadThenHeldAnswersTheClaim(t *testing.T) {
	tc := newTestCluster(t)
	tc.opts = append(tc.opts, WithNames(laggingNames{tc.names}))
	a, b, c := tc.start("a", "a100-pcie-4"), tc.start("b", "l40s-4"), tc.start("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, l40s) == 8 })
	ctx := context.Background()
	first, err := a.Claim(ctx, "vm-x", l40sReq(2))
	if err != nil {
		t.Fatal(err)
	}
	retry := l40sReq(2)
	retry.PreferNode = map[string]string{"b": "c", "c": "b"}[first.Node]
	again, err := a.Claim(ctx, "vm-x", retry)
	if err != nil || again.Node != first.Node {
		t.Fatalf("retry: %+v, %v; want the claim on %s", again, err, first.Node)
	}
	if on := copiesOf("vm-x", a, b, c); len(on) != 1 || on[0] != first.Node {
		t.Fatalf("vm-x on %v; want only %s", on, first.Node)
	}
}

// A claim on the registry path reserves and commits in one call to its
// owner: the placement sends no separate commit.
func TestClusterNamedReservesAndCommitsInOneCall(t *testing.T) {
	tc, a, b, c := namedThree(t)
	ctx := context.Background()
	cl, err := a.Claim(ctx, "vm-x", l40sReq(1))
	if err != nil {
		t.Fatal(err)
	}
	var placing []string
	for _, r := range tc.peers.Requests("a", cl.Node) {
		if strings.Contains(r, "/reservations/") {
			placing = append(placing, r)
		}
	}
	if len(placing) != 1 || !strings.HasPrefix(placing[0], "PUT ") {
		t.Fatalf("the coordinator sent %q to the owner; want one PUT (reserve and commit together)", placing)
	}
	if on := copiesOf("vm-x", a, b, c); len(on) != 1 || on[0] != cl.Node {
		t.Fatalf("vm-x on %v; want %s", on, cl.Node)
	}
	if got, _ := map[string]*Agent{"b": b, "c": c}[cl.Node].ledger.Get("vm-x"); got.State != ledger.StateCommitted {
		t.Fatalf("vm-x on %s is %s; want committed", cl.Node, got.State)
	}
}

// racingUndo moves a claim's name back to its old copy (as a failed
// resize's undo does) just before the server holding it lets the name go
// after a release: the release's own name release is then stale.
type racingUndo struct {
	*testNames
	holder, back string
	once         sync.Once
}

func (r *racingUndo) Release(ctx context.Context, key names.Key, token uint64, node string) (names.Record, error) {
	r.race(ctx, key, token, node)
	return r.testNames.Release(ctx, key, token, node)
}

func (r *racingUndo) ReleaseRemembering(ctx context.Context, key names.Key, token uint64, node string, keep time.Duration) (names.Record, error) {
	r.race(ctx, key, token, node)
	return r.testNames.ReleaseRemembering(ctx, key, token, node, keep)
}

func (r *racingUndo) race(ctx context.Context, key names.Key, token uint64, node string) {
	if node == r.holder && key == names.Claim("vm-x") {
		r.once.Do(func() {
			m, err := r.testNames.Move(ctx, key, token, r.holder, r.back, "a")
			if err == nil {
				_, err = r.testNames.ConfirmMove(ctx, key, m.Move.Token, r.back, "a")
			}
			if err != nil {
				panic(fmt.Sprintf("moving the name back: %v", err))
			}
		})
	}
}

// A release that races a move of the name (a resize that could not free
// the old copy moves the name back there) frees every copy: after the
// copy it found is released, the registry is read again, and the copy the
// name was moved to is released too.
func TestClusterNamedReleaseFollowsANameMovedAway(t *testing.T) {
	tc := newTestCluster(t)
	r := &racingUndo{testNames: tc.names}
	tc.opts = append(tc.opts, WithNames(r))
	a, b, c := tc.start("a", "a100-pcie-4"), tc.start("b", "l40s-4"), tc.start("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, l40s) == 8 })
	ctx := context.Background()
	claimOneOn(t, a, "vm-x", "c")
	// A resize's move to b, committed there, its old copy on c kept.
	moveCutShort(t, tc, "vm-x", c, b)
	r.holder, r.back = "b", "c"

	got, err := a.Release(ctx, "vm-x")
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	if len(got.Warnings) == 0 || !strings.Contains(strings.Join(got.Warnings, " "), "moved to c") {
		t.Fatalf("release answered %+v; want a warning that the copy on c was released too", got)
	}
	if on := copiesOf("vm-x", a, b, c); len(on) != 0 {
		t.Fatalf("vm-x still on %v after its release", on)
	}
	if _, err := tc.names.Lookup(ctx, names.Claim("vm-x"), names.Linearizable); !isNamesNotFound(err) {
		t.Fatalf("the registry still holds vm-x: %v", err)
	}
}

// A claim whose placement finds no room answers "not available" only when
// its ID is still free: read from a copy that lags, an ID held under
// another request is a conflict, and one held under this request (its
// GPUs are what the placement found taken) is that claim.
func TestClusterNamedNoRoomIsNotAvailableOnlyForAFreeID(t *testing.T) {
	tc := newTestCluster(t)
	tc.opts = append(tc.opts, WithNames(laggingNames{tc.names}))
	a, b, c := tc.start("a", "a100-pcie-4"), tc.start("b", "l40s-4"), tc.start("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, l40s) == 8 })
	ctx := context.Background()
	if _, err := a.Claim(ctx, "vm-fill", l40sReq(4)); err != nil {
		t.Fatal(err)
	}
	held, err := a.Claim(ctx, "vm-x", l40sReq(4))
	if err != nil {
		t.Fatal(err)
	}
	// Every L40S is taken now.
	if _, err := b.Claim(ctx, "vm-x", l40sReq(3)); !api.IsCode(err, api.CodeConflict) || !strings.Contains(err.Error(), held.Node) {
		t.Fatalf("claim of vm-x with another request: %v; want a conflict naming %s", err, held.Node)
	}
	again, err := c.Claim(ctx, "vm-x", l40sReq(4))
	if err != nil || again.Node != held.Node {
		t.Fatalf("retry of vm-x: %+v, %v; want the claim on %s", again, err, held.Node)
	}
	if _, err := c.Claim(ctx, "vm-y", l40sReq(1)); !api.IsCode(err, api.CodeNotAvailable) {
		t.Fatalf("claim of a free ID with no room: %v; want not available", err)
	}
}

// claimOneOn claims one L40S as id through via, on node.
func claimOneOn(t *testing.T, via *Agent, id, node string) {
	t.Helper()
	req := l40sReq(1)
	req.PreferNode = node
	if _, err := via.Claim(context.Background(), id, req); err != nil {
		t.Fatalf("claiming %s on %s: %v", id, node, err)
	}
}

// moveCutShort moves claim id's name (one L40S, coordinated by a) from
// one server to another and commits it there, as a resize's move does,
// and stops before the copy on from is released.
func moveCutShort(t *testing.T, tc *testCluster, id string, from, to *Agent) {
	t.Helper()
	ctx := context.Background()
	rec, err := tc.names.Lookup(ctx, names.Claim(id), names.Linearizable)
	if err != nil || rec.Owner != from.cfg.NodeName {
		t.Fatalf("%s: %+v, %v; want it on %s", id, rec, err, from.cfg.NodeName)
	}
	m, err := tc.names.Move(ctx, names.Claim(id), rec.Token, from.cfg.NodeName, to.cfg.NodeName, "a")
	if err != nil {
		t.Fatal(err)
	}
	rr := api.ReserveRequest{Items: []api.Item{{Model: l40s, Count: 1}}, Coordinator: "a", Token: m.Move.Token}
	if _, err := to.Owner.Reserve(ctx, id, rr); err != nil {
		t.Fatal(err)
	}
	if _, err := to.Owner.Commit(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// A release through the claim's own owner reads no name: its ledger holds
// the claim under its token, and the name's release, conditional on that
// holder and token, is the check a lookup was. Through another agent the
// release still looks the name up first.
func TestClusterNamedReleaseOnItsOwnerLooksNothingUp(t *testing.T) {
	tc, a, b, c := namedThree(t)
	ctx := context.Background()
	for _, via := range []*Agent{b, a} {
		claimOneOn(t, a, "vm-x", "b")
		before := tc.names.lookups.Load()
		got, err := via.Release(ctx, "vm-x")
		if err != nil {
			t.Fatalf("release through %s: %v", via.cfg.NodeName, err)
		}
		if got.Node != "b" || got.NameReleased || got.NameElsewhere || len(got.Warnings) != 0 {
			t.Fatalf("release through %s answered %+v; want b's claim, no warning, no owner-only fields", via.cfg.NodeName, got)
		}
		lookups := tc.names.lookups.Load() - before
		if via == b && lookups != 0 {
			t.Errorf("a release through the owner read the name %d times; want none", lookups)
		}
		if via == a && lookups == 0 {
			t.Errorf("a release through another agent read no name; the test no longer tells the two apart")
		}
		if on := copiesOf("vm-x", a, b, c); len(on) != 0 {
			t.Fatalf("vm-x still on %v after its release through %s", on, via.cfg.NodeName)
		}
		if _, err := tc.names.Lookup(ctx, names.Claim("vm-x"), names.Linearizable); !isNamesNotFound(err) {
			t.Fatalf("the registry still holds vm-x after its release through %s: %v", via.cfg.NodeName, err)
		}
	}
	if _, err := b.Release(ctx, "vm-x"); !api.IsCode(err, api.CodeNotFound) {
		t.Fatalf("releasing vm-x again: %v; want not found", err)
	}
}

// A release through a server whose ledger still holds a leftover copy (a
// move cut short, then a second move) frees the leftover and the copy the
// registry names, wherever the name went: the leftover's own name release
// is refused, and the registry's copy is found and released as usual.
func TestClusterNamedReleaseOnALeftoverFreesTheNamedCopy(t *testing.T) {
	tc := newTestCluster(t)
	a, b, c, d := tc.start("a", "a100-pcie-4"), tc.start("b", "l40s-4"), tc.start("c", "l40s-4"), tc.start("d", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, l40s) == 12 })
	ctx := context.Background()
	claimOneOn(t, a, "vm-x", "c")
	// Moves c → b (c's copy kept: the move was cut short) and b → d.
	moveCutShort(t, tc, "vm-x", c, b)
	moveCutShort(t, tc, "vm-x", b, d)
	if _, err := b.Owner.Abort(ctx, "vm-x"); err != nil {
		t.Fatalf("releasing the copy on b: %v", err)
	}
	if on := copiesOf("vm-x", a, b, c, d); !slices.Equal(on, []string{"c", "d"}) {
		t.Fatalf("vm-x on %v; want the leftover on c and the claim on d", on)
	}

	got, err := c.Release(ctx, "vm-x")
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	if got.Node != "d" || !strings.Contains(strings.Join(got.Warnings, " "), "leftover copy on c") {
		t.Fatalf("release answered %+v; want d's claim with a warning that the leftover on c was released too", got)
	}
	if on := copiesOf("vm-x", a, b, c, d); len(on) != 0 {
		t.Fatalf("vm-x still on %v after its release", on)
	}
	if _, err := tc.names.Lookup(ctx, names.Claim("vm-x"), names.Linearizable); !isNamesNotFound(err) {
		t.Fatalf("the registry still holds vm-x: %v", err)
	}
}
