package agent

import (
	"context"
	"fmt"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/placement"
)

// claimSameNode places a claim that must stay on one server: the one the
// caller names (prefer_node), or else the one the ID last ran on. When
// that server cannot hold the request, the answer is "not available" with
// what that server can hold instead: the platform's "Select an alternative
// GPU" for a VM that restarts where its disks are. With no server named
// and none remembered, the claim is placed like any other.
func (co *coordinator) claimSameNode(ctx context.Context, id string, req api.ClaimRequest) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, co.apiError(err)
	}
	at, err := co.validate(id, req)
	if err != nil {
		return api.Claim{}, err
	}
	node := req.PreferNode
	if node == "" {
		node = co.recallLastOwner(ctx, id, at.view)
	}
	if node == "" {
		return co.coordinate(ctx, id, req)
	}
	if _, err := co.Get(ctx, id); err == nil {
		// Held already (a retry, or never released): the usual answer.
		return co.coordinate(ctx, id, req)
	}
	t, ok := targetNamed(at.view, node)
	if !ok {
		return api.Claim{}, &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s must stay on %s, which this agent does not see now; retry, or claim without same_node", id, node)}
	}
	fresh := at.recheck(ctx, []target{t})
	if len(placement.Rank(fresh, at.want, "", nil)) == 0 {
		return api.Claim{}, co.refuseOn(id, node, at.rr.Items, fresh)
	}
	req.PreferNode = node
	c, err := co.coordinateOn(ctx, id, req, fresh)
	if err != nil || c.Node == node {
		return c, err
	}
	// node refused it after all (taken meanwhile) and it landed elsewhere:
	// undo that, it must not move.
	if other, ok := targetNamed(co.targets(), c.Node); ok {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ownerOpTimeout)
		_, rerr := other.owner.Abort(actx, id)
		cancel()
		if rerr != nil && !isCode(rerr, api.CodeNotFound) {
			return api.Claim{}, fmt.Errorf("claim %s must stay on %s but was placed on %s, and releasing it there failed (release it by hand): %w", id, node, c.Node, rerr)
		}
	}
	return api.Claim{}, co.refuseOn(id, node, at.rr.Items, at.recheck(ctx, []target{t}))
}

// withFresh replaces the view of the targets named in fresh.
func withFresh(targets []target, fresh []placement.Server) []target {
	for _, s := range fresh {
		for i := range targets {
			if targets[i].name == s.Name {
				targets[i].server = s
			}
		}
	}
	return targets
}

// refuseOn is "not available" for a claim that must stay on node, with the
// alternatives node can hold now.
func (co *coordinator) refuseOn(id, node string, items []api.Item, servers []placement.Server) error {
	err := co.refuse(items, servers)
	if e, ok := err.(*api.Error); ok {
		e.Message += fmt.Sprintf(" on %s, where claim %s must stay", node, id)
	}
	return err
}

// recallLastOwner asks the ID's home where the ID was last released.
func (co *coordinator) recallLastOwner(ctx context.Context, id string, targets []target) string {
	if co.cluster == nil {
		return "" // this server alone: nowhere else to go
	}
	home := homeOf(id, targets)
	dir, ok := home.owner.(api.Directory)
	if !ok {
		return ""
	}
	lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	ans, err := dir.LookupDirectory(lctx, id)
	if err != nil {
		return ""
	}
	return ans.LastOwner
}
