package agent

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/gossip"
)

// memberState is node's state in a's gossip view, "" when the view does
// not hold it.
func memberState(a *Agent, node string) string { return a.cluster.State(node) }

// voterNames is the test registry as seen by an agent that knows its
// servers (*names.Registry does): removing one of them must take it out.
type voterNames struct {
	*testNames
	mu      sync.Mutex
	servers map[string]bool
	removed []string
}

func (v *voterNames) IsServer(node string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.servers[node]
}

func (v *voterNames) RemoveServer(_ context.Context, id string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.servers, id)
	v.removed = append(v.removed, id)
	return nil
}

// crash cuts name off the in-memory network as a host that died (no
// graceful leave) and waits until every other agent's gossip sees it dead.
func (tc *testCluster) crash(name string) {
	tc.t.Helper()
	a := tc.agents[name]
	tc.peers.Kill(name)
	// Silence, not a refused send: memberlist suspects a member whose
	// pings go unanswered, not one it fails to write to.
	tc.gossip.Pause(a.cluster.g.LocalAddr())
	tc.converge(name+" dead", func(x *Agent) bool {
		return x == a || memberState(x, name) == gossip.StateDead
	})
	if err := a.cluster.g.Shutdown(); err != nil {
		tc.t.Fatal(err)
	}
}

// A server that died for good while it held a claim: before members
// remove, its claim answers 503 naming it (unknown IDs 404: the registry
// holds no name for them); after, claims
// lists the claim as lost on it, get answers 410 lost, unknown IDs 404,
// and a release through any agent frees the name, so the ID can be
// claimed again. A member still alive is refused without --force.
func TestMembersRemoveMakesClaimsLost(t *testing.T) {
	tc, n, logs := namedCluster(t)
	voters := &voterNames{testNames: n, servers: map[string]bool{"b": true}}
	tc.opts = []Option{WithNames(voters)}
	a := tc.start("a", "l40s-4")
	tc.opts = []Option{WithNames(n)}
	b := settled(t, tc.start("b", "l40s-4"))
	c := tc.start("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return len(x.targets()) == 3 })
	olderClaim(t, b, "vm-1")
	if rep := b.AntiEntropyPass(context.Background()); len(rep.Adopted) != 1 {
		t.Fatalf("b's pass: %+v, want vm-1 given its name", rep)
	}
	ctx := context.Background()

	tc.crash("b")
	for _, x := range []*Agent{a, c} {
		if _, err := x.Get(ctx, "vm-1"); !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), "b") {
			t.Fatalf("get vm-1 through %s with b dead: %v, want 503 naming b", x.cfg.NodeName, err)
		}
	}
	// The registry holds no name vm-never: b cannot hold it, dead or not.
	for _, x := range []*Agent{a, c} {
		if _, err := x.Get(ctx, "vm-never"); !api.IsCode(err, api.CodeNotFound) {
			t.Fatalf("get of an unknown ID through %s with b dead: %v, want 404", x.cfg.NodeName, err)
		}
		if _, err := x.Release(ctx, "vm-never"); !api.IsCode(err, api.CodeNotFound) {
			t.Fatalf("release of an unknown ID through %s with b dead: %v, want 404", x.cfg.NodeName, err)
		}
	}

	if _, err := a.RemoveMember(ctx, "c", false); !api.IsCode(err, api.CodeConflict) || !strings.Contains(err.Error(), "--force") {
		t.Errorf("removing c, alive: %v, want conflict pointing at --force", err)
	}
	if _, err := a.RemoveMember(ctx, "a", false); !api.IsCode(err, api.CodeInvalid) {
		t.Errorf("removing a through itself: %v, want invalid", err)
	}
	if _, err := a.RemoveMember(ctx, "bad name", false); !api.IsCode(err, api.CodeInvalid) {
		t.Errorf("removing %q: %v, want invalid", "bad name", err)
	}

	rm, err := a.RemoveMember(ctx, "b", false)
	if err != nil {
		t.Fatalf("members remove b: %v", err)
	}
	if rm.Node != "b" || rm.State != gossip.StateDead || !slices.Equal(rm.Lost, []string{"vm-1"}) || !rm.RegistryServer ||
		!slices.Equal(voters.removed, []string{"b"}) {
		t.Fatalf("removal: %+v (registry servers removed %v); want vm-1 lost, b taken out of the registry", rm, voters.removed)
	}
	if again, err := a.RemoveMember(ctx, "b", false); err != nil || !slices.Equal(again.Lost, []string{"vm-1"}) {
		t.Errorf("members remove b again: %+v, %v; want the same lost claims", again, err)
	}
	if logs.count("a", "level=WARN", "member removed for good", "node=b", "vm-1") == 0 {
		t.Error("the removal was not logged with its lost claims")
	}
	if slices.ContainsFunc(a.cluster.g.Members(), func(m gossip.Member) bool { return m.Name == "b" }) {
		t.Error("a still lists b as a member")
	}

	for _, x := range []*Agent{a, c} {
		l, err := x.ListClaims(ctx)
		if err != nil {
			t.Fatal(err)
		}
		lost, ok := claimViewOf(l, "vm-1", "b")
		if !ok || lost.State != api.StateLost || l.Partial {
			t.Errorf("claims through %s: %+v; want vm-1 lost on b, and a complete list", x.cfg.NodeName, l)
		}
		_, err = x.Get(ctx, "vm-1")
		if e := apiErr(t, err); e.Code != api.CodeLost || e.HTTPStatus() != http.StatusGone ||
			!strings.Contains(e.Message, "removed from the cluster") || !strings.Contains(e.Message, "release vm-1") {
			t.Errorf("get vm-1 through %s: %+v; want 410 lost, saying what happened and what to do", x.cfg.NodeName, e)
		}
	}
	if _, err := a.Get(ctx, "vm-never"); !api.IsCode(err, api.CodeNotFound) {
		t.Errorf("get of an unknown ID through a after the removal: %v, want 404", err)
	}

	rel, err := c.Release(ctx, "vm-1")
	if err != nil || rel.Node != "b" || len(rel.Warnings) == 0 {
		t.Fatalf("release of lost vm-1 through c: %+v, %v", rel, err)
	}
	if r, held := nameOf(t, n, "vm-1"); held {
		t.Fatalf("vm-1's name after its release: %+v", r)
	}
	if _, err := a.Get(ctx, "vm-1"); !api.IsCode(err, api.CodeNotFound) {
		t.Errorf("get vm-1 after its release: %v, want 404", err)
	}
	for _, x := range []*Agent{a, c} {
		if _, err := x.Release(ctx, "vm-1"); !api.IsCode(err, api.CodeNotFound) {
			t.Errorf("second release of vm-1 through %s: %v, want 404", x.cfg.NodeName, err)
		}
	}
	if l, _ := a.ListClaims(ctx); len(l.Claims) != 0 {
		t.Errorf("claims after the release: %+v", l.Claims)
	}
	if _, err := n.Acquire(ctx, names.Claim("vm-1"), "a", "", "a new request", nil); err != nil {
		t.Errorf("vm-1 cannot be named again: %v", err)
	}

	forced, err := a.RemoveMember(ctx, "c", true)
	if err != nil || forced.State != gossip.StateAlive || len(forced.Lost) != 0 {
		t.Errorf("members remove --force c: %+v, %v", forced, err)
	}
	if !slices.ContainsFunc(a.cluster.g.Members(), func(m gossip.Member) bool { return m.Name == "c" }) {
		t.Error("an alive member was forgotten")
	}
}

// Removing a member needs the registry: an agent running alone, or one
// without it, says so; an unavailable registry is a retryable 503.
func TestMembersRemoveNeedsTheRegistry(t *testing.T) {
	tc, n, _ := namedCluster(t)
	a := tc.start("a", "l40s-4")
	n.SetDown(true)
	_, err := a.RemoveMember(context.Background(), "gone", false)
	if !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), "registry") {
		t.Errorf("with the registry down: %v, want 503 naming it", err)
	}
	tc.names = nil
	b := tc.start("b", "l40s-4")
	if _, err := b.RemoveMember(context.Background(), "gone", false); !api.IsCode(err, api.CodeInvalid) || !strings.Contains(err.Error(), "name registry") {
		t.Errorf("without a registry: %v, want invalid saying why", err)
	}
}

// A claim ID whose name the registry holds is never answered "not found",
// even when no server this agent reaches has a copy (its holder is not in
// this agent's view): a caller would believe its GPUs free.
func TestGetOfANameHeldOutOfViewIsUnavailable(t *testing.T) {
	tc, n, _ := namedCluster(t)
	a := tc.start("a", "l40s-4")
	holdName(t, n, "vm-h", "elsewhere")
	for _, op := range []func(context.Context, string) (api.Claim, error){a.Get, a.Release} {
		_, err := op(context.Background(), "vm-h")
		if !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), "held on elsewhere") {
			t.Errorf("vm-h held on a server a does not see: %v, want 503 naming it", err)
		}
	}
}
