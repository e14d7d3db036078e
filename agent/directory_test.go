package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/home"
)

// idHomedOn returns the first ID "vm-N" whose home, by a's view, is one of
// homes.
func idHomedOn(a *Agent, homes ...string) string {
	for i := 0; ; i++ {
		id := fmt.Sprintf("vm-%d", i)
		if slices.Contains(homes, home.Of(id, a.targets(), targetName).Name()) {
			return id
		}
	}
}

// threeAgents starts agents a, b and c on the given profiles with
// directory_settle settle, and waits until each sees all three.
func threeAgents(t *testing.T, settle time.Duration, pa, pb, pc string) (tc *testCluster, a, b, c *Agent) {
	t.Helper()
	tc = newTestCluster(t)
	tc.adjust = func(c *Config) { c.DirectorySettle = Duration(settle) }
	return startThree(tc, pa, pb, pc)
}

// threeDirectoryAgents is threeAgents without a name registry: the claim
// directory and the every-server lookups are then the claim path, as on a
// cluster of agents without one.
func threeDirectoryAgents(t *testing.T, settle time.Duration, pa, pb, pc string) (tc *testCluster, a, b, c *Agent) {
	t.Helper()
	tc = newTestCluster(t)
	tc.names = nil
	tc.adjust = func(c *Config) { c.DirectorySettle = Duration(settle) }
	return startThree(tc, pa, pb, pc)
}

func startThree(tc *testCluster, pa, pb, pc string) (_ *testCluster, a, b, c *Agent) {
	tc.t.Helper()
	a, b, c = tc.start("a", pa), tc.start("b", pb), tc.start("c", pc)
	tc.converge("membership", func(x *Agent) bool { return len(x.targets()) == 3 })
	return tc, a, b, c
}

// With the directory vouching, a claim, a get and a release need only the
// ID's home and the owner: they work while another server's peer API does
// not answer. A "not found" is never taken from the home alone: once the
// claim is released, a get asks every server, and with one silent it is a
// retryable "did not answer", not "not found".
func TestClusterDirectoryAnswersWithoutAskingEveryone(t *testing.T) {
	tc := newTestCluster(t)
	tc.names = nil // the directory is what this test is about
	tc.adjust = func(c *Config) { c.DirectorySettle = 0 }
	a := tc.start("a", "dgx-h100")
	b := tc.start("b", "l40s-4")
	c := tc.start("c", "dgx-h100")
	d := tc.start("d", "a100-pcie-4")
	tc.converge("membership", func(x *Agent) bool {
		return freeOf(x, "NVIDIA L40S") == 4 && freeOf(x, "NVIDIA A100 80GB") == 4 && freeOf(x, "NVIDIA H100 80GB") == 16
	})
	ctx := context.Background()
	for _, x := range []*Agent{a, b, c, d} {
		for i := range 200 {
			id := fmt.Sprintf("id-%d", i)
			if x.home.IsHome(id) != home.Of(id, x.targets(), targetName).Self() {
				t.Fatalf("%s: IsHome(%s) disagrees with home.Of", x.cfg.NodeName, id)
			}
		}
	}
	// An ID whose home is neither d (about to go quiet) nor b (the owner).
	id := idHomedOn(a, "a", "c")
	home := tc.agents[home.Of(id, a.targets(), targetName).Name()]
	closePeerAPI(d) // d stays in gossip, its peer API is gone

	cl, err := a.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}})
	if err != nil || cl.Node != "b" {
		t.Fatalf("claim %s: %+v, %v", id, cl, err)
	}
	waitFor(t, "the home to learn where "+id+" is", 5*time.Second, func() bool {
		ans, err := home.LookupDirectory(ctx, id)
		return err == nil && ans.State == api.DirHeld && len(ans.Owners) == 1 && ans.Owners[0] == "b"
	})
	if got, err := c.Get(ctx, id); err != nil || got.Node != "b" {
		t.Fatalf("get through c with d silent: %+v, %v", got, err)
	}
	// A retry through another coordinator returns the same claim.
	if again, err := c.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}}); err != nil || !sameGPUs(again, cl) {
		t.Fatalf("retry through c: %+v, %v; want %v", again, err, gpuList(cl))
	}
	if _, err := c.Release(ctx, id); err != nil {
		t.Fatalf("release through c with d silent: %v", err)
	}
	waitFor(t, "the home to forget "+id, 5*time.Second, func() bool {
		ans, err := home.LookupDirectory(ctx, id)
		return err == nil && ans.State == api.DirAbsent
	})
	if _, err := a.Get(ctx, id); !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), "d did not answer") {
		t.Fatalf("get of the released claim with d silent: %v, want unavailable naming d", err)
	}
	if free := localFree(b, "NVIDIA L40S"); free != 4 {
		t.Errorf("b has %d L40S free after the release, want 4", free)
	}
}

// A home that restarts has forgotten everything: it must not vouch that a
// held claim is absent. It stays unsure until directory_settle has passed,
// by which time the owners have sent it their claims again.
func TestIntegrationDirectoryHomeRestarts(t *testing.T) {
	tc := newSocketCluster(t)
	tc.names = nil // the directory is what this test is about
	const settle = 3 * time.Second
	tc.adjust = func(c *Config) { c.DirectorySettle = Duration(settle) }
	a := tc.start("a", "a100-pcie-4")
	b := tc.start("b", "l40s-4")
	tc.start("c", "a100-pcie-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 4 && freeOf(x, "NVIDIA A100 80GB") == 8 })
	tc.registryUp()
	ctx := context.Background()
	id := idHomedOn(a, "c")
	if _, err := a.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}}); err != nil {
		t.Fatal(err)
	}
	tc.stop("c")
	c := tc.start("c", "a100-pcie-4")
	var answers []string
	waitFor(t, "the restarted home to learn about "+id, 4*settle, func() bool {
		ans, err := c.LookupDirectory(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(answers) == 0 || answers[len(answers)-1] != ans.State {
			answers = append(answers, ans.State)
		}
		return ans.State == api.DirHeld
	})
	t.Logf("the restarted home answered, in turn: %v", answers)
	for _, s := range answers {
		if s == api.DirAbsent {
			t.Fatalf("the restarted home said %s is absent while b holds it (answers %v)", id, answers)
		}
	}
	if got, err := a.Get(ctx, id); err != nil || got.Node != "b" {
		t.Fatalf("get after the home restarted: %+v, %v", got, err)
	}
	_ = b
}

// An owner's notice that its home does not take is sent again until it is.
func TestClusterDirectoryNoticeRetried(t *testing.T) {
	_, a, b, c := threeDirectoryAgents(t, 0, "a100-pcie-4", "l40s-4", "a100-pcie-4")
	ctx := context.Background()
	id := idHomedOn(a, "c")
	// b cannot reach c's peer API for a while.
	reconnect := cutPeerAPI(t, b, "c")
	if cl, err := a.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}}); err != nil || cl.Node != "b" {
		t.Fatalf("claim: %+v, %v", cl, err)
	}
	waitFor(t, "b's notice to be parked for a retry", 10*time.Second, func() bool {
		return b.NoticeOwed(id)
	})
	if ans, _ := c.LookupDirectory(ctx, id); ans.State == api.DirHeld {
		t.Fatalf("c learned of %s although b could not reach it: %+v", id, ans)
	}
	reconnect()
	waitFor(t, "c to learn where "+id+" is", 10*time.Second, func() bool {
		ans, err := c.LookupDirectory(ctx, id)
		return err == nil && ans.State == api.DirHeld && len(ans.Owners) == 1 && ans.Owners[0] == "b"
	})
}

// The first reservation of a claim is made while its ID's home is asked,
// and committed only once the home vouches. When the home says the ID is
// held already (a client's retry through another agent), the reservation
// made meanwhile is dropped, and the answer is the claim that exists.
func TestClusterReservesWhileAskingTheHome(t *testing.T) {
	_, a, b, c := threeDirectoryAgents(t, 0, "l40s-4", "l40s-4", "a100-pcie-4")
	ctx := context.Background()
	id := idHomedOn(a, "c")
	req := api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}, PreferNode: "a"}
	cl, err := c.Claim(ctx, id, req)
	if err != nil || cl.Node != "a" {
		t.Fatalf("claim %s: %+v, %v", id, cl, err)
	}
	waitFor(t, "the home to learn where "+id+" is", 5*time.Second, func() bool {
		ans, err := c.LookupDirectory(ctx, id)
		return err == nil && ans.State == api.DirHeld
	})
	// The retry prefers b: b reserves before the home's "held on a" is in.
	rev := b.ledger.Revision()
	req.PreferNode = "b"
	again, err := c.Claim(ctx, id, req)
	if err != nil || again.Node != "a" || !sameGPUs(again, cl) {
		t.Fatalf("retry: %+v, %v; want the claim on a %v", again, err, gpuList(cl))
	}
	if moved := b.ledger.Revision() - rev; moved != 2 {
		t.Errorf("b's ledger moved %d times during the retry, want 2 (the reservation made while the home was asked, and its abort)", moved)
	}
	if _, err := b.ledger.Get(id); err == nil {
		t.Errorf("b still holds %s after the home said it is held on a", id)
	}
	if free := localFree(b, "NVIDIA L40S"); free != 4 {
		t.Errorf("b has %d L40S free, want 4", free)
	}
}

// A home that cannot vouch (the membership changed less than
// directory_settle ago) sends the claim the slow way, and the reservation
// made while it was asked is what that way finds and commits: one
// reservation, no abort and reserve again.
func TestClusterUnsureHomeKeepsTheReservation(t *testing.T) {
	_, a, b, c := threeDirectoryAgents(t, 10*time.Minute, "l40s-4", "l40s-4", "a100-pcie-4")
	ctx := context.Background()
	id := idHomedOn(c, "b")
	if ans, err := b.LookupDirectory(ctx, id); err != nil || ans.State != api.DirUnsure {
		t.Fatalf("the home's answer before the claim: %+v, %v; want unsure", ans, err)
	}
	rev := a.ledger.Revision()
	cl, err := c.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}, PreferNode: "a"})
	if err != nil || cl.Node != "a" || cl.State != api.StateClaimed {
		t.Fatalf("claim %s: %+v, %v", id, cl, err)
	}
	if moved := a.ledger.Revision() - rev; moved != 2 {
		t.Errorf("a's ledger moved %d times for the claim, want 2 (one reservation and its commit)", moved)
	}
}

// A claim whose owner this agent does not see (it left the gossip for
// maintenance, or has not reached this agent's view yet) is not "not
// found": the ID's home still says where it is held, and a get or a
// release answers a retryable 503 naming that server.
func TestClusterClaimOnAnUnseenOwnerIsNotNotFound(t *testing.T) {
	tc, a, _, c := threeDirectoryAgents(t, 0, "a100-pcie-4", "l40s-4", "a100-pcie-4")
	ctx := context.Background()
	id := idHomedOn(a, "c")
	if cl, err := a.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}}); err != nil || cl.Node != "b" {
		t.Fatalf("claim %s: %+v, %v", id, cl, err)
	}
	waitFor(t, "the home to learn where "+id+" is", 5*time.Second, func() bool {
		ans, err := c.LookupDirectory(ctx, id)
		return err == nil && ans.State == api.DirHeld
	})
	tc.stop("b") // leaves the gossip; its ledger keeps the claim
	waitFor(t, "a to see b gone", 10*time.Second, func() bool {
		_, ok := targetNamed(a.targets(), "b")
		return !ok
	})
	for name, op := range map[string]func() error{
		"get":     func() error { _, err := a.Get(ctx, id); return err },
		"release": func() error { _, err := a.Release(ctx, id); return err },
	} {
		err := op()
		if !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), "home says b holds it, a server this agent does not see") {
			t.Errorf("%s of a claim held on b, which a does not see: %v; want a 503 naming b", name, err)
		}
	}
}
