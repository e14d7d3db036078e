package agent

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/gossip"
)

// cutOff silences name on both in-memory networks (its peer API and its
// gossip answer nobody) and waits until every other agent's gossip sees it
// dead; the agent itself keeps running, holding its claims.
func (tc *testCluster) cutOff(name string) {
	tc.t.Helper()
	x := tc.agents[name]
	var others []string
	for n := range tc.agents {
		if n != name {
			others = append(others, n)
		}
	}
	tc.peers.Partition([]string{name}, others)
	tc.gossip.Pause(x.cluster.g.LocalAddr())
	tc.converge(name+" dead", func(y *Agent) bool { return y == x || memberState(y, name) == gossip.StateDead })
}

// restartUnaware stops name and starts it again on the same data
// directory, and waits until its gossip has joined and lists every agent
// but those of unseen, which it must not know of: the others pass on dead
// members only to agents that knew them. That is the restarted agent the
// listings must not trust.
func (tc *testCluster) restartUnaware(name, profile string, beforeStart func(dataDir string), unseen ...string) *Agent {
	tc.t.Helper()
	tc.stop(name)
	delete(tc.agents, name)
	if beforeStart != nil {
		beforeStart(filepath.Join(tc.dir, name))
	}
	x := tc.start(name, profile)
	waitFor(tc.t.(*testing.T), name+" joined", 10e9, func() bool {
		if !x.cluster.joined.Load() {
			return false
		}
		for n := range tc.agents {
			if n != name && !slices.Contains(unseen, n) && memberState(x, n) != gossip.StateAlive {
				return false
			}
		}
		return true
	})
	for _, n := range unseen {
		if s := memberState(x, n); s != "" {
			tc.t.Fatalf("the restarted %s's gossip lists %s (%s): the scenario needs an agent that has not heard of it", name, n, s)
		}
	}
	return x
}

func unansweredNodes(us []api.Unanswered) []string {
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = u.Node
	}
	return out
}

// TestClaimListAfterRestartDuringPartition is the listing that once said
// it was complete when it was not: an agent killed and restarted while the
// server holding a claim was cut off does not hear of that server through
// gossip, and its claim list left the claim out with "partial": false.
// The list is judged against the servers the agent saw before its restart
// (its known list, without a name registry) and against the owners the
// registry records (with the known list lost), and against the known list
// alone while the registry does not answer: each way the cut-off server is
// named and the list is partial.
func TestClaimListAfterRestartDuringPartition(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		registry bool
		// keepKnown: the servers the restarted agent's known list keeps
		// (nil keeps the file as it was).
		keepKnown []string
		// registryDown: the registry does not answer the listing.
		registryDown bool
	}{
		{name: "known-list", registry: false},
		{name: "registry", registry: true, keepKnown: []string{"d"}},
		{name: "registry-down", registry: true, registryDown: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tc := newTestCluster(t)
			if !tt.registry {
				tc.names = nil
			}
			ctx := context.Background()
			tc.start("b", "l40s-4") // the seed: it outlives a's restart
			a := tc.start("a", "l40s-4")
			c := tc.start("c", "l40s-4")
			tc.start("d", "l40s-4")
			tc.converge("membership", func(x *Agent) bool { return len(x.targets()) == 4 })
			waitFor(t, "a's known list", 5e9, func() bool { return len(a.cluster.known.list()) == 3 })
			one := []api.Item{{Model: "L40S", Count: 1}}
			if _, err := a.Claim(ctx, "vm-b", api.ClaimRequest{GPUs: one, PreferNode: "b", SameNode: true}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Claim(ctx, "vm-c", api.ClaimRequest{GPUs: one, PreferNode: "c", SameNode: true}); err != nil {
				t.Fatal(err)
			}

			tc.cutOff("c")
			tc.cutOff("d")
			var rewrite func(string)
			if tt.keepKnown != nil {
				rewrite = func(dir string) {
					data, _ := json.Marshal(knownMembersDoc{Members: tt.keepKnown})
					if err := os.WriteFile(filepath.Join(dir, knownMembersFile), data, 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}
			a = tc.restartUnaware("a", "l40s-4", rewrite, "c", "d")
			if tt.registryDown {
				tc.names.SetDown(true)
				defer tc.names.SetDown(false)
			}

			l, err := a.ListClaims(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ids := make([]string, len(l.Claims))
			for i, cl := range l.Claims {
				ids[i] = cl.ID
			}
			want := []string{"c", "d"}
			switch {
			case tt.registryDown:
				// The known list decides alone, and the lost claims the
				// registry would list are missing too.
				want = []string{"c", "d", "name registry"}
			case tt.registry:
				// d holds nothing in the registry, which answered: it is
				// no gap in a claim list.
				want = []string{"c"}
			}
			if !l.Partial || !slices.Equal(unansweredNodes(l.Unanswered), want) || !slices.Equal(ids, []string{"vm-b"}) {
				t.Fatalf("claims through the restarted a: %+v; want vm-b, partial, naming %v", l, want)
			}
			for _, u := range l.Unanswered {
				if u.Node != "name registry" && !strings.Contains(u.Reason, "not asked") {
					t.Errorf("reason for %s: %q; want why it was not asked", u.Node, u.Reason)
				}
			}
			t.Logf("partial, %s: %s", l.Unanswered[0].Node, l.Unanswered[0].Reason)

			// The aggregates name what the known list names.
			ms, _ := a.Members(ctx)
			var unknown []string
			for _, m := range ms {
				if m.State == api.MemberUnknown {
					unknown = append(unknown, m.Name)
				}
			}
			av, _ := a.Availability(ctx)
			wantKnown := []string{"c", "d"}
			if tt.keepKnown != nil {
				wantKnown = tt.keepKnown
			}
			if !slices.Equal(unknown, wantKnown) || !av.Partial || !slices.Equal(unansweredNodes(av.Unanswered), wantKnown) {
				t.Errorf("members unknown %v, availability %+v; want %v named by both", unknown, av, wantKnown)
			}
			if !tt.registry {
				// Without the registry a get asks every server: one it
				// cannot ask is no "not found".
				if _, err := a.Get(ctx, "vm-c"); !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), "c") {
					t.Errorf("get vm-c through the restarted a: %v; want 503 naming c", err)
				}
			}
		})
	}
}

// TestKnownMembersSurviveRestartAndRemoval: the known list is on disk,
// takes every member gossip sees alive, and members remove takes a server
// off it, after which listings stop waiting for it.
func TestKnownMembersSurviveRestartAndRemoval(t *testing.T) {
	tc := newTestCluster(t)
	ctx := context.Background()
	tc.start("b", "l40s-4")
	a := tc.start("a", "l40s-4")
	c := tc.start("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return len(x.targets()) == 3 })
	waitFor(t, "a's known list", 5e9, func() bool { return slices.Equal(a.cluster.known.list(), []string{"b", "c"}) })
	if _, err := c.Claim(ctx, "vm-c", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}, PreferNode: "c", SameNode: true}); err != nil {
		t.Fatal(err)
	}
	tc.crash("c")
	a = tc.restartUnaware("a", "l40s-4", nil, "c")
	if got := a.cluster.known.list(); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("known list after the restart: %v; want b and c", got)
	}
	if l, _ := a.ListClaims(ctx); !l.Partial || !slices.Equal(unansweredNodes(l.Unanswered), []string{"c"}) {
		t.Fatalf("claims with c unseen: %+v; want partial naming c", l)
	}
	if _, err := a.RemoveMember(ctx, "c", false); err != nil {
		t.Fatalf("members remove c: %v", err)
	}
	if got := a.cluster.known.list(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("known list after members remove c: %v; want b", got)
	}
	l, _ := a.ListClaims(ctx)
	av, _ := a.Availability(ctx)
	if l.Partial || av.Partial || len(l.Claims) != 1 || l.Claims[0].State != api.StateLost {
		t.Errorf("after members remove c: claims %+v, availability %+v; want both complete, vm-c lost", l, av)
	}
}

// TestKnownMembersWriteFailureIsReported: the known members list is a
// store of its own; a write it cannot make marks it failing.
func TestKnownMembersWriteFailureIsReported(t *testing.T) {
	dir := t.TempDir()
	a := startAgent(t, testConfig(t, dir), machine(t, "dgx-h100", dir), nil)
	defer a.Close()
	runAgent(t, a)
	k := &knownMembers{path: filepath.Join(dir, knownMembersFile), names: map[string]bool{},
		write:  func(string, []byte) error { return &fs.PathError{Op: "write", Path: "members.json", Err: syscall.EIO} },
		failed: func(op string, err error) { a.storageResult(storeMembers, op, err) }}
	k.add([]string{"b"})
	if v, _ := sample(t, a.metrics.Registry(), "gpuherd_storage_failing", map[string]string{"store": storeMembers}); v != 1 {
		t.Errorf("members store failing gauge = %v after an I/O error, want 1", v)
	}
	if err := a.readiness(); err == nil || !strings.Contains(err.Error(), "members write: I/O error") {
		t.Errorf("readiness: %v; want the members store named", err)
	}
	k.write = func(string, []byte) error { return nil }
	k.add([]string{"c"})
	if err := a.readiness(); err != nil {
		t.Errorf("readiness once the list writes again: %v", err)
	}
}
