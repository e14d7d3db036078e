package agent

import (
	"cmp"
	"context"
	"slices"
	"sync"

	"github.com/gpuherd/gpuherd/agent/api"
)

// ListClaims is the coordinator's fan-out for a claim list: it asks every
// server of the platform for its claims, at once, and says which did not
// answer: a reachable server that failed or timed out, and a member that
// gossip knows but that was not asked (suspect,
// dead, or left: an agent stopped for maintenance leaves the cluster, and
// the claims in its ledger, with the VMs that use them, stay). A shorter
// list must never look complete.
func (co *coordinator) ListClaims(ctx context.Context) (api.ClaimList, error) {
	targets := co.targets()
	lists := make([][]api.Claim, len(targets))
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
			defer cancel()
			lists[i], errs[i] = t.owner.List(lctx)
		}()
	}
	wg.Wait()
	out := api.ClaimList{Claims: []api.Claim{}}
	asked := make(map[string]bool, len(targets))
	for i, t := range targets {
		asked[t.name] = true
		if errs[i] != nil {
			co.log.Warn("listing claims failed", "node", t.name, "err", errs[i])
			out.Unanswered = append(out.Unanswered, api.Unanswered{Node: t.name, Reason: errs[i].Error()})
			continue
		}
		out.Claims = append(out.Claims, lists[i]...)
	}
	members, _ := co.Members(ctx)
	for _, m := range members {
		if asked[m.Name] {
			continue
		}
		out.Unanswered = append(out.Unanswered, api.Unanswered{Node: m.Name, Reason: "not asked: gossip sees it " + m.State})
	}
	co.addLost(ctx, &out)
	out.Partial = len(out.Unanswered) > 0
	slices.SortFunc(out.Claims, func(x, y api.Claim) int {
		return cmp.Or(cmp.Compare(x.ID, y.ID), cmp.Compare(x.Node, y.Node))
	})
	slices.SortFunc(out.Unanswered, func(x, y api.Unanswered) int { return cmp.Compare(x.Node, y.Node) })
	return out, nil
}
