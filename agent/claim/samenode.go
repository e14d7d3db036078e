package claim

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/placement"
)

// claimWhere places a claim where it may go. A claim with same_node and a
// server named (prefer_node) goes there or nowhere. A claim of an ID
// remembered on a server (released there within remember_released) with
// no server named goes back there or nowhere, unless any_node lets it
// move: the coordinator's placement finds the memory at the ID's home and
// answers a *goBack when it did not commit there, and the claim is then
// placed on that server alone.
func (co *Coordinator) claimWhere(ctx context.Context, id string, req api.ClaimRequest) (api.Claim, error) {
	if req.SameNode && req.AnyNode {
		return api.Claim{}, api.Invalid("any_node", "same_node keeps the claim on one server and any_node lets it move: give one of them")
	}
	if req.SameNode && req.PreferNode != "" {
		return co.ClaimOn(ctx, id, req, req.PreferNode, false)
	}
	c, err := co.coordinate(ctx, id, req)
	var gb *goBack
	if errors.As(err, &gb) {
		co.log.Info("claim goes back to the server it last ran on", "claim", id, "node", gb.node)
		return co.ClaimOn(ctx, id, req, gb.node, true)
	}
	return c, err
}

// ClaimOn places a claim that must stay on node: the server the caller
// named, or (remembered) the one the ID last ran on. Node's capacity is
// read fresh first; when it cannot hold the request, the answer is "not
// available" with what node can hold instead: the platform's "Select an
// alternative GPU" for a VM that restarts where its disks are.
func (co *Coordinator) ClaimOn(ctx context.Context, id string, req api.ClaimRequest, node string, remembered bool) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, co.apiError(err)
	}
	at, err := co.validate(id, req)
	if err != nil {
		return api.Claim{}, err
	}
	req.PreferNode = node
	req.SameNode = false
	if _, err := co.Get(ctx, id); err == nil {
		// Held already (a retry, or never released): the usual answer.
		return co.coordinate(ctx, id, req)
	}
	why := fmt.Sprintf("where claim %s must stay", id)
	if remembered {
		why = fmt.Sprintf("the server claim %s last ran on", id)
	}
	t, ok := targetNamed(at.view, node)
	if !ok {
		if remembered {
			// The server it last ran on is gone from this agent's view
			// (down, cut off, removed): the VM cannot restart there, so
			// it goes wherever it fits, with a warning, rather than
			// answer "retry" until the server is back or the memory ends.
			req.PreferNode, req.AnyNode = "", true
			return co.coordinate(ctx, id, req)
		}
		return api.Claim{}, &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s must stay on %s, which this agent does not see now; retry, or claim without same_node", id, node)}
	}
	refuse := func(fresh []placement.Server) error {
		err := co.refuse(at.rr.Items, fresh)
		if e, ok := err.(*api.Error); ok {
			e.Message += " on " + node + ", " + why
			if remembered {
				e.Message += "; claim it with --any-node (any_node) to place it on another server"
			}
		}
		return err
	}
	fresh := at.recheck(ctx, []Target{t})
	if len(placement.Rank(fresh, at.want, "", nil)) == 0 {
		return api.Claim{}, refuse(fresh)
	}
	c, err := co.coordinateOn(ctx, id, req, fresh, true)
	if err != nil || c.Node == node {
		return c, err
	}
	// Placed nowhere else by this call (it stays on node or nowhere): the
	// ID was claimed meanwhile on c.Node, by a concurrent request (a client
	// that retried through another agent). That claim is not this call's
	// to undo.
	return api.Claim{}, &api.Error{Code: api.CodeConflict, Node: c.Node,
		Message: fmt.Sprintf("claim %s must stay on %s, %s, but a concurrent request placed it on %s meanwhile; release it there first (gpuherd release %s), or use it where it is", id, node, why, c.Node, id)}
}

// withFresh replaces the view of the targets named in fresh.
func withFresh(targets []Target, fresh []placement.Server) []Target {
	for _, s := range fresh {
		for i := range targets {
			if targets[i].name == s.Name {
				targets[i].server = s
			}
		}
	}
	return targets
}
