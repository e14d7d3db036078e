package agent

import (
	"context"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

// TestClaimListSaysWhoDidNotAnswer: with a server of the cluster stopped,
// the claim list is marked partial and names it, instead of being a
// shorter list that looks complete.
func TestClaimListSaysWhoDidNotAnswer(t *testing.T) {
	tc := newTestCluster(t)
	a, b := tc.start("a", "l40s-4"), tc.start("b", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return len(x.targets()) == 2 })
	ctx := context.Background()
	req := api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}}
	if _, err := a.Claim(ctx, "vm-a", api.ClaimRequest{GPUs: req.GPUs, PreferNode: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Claim(ctx, "vm-b", api.ClaimRequest{GPUs: req.GPUs, PreferNode: "b"}); err != nil {
		t.Fatal(err)
	}
	l, err := a.ListClaims(ctx)
	if err != nil || l.Partial || len(l.Unanswered) != 0 || len(l.Claims) != 2 {
		t.Fatalf("both up: %+v, %v; want both claims, not partial", l, err)
	}

	tc.stop("b")
	l, err = a.ListClaims(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !l.Partial || len(l.Unanswered) != 1 || l.Unanswered[0].Node != "b" || l.Unanswered[0].Reason == "" {
		t.Fatalf("b stopped: %+v; want partial, naming b with a reason", l)
	}
	if len(l.Claims) != 1 || l.Claims[0].ID != "vm-a" {
		t.Errorf("b stopped: claims %+v, want only vm-a", l.Claims)
	}
	t.Logf("b stopped: partial, %s: %s", l.Unanswered[0].Node, l.Unanswered[0].Reason)
}
