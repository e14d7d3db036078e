package groups

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/placement"
)

// ResizeGroup gives every node of a group the new GPUs, all or nothing. A
// group created without GPUs never gets one, and one with GPUs keeps at
// least one. Before it touches a node it checks, on the capacity the
// servers report now, that every node can get the new GPUs at once;
// otherwise the answer is not available with what every node could have
// instead, and nothing changed. Nodes missing (released directly) are
// placed with the new GPUs. When a node fails all the same (a server
// changed meanwhile), every node already changed is put back and then
// read again: the answer says that every node is as it was, or names,
// loudly, each node that is not.
func (gs *Groups) ResizeGroup(ctx context.Context, name string, req api.ResizeRequest) (api.Group, error) {
	ctx, cancel := groupContext(ctx)
	defer cancel()
	// Stamped before the nodes are read: an older operation on the group
	// still running stops at its next node (fence.go).
	s, f, err := gs.startGroupOp(ctx, name)
	if err != nil {
		return api.Group{}, err
	}
	if !s.e.rec.WithGPUs {
		return api.Group{}, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("group %s was created without GPUs and can never get one; create a new group with GPUs", name)}
	}
	if len(req.GPUs) == 0 {
		return api.Group{}, api.Invalid("gpus", "group %s has GPUs and must keep at least one per node", name)
	}
	lreq, err := gs.catalog.Resolve(api.ClaimRequest{GPUs: req.GPUs})
	if err != nil {
		return api.Group{}, err
	}
	items := lreq.Items
	if err := gs.groupFits(ctx, s, items); err != nil {
		return api.Group{}, err
	}
	var done []groupStep
	for i, id := range s.e.nodes {
		before, held := s.claims[id]
		if !held || !api.SameItems(before.Items, items) {
			gs.groupStep(name, id)
			if err := f.check(ctx); err != nil {
				return api.Group{}, gs.resizeStopped(ctx, f, s, items, done, err, id, fmt.Sprintf("%d of %d nodes resized", i, len(s.e.nodes)))
			}
		}
		var err error
		switch {
		case !held:
			e := s.e
			e.kubernetes = kubernetesNodes(s.claims)
			_, err = gs.claims.Claim(ctx, id, api.ClaimRequest{GPUs: items, Labels: e.nodeLabels(), AnyNode: true})
		case api.SameItems(before.Items, items):
			continue
		default:
			_, err = gs.claims.Resize(ctx, id, api.ResizeRequest{GPUs: items}, "")
		}
		if err != nil {
			return api.Group{}, gs.restoreGroup(ctx, f, s, items, done, id, err)
		}
		done = append(done, groupStep{id: id, before: before, held: held})
	}
	if err := f.check(ctx); err != nil {
		return api.Group{}, gs.resizeStopped(ctx, f, s, items, done, err, "the group's record", "every node resized")
	}
	gs.noteGroupGPUs(ctx, s.e, items)
	if len(done) > 0 {
		gs.log.Info("group resized", "group", name, "gpus_per_node", api.DescribeItems(items), "nodes_changed", len(done))
	}
	return gs.GetGroup(ctx, name)
}

// groupStep is one node a group resize changed: its claim before (none
// when it was missing).
type groupStep struct {
	id     string
	before api.Claim
	held   bool
}

// groupFits checks, before a group resize touches any node, that every
// node can get items at once: on the free GPUs the servers report now,
// counting each node's own GPUs as free on its server (it lets them go as
// it changes).
func (gs *Groups) groupFits(ctx context.Context, s groupState, items []api.Item) error {
	want := items
	servers := gs.view.ServersNow(ctx, want)
	for i := range servers {
		free := make(map[string]int, len(servers[i].Free))
		for m, n := range servers[i].Free {
			free[m] = n
		}
		for _, c := range s.claims {
			if c.Node == servers[i].Name {
				for _, it := range c.Items {
					free[it.Model] += it.Count
				}
			}
		}
		servers[i].Free = free
	}
	if placement.Copies(servers, want) >= len(s.e.nodes) {
		return nil
	}
	return gs.refuseGroup(s.e.rec.Name, items, len(s.e.nodes), servers, nil)
}

// restoreGroup puts back every node a failed group resize to items
// changed (done), newest first, then reads every node again and compares
// it with what it was. failed is the node that could not be resized,
// cause why.
func (gs *Groups) restoreGroup(ctx context.Context, f *groupFence, s groupState, items []api.Item, done []groupStep, failed string, cause error) error {
	name := s.e.rec.Name
	rctx := context.WithoutCancel(ctx)
	for i := len(done) - 1; i >= 0; i-- {
		st := done[i]
		if err := f.check(rctx); errors.As(err, new(*groupOvertaken)) {
			// Not this operation's group to put back any more. (A
			// registry that does not answer the check does not stop the
			// putting back: each step then fails or not on its own, and
			// the nodes are compared below.)
			gs.log.Warn("group resize failed, and another operation took the group over before its nodes were put back", "group", name, "node", failed, "err", cause)
			return f.stopped(rctx, err, fmt.Sprintf("node %s could not be resized (%v), %d nodes not put back", failed, cause, i+1), nil)
		}
		var err error
		if !st.held {
			_, err = gs.claims.Release(rctx, st.id)
			if api.IsCode(err, api.CodeNotFound) {
				err = nil
			}
		} else {
			_, err = gs.claims.Resize(rctx, st.id, api.ResizeRequest{GPUs: st.before.Items}, st.before.Node)
		}
		if err != nil {
			gs.log.Error("putting back a node of a failed group resize", "group", name, "claim", st.id, "err", err)
		}
	}
	now := map[string]api.Claim{}
	unread := map[string]error{}
	for _, id := range s.e.nodes {
		c, err := gs.claims.Get(rctx, id)
		switch {
		case err == nil:
			now[id] = c
		case !api.IsCode(err, api.CodeNotFound):
			unread[id] = err
		}
	}
	off := nodesOff(s.e.nodes, s.claims, now, unread)
	if len(off) == 0 {
		gs.log.Warn("group resize failed; every node is as it was", "group", name, "node", failed, "err", cause)
		if api.IsCode(cause, api.CodeNotAvailable) {
			e := gs.refuseGroup(name, items, len(s.e.nodes), gs.view.Servers(), cause)
			e.Message += fmt.Sprintf("; node %s could not follow, every node is as it was", failed)
			return e
		}
		return api.Annotate(cause, "group %[2]s: node %[3]s could not be resized (%[1]s); every node is as it was", name, failed)
	}
	gs.log.Error("group resize failed and left nodes changed", "group", name, "node", failed, "cause", cause, "changed", off)
	return &api.Error{Code: api.CodeInternal,
		Message: fmt.Sprintf("group %s: node %s could not be resized (%v), and these nodes are not as they were: %v; see group get %s, then resize the group again", name, failed, cause, off, name)}
}

// resizeStopped answers a resize that found, between two nodes, that it
// may not go on (err, from the fence). Overtaken by a newer operation, it
// leaves every node as it is, for that operation; stopped for any other
// reason (the registry did not answer), it puts back the nodes it changed,
// as for a node that failed.
func (gs *Groups) resizeStopped(ctx context.Context, f *groupFence, s groupState, items []api.Item, done []groupStep, err error, next, progress string) error {
	if errors.As(err, new(*groupOvertaken)) {
		return f.stopped(ctx, err, progress, nil)
	}
	return gs.restoreGroup(ctx, f, s, items, done, next, err)
}

// nodesOff compares each node claim now with before (absent: no server
// holds it) and describes those that differ in server or GPUs, or could
// not be read.
func nodesOff(ids []string, before, now map[string]api.Claim, unread map[string]error) []string {
	var off []string
	for _, id := range ids {
		b, had := before[id]
		n, has := now[id]
		switch {
		case unread[id] != nil:
			off = append(off, fmt.Sprintf("%s could not be read (%v)", id, unread[id]))
		case had && !has:
			off = append(off, fmt.Sprintf("%s had %s on %s and is released", id, api.DescribeItems(b.Items), b.Node))
		case !had && has:
			off = append(off, fmt.Sprintf("%s was missing and holds %s on %s", id, api.DescribeItems(n.Items), n.Node))
		case had && (b.Node != n.Node || !api.SameItems(b.Items, n.Items)):
			off = append(off, fmt.Sprintf("%s had %s on %s and has %s on %s", id, api.DescribeItems(b.Items), b.Node, api.DescribeItems(n.Items), n.Node))
		}
	}
	return off
}
