package agent

import (
	"context"
	"strings"
	"testing"

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
			waitFor(t, "c suspect in a's view", 10e9, func() bool { return a.memberState("c") == gossip.StateSuspect })
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
			if a.memberState("c") != gossip.StateSuspect {
				t.Fatalf("c is %s in a's view by the end; the test needs it suspect throughout", a.memberState("c"))
			}
		})
	}
}
