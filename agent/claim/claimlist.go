package claim

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sync"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/names"
)

// ListClaims is the coordinator's fan-out for a claim list: it asks every
// server of the platform for its claims, at once, and says which did not
// answer: a reachable server that failed or timed out, a member that
// gossip knows but that was not asked (suspect,
// dead, or left: an agent stopped for maintenance leaves the cluster, and
// the claims in its ledger, with the VMs that use them, stay), a server
// this agent saw before that its gossip does not list now, and a server
// the name registry records claims on that this agent did not ask. A
// shorter list must never look complete (docs/protocol.md, "Complete
// listings").
func (co *Coordinator) ListClaims(ctx context.Context) (api.ClaimList, error) {
	targets := co.servers.Targets()
	lists := make([][]api.Claim, len(targets))
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lctx, cancel := context.WithTimeout(ctx, api.LookupTimeout)
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
	members, _ := co.servers.Members(ctx)
	unknown := map[string]bool{}
	for _, m := range members {
		if asked[m.Name] {
			continue
		}
		asked[m.Name] = true
		reason := "not asked: gossip sees it " + m.State
		if m.State == api.MemberUnknown {
			reason, unknown[m.Name] = api.UnseenReason, true
		}
		out.Unanswered = append(out.Unanswered, api.Unanswered{Node: m.Name, Reason: reason})
	}
	if co.servers.Clustered() && !co.servers.Joined() {
		out.Unanswered = append(out.Unanswered, api.Unanswered{Node: api.NotJoinedNode, Reason: "gossip has not joined the cluster yet: no seed has answered"})
	}
	co.addOwners(ctx, &out, asked, unknown)
	co.addLost(ctx, &out)
	out.Partial = len(out.Unanswered) > 0
	slices.SortFunc(out.Claims, func(x, y api.Claim) int {
		return cmp.Or(cmp.Compare(x.ID, y.ID), cmp.Compare(x.Node, y.Node))
	})
	slices.SortFunc(out.Unanswered, func(x, y api.Unanswered) int { return cmp.Compare(x.Node, y.Node) })
	return out, nil
}

// addOwners judges the list against the name registry, which records the
// server of every claim ID: an owner of a held or pending claim that was
// not asked makes the list partial, whatever this agent's gossip knows of
// it (restarted while that server was cut off, an agent never hears of
// it). When the registry answered in full, a server only the known list
// names (unknown) that holds nothing there is no gap in a claim list: it
// holds no claims. A registry that does not answer leaves the known list
// as the judge.
func (co *Coordinator) addOwners(ctx context.Context, out *api.ClaimList, asked, unknown map[string]bool) {
	if co.names() == nil {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, api.LookupTimeout)
	defer cancel()
	listing, err := co.names().List(lctx, names.Filter{Kind: names.KindClaim}, names.Linearizable)
	if err != nil {
		co.log.Warn("listing claim owners in the name registry failed; the list is judged against gossip and the servers this agent has seen", "err", err)
		return
	}
	owners := map[string]bool{}
	for _, r := range listing.Records {
		if r.State == names.StateLost || r.Owner == "" {
			continue
		}
		owners[r.Owner] = true
	}
	for _, o := range slices.Sorted(maps.Keys(owners)) {
		if asked[o] {
			continue
		}
		asked[o] = true
		out.Unanswered = append(out.Unanswered, api.Unanswered{Node: o, Reason: "not asked: the name registry records claims held on it, and this agent's gossip does not list it (cut off, or not heard of since this agent started); its claims are missing"})
	}
	if listing.Truncated {
		return
	}
	out.Unanswered = slices.DeleteFunc(out.Unanswered, func(u api.Unanswered) bool { return unknown[u.Node] && !owners[u.Node] })
}
