package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/gossip"
)

// TestClaimOnlyASuspectCouldHold: when the only server that could hold a
// request is one gossip holds suspect, the coordinator asks it after every
// alive server. A suspect that answers (its gossip is silent, its peer API
// is not: a loaded machine) takes the claim; one that does not answer makes
// the answer a retryable 503 naming it, never "not available", which would
// say that no server can hold the request. A request nobody could hold is
// still "not available".
func TestClaimOnlyASuspectCouldHold(t *testing.T) {
	for _, names := range []bool{true, false} {
		t.Run(map[bool]string{true: "registry", false: "no-registry"}[names], func(t *testing.T) {
			tc := newTestCluster(t)
			if !names {
				tc.names = nil
				tc.adjust = func(c *Config) { c.DirectorySettle = 0 }
			}
			// Suspicion that lasts: with three members memberlist takes no
			// confirmations and a suspect is declared dead after the full
			// suspicion timeout, here minutes.
			tc.tune = func(c *memberlist.Config) {
				fastGossip(c)
				c.SuspicionMult = 1000
			}
			a := tc.start("a", "a100-pcie-4")
			tc.start("b", "a100-pcie-4")
			c := tc.start("c", "l40s-4")
			tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 4 })
			tc.gossip.Pause(c.cluster.g.LocalAddr())
			waitFor(t, "c suspect in a's view", 10e9, func() bool { return memberState(a, "c") == gossip.StateSuspect })
			ctx := context.Background()
			one := []api.Item{{Model: "L40S", Count: 1}}

			got, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: one})
			if err != nil || got.Node != "c" {
				t.Fatalf("claim only suspect c could hold, c's peer API answering: %+v, %v; want it on c", got, err)
			}

			tc.peers.Kill("c")
			_, err = a.Claim(ctx, "vm-2", api.ClaimRequest{GPUs: one})
			if e := apiErr(t, err); e.Code != api.CodeUnavailable || !strings.Contains(e.Message, "c could by its last summary") || !strings.Contains(e.Message, "suspect") {
				t.Fatalf("claim only suspect c could hold, c silent: %+v; want 503 naming c as suspect", e)
			}
			t.Logf("c silent: %s", err)
			_, err = a.Claim(ctx, "vm-3", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 5}}})
			if e := apiErr(t, err); e.Code != api.CodeNotAvailable {
				t.Fatalf("5 L40S, more than any server has: %+v; want not available", e)
			}
			if memberState(a, "c") != gossip.StateSuspect {
				t.Fatalf("c is %s in a's view by the end; the test needs it suspect throughout", memberState(a, "c"))
			}
		})
	}
}

// TestRefusalRefreshesTheCoordinatorsView: an owner that refuses what the
// coordinator's view said it could hold answers with its current capacity,
// and the coordinator's view takes it before the claim is answered, so the
// next claim through that coordinator does not rank it by the stale
// figures; no full-state exchange runs. Gossip from b to a is cut for the
// whole test and there is no periodic exchange and no probing: nothing but
// the answer can bring b's change to a. An answer without the capacity (an
// agent before it) has gossip fetch the owner's state instead.
func TestRefusalRefreshesTheCoordinatorsView(t *testing.T) {
	tc := newTestCluster(t)
	tc.tune = func(c *memberlist.Config) {
		fastGossip(c)
		c.ProbeInterval = time.Hour
		c.PushPullInterval = time.Hour
	}
	a := tc.start("a", "a100-pcie-4")
	b := tc.start("b", "l40s-4")
	tc.converge("b's L40S", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 4 })
	tc.gossip.Block(b.cluster.g.LocalAddr(), a.cluster.g.LocalAddr())
	ctx := context.Background()
	one := []api.Item{{Model: "L40S", Count: 1}}
	// b takes GPUs a does not hear of. The exchange a runs once after the
	// joins may still bring the first change: then the next one is missed.
	stale := false
	for i := 0; i < 3 && !stale; i++ {
		if _, err := b.Claim(ctx, fmt.Sprintf("vm-b%d", i), api.ClaimRequest{GPUs: one, PreferNode: "b", SameNode: true}); err != nil {
			t.Fatal(err)
		}
		stale = viewOf(a, "b", "NVIDIA L40S") == 4
	}
	if !stale {
		t.Fatal("a's view of b kept up with b although b's gossip to a is cut")
	}
	want := localFree(b, "NVIDIA L40S")
	before := a.cluster.g.Refreshes()
	_, err := a.Claim(ctx, "vm-a", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 4}}})
	if e := apiErr(t, err); e.Code != api.CodeNotAvailable {
		t.Fatalf("4 L40S with %d free on b: %+v; want not available", want, e)
	}
	if got := viewOf(a, "b", "NVIDIA L40S"); got != want {
		t.Fatalf("after b refused, a's view shows %d L40S free on b; b has %d", got, want)
	}
	if n := a.cluster.g.Refreshes() - before; n != 0 {
		t.Fatalf("b's refusal carried its capacity, yet a ran %d full-state exchanges with b", n)
	}

	// An owner's answer without its capacity: gossip fetches it.
	if _, err := b.Claim(ctx, "vm-b-last", api.ClaimRequest{GPUs: one, PreferNode: "b", SameNode: true}); err != nil {
		t.Fatal(err)
	}
	want = localFree(b, "NVIDIA L40S")
	agentView{a}.Refresh("b", nil)
	if n := a.cluster.g.Refreshes() - before; n != 1 {
		t.Fatalf("a refreshed its view of b %d times for an answer without capacity, want once", n)
	}
	took := waitFor(t, "a's view of b refreshed", 5*time.Second, func() bool { return viewOf(a, "b", "NVIDIA L40S") == want })
	t.Logf("a's view of b: %d free, %v after the refresh", want, took)
}
