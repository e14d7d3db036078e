// Package groups is the node-group role: Kubernetes node groups. Every
// node of a group gets the same GPUs, all of a node's on one server
// (servers may differ between nodes); a group is created all or nothing.
// Node i's GPUs are the claim NAME.node-i, an ordinary claim placed by the
// claim coordinator. The group's record says whether it was created with
// GPUs: one created without can never get any, one created with must keep
// at least one. Under the name registry the record is the group name's
// registry record (registry.go), readable through any agent; a server
// running alone keeps it in a file (file.go). A node claim released
// directly leaves its group readable, with the node missing: repair places
// it again, resize and delete work as usual.
//
// A Groups gets what it uses through Deps: the coordinator, the view of the
// servers, the name authority, the catalog, a logger and a clock; never
// the agent.
package groups

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/placement"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// Groups creates, reads, repairs, resizes and deletes node groups: the
// group operations of api.Service, and the record files of api.Owner.
type Groups struct {
	node          string
	dir           string
	maxGPUs       int
	claims        Coordinator
	names         func() Names // returns nil while this server runs alone
	awaitFounding func(ctx context.Context)
	view          View
	catalog       Catalog
	log           *slog.Logger
	clk           clock.Clock
	onStep        func(group, node string)
}

// New builds the groups role from d.
func New(d Deps) *Groups {
	gs := &Groups{node: d.Node, dir: d.Dir, maxGPUs: d.MaxGPUsPerClaim, claims: d.Claims, names: d.Names,
		awaitFounding: d.AwaitFounding, view: d.View, catalog: d.Catalog, log: d.Log, clk: d.Clock, onStep: d.OnStep}
	if gs.names == nil {
		gs.names = func() Names { return nil }
	}
	if gs.awaitFounding == nil {
		gs.awaitFounding = func(context.Context) {}
	}
	if gs.log == nil {
		gs.log = slog.New(slog.DiscardHandler)
	}
	return gs
}

// groupLabel marks the claims of a group's nodes.
const groupLabel = "gpuherd.group"

// maxGroupNodes bounds a group; a larger fleet is several groups.
const maxGroupNodes = 256

// NodeClaimID is the claim ID of node i of group.
func NodeClaimID(group string, i int) string { return fmt.Sprintf("%s.node-%d", group, i) }

func validateGroupName(name string) error {
	if err := ledger.ValidateID(name); err != nil {
		return api.Invalid("name", "group name: %v", err)
	}
	if len(name) > 100 {
		return api.Invalid("name", "group name longer than 100 characters (its node claims add a suffix)")
	}
	return nil
}

// groupEntry is a group's record as its store keeps it.
type groupEntry struct {
	rec api.GroupRecord
	// gpus are the GPUs per node the group was created with; nil when the
	// store does not say (a record file).
	gpus []api.Item
	// nodes are the node claim IDs, node 0 first; none without GPUs.
	nodes []string
	// token is the registry's grant of the group name; 0 for a file.
	token uint64
	// index is the registry record's Index as read (fence.go).
	index uint64
	// where keeps the record file.
	where RecordKeeper
	// kubernetes: the nodes are KubeVirt VMs (api.GroupRequest.Kubernetes),
	// their claims published to Kubernetes.
	kubernetes bool
}

// nodeLabels are the labels of a group's node claims.
func (e groupEntry) nodeLabels() map[string]string {
	l := map[string]string{groupLabel: e.rec.Name}
	if e.kubernetes {
		l[api.LabelKubernetes] = "true"
	}
	return l
}

// kubernetesNodes reports whether a group's nodes are for Kubernetes, as
// the claims its nodes hold say: a repair or a resize places a missing
// node as its siblings are.
func kubernetesNodes(claims map[string]api.Claim) bool {
	for _, c := range claims {
		if _, ok := c.Labels[api.LabelKubernetes]; ok {
			return true
		}
	}
	return false
}

func legacyNodes(rec api.GroupRecord) []string {
	if !rec.WithGPUs {
		return nil
	}
	out := make([]string, rec.Nodes)
	for i := range out {
		out[i] = NodeClaimID(rec.Name, i)
	}
	return out
}

// readGroup reads a group's record from wherever it is kept.
func (gs *Groups) readGroup(ctx context.Context, name string) (groupEntry, error) {
	if gs.names() != nil {
		return gs.readGroupName(ctx, name)
	}
	rec, where, err := gs.findGroup(ctx, name)
	if err != nil {
		return groupEntry{}, err
	}
	return groupEntry{rec: rec, nodes: legacyNodes(rec), where: where}, nil
}

// forgetGroup drops a group's record; its node claims must be gone.
func (gs *Groups) forgetGroup(ctx context.Context, e groupEntry) error {
	if gs.names() != nil {
		return gs.releaseGroupName(ctx, e)
	}
	dctx, cancel := context.WithTimeout(ctx, ownerOpTimeout)
	defer cancel()
	if _, err := e.where.DeleteGroup(dctx, e.rec.Name); err != nil && !api.IsCode(err, api.CodeNotFound) {
		return err
	}
	return nil
}

// CreateGroup places every node's GPUs, each node on one server, all or
// nothing: when the nodes cannot all be placed, the nodes already placed
// are released, the group's name is let go, and the answer says which
// GPUs were not available, with what every node could have instead. Under
// the name registry a retry of the same request, through any agent,
// answers the group (placing the nodes it lacks); another request for the
// name is a conflict.
func (gs *Groups) CreateGroup(ctx context.Context, name string, req api.GroupRequest) (api.Group, error) {
	ctx, cancel := groupContext(ctx)
	defer cancel()
	if err := validateGroupName(name); err != nil {
		return api.Group{}, err
	}
	if req.Nodes < 1 || req.Nodes > maxGroupNodes {
		return api.Group{}, api.Invalid("nodes", "a group has between 1 and %d nodes, not %d", maxGroupNodes, req.Nodes)
	}
	var items []api.Item
	if len(req.GPUs) > 0 {
		lreq, err := gs.catalog.Resolve(api.ClaimRequest{GPUs: req.GPUs})
		if err != nil {
			return api.Group{}, err
		}
		if err := ledger.ValidateRequest(lreq, gs.maxGPUs); err != nil {
			return api.Group{}, invalid(err)
		}
		items = lreq.Items
	}
	rec := api.GroupRecord{Name: name, Nodes: req.Nodes, WithGPUs: len(items) > 0, Coordinator: gs.node}
	var (
		e   groupEntry
		err error
	)
	if gs.names() != nil {
		var retry bool
		e, retry, err = gs.acquireGroupName(ctx, rec, items)
		if err != nil {
			return api.Group{}, err
		}
		if retry {
			// The same request again (a client's retry, through any
			// agent): the group, with whatever nodes it lacks placed.
			return gs.repairGroup(ctx, e)
		}
	} else {
		rec.CreatedAt = gs.clk.Now().UTC()
		if e, err = gs.createGroupFile(ctx, rec); err != nil {
			return api.Group{}, err
		}
	}
	e.gpus = items
	e.kubernetes = req.Kubernetes
	g := api.Group{GroupRecord: e.rec, GPUs: items, Claims: []api.Claim{}}
	if !rec.WithGPUs {
		gs.log.Info("group created without GPUs", "group", name, "nodes", req.Nodes)
		return g, nil
	}
	claims, err := gs.placeGroupNodes(ctx, gs.fenceOf(e), e, e.nodes, items)
	if err != nil {
		if errors.As(err, new(*nodesKept)) {
			// Nodes stay placed (or the group is another operation's
			// now): the record stays, for group delete.
			return api.Group{}, err
		}
		if ferr := gs.forgetGroup(context.WithoutCancel(ctx), e); ferr != nil {
			gs.log.Error("a failed group's name could not be let go", "group", name, "err", ferr)
			return api.Group{}, api.Annotate(err, "%s; the group's name is still taken (%v): run group delete %s", ferr, name)
		}
		return api.Group{}, err
	}
	g.Claims = claims
	gs.log.Info("group created", "group", name, "nodes", req.Nodes, "gpus_per_node", api.DescribeItems(g.GPUs))
	return g, nil
}

// placeGroupNodes claims ids for group e, each with items, all or nothing:
// it first checks that the servers can hold every one of them at once (by
// this agent's view), then places them one after the other; when one
// cannot be placed it releases those it placed. The error is the node's,
// with the alternatives every node could have.
func (gs *Groups) placeGroupNodes(ctx context.Context, f *groupFence, e groupEntry, ids []string, items []api.Item) ([]api.Claim, error) {
	want := items
	servers := gs.view.Servers()
	if placement.Copies(servers, want) < len(ids) {
		return nil, gs.refuseGroup(e.rec.Name, items, len(ids), servers, nil)
	}
	var placed []api.Claim
	stop := func(err error) error {
		return &nodesKept{err: asAPIError(f.stopped(ctx, err, fmt.Sprintf("%d of %d nodes placed", len(placed), len(ids)), placed))}
	}
	for i, id := range ids {
		gs.groupStep(e.rec.Name, id)
		if err := f.check(ctx); err != nil {
			return nil, stop(err)
		}
		// any_node: a node of an earlier group of this name is remembered
		// where it ran, which must not pin the new group's nodes there.
		c, err := gs.claims.Claim(ctx, id, api.ClaimRequest{GPUs: items, Labels: e.nodeLabels(), AnyNode: true})
		if err == nil {
			placed = append(placed, c)
			continue
		}
		if ferr := f.check(ctx); ferr != nil {
			// Not this operation's group to roll back any more.
			return nil, stop(ferr)
		}
		gs.log.Warn("group nodes not placed; releasing those placed", "group", e.rec.Name, "node", id, "err", err)
		var kept []string
		for _, p := range placed {
			if _, rerr := gs.claims.Release(context.WithoutCancel(ctx), p.ID); rerr != nil && !api.IsCode(rerr, api.CodeNotFound) {
				gs.log.Error("releasing a node of a group that could not be placed", "group", e.rec.Name, "claim", p.ID, "err", rerr)
				kept = append(kept, fmt.Sprintf("%s on %s (%v)", p.ID, p.Node, rerr))
			}
		}
		if len(kept) > 0 {
			return nil, &nodesKept{err: &api.Error{Code: api.CodeUnavailable,
				Message: fmt.Sprintf("group %s: node %s could not be placed (%v), and these nodes placed before it could not be released: %v; run group delete %s", e.rec.Name, id, err, kept, e.rec.Name)}}
		}
		if api.IsCode(err, api.CodeNotAvailable) {
			return nil, gs.refuseGroup(e.rec.Name, items, len(ids), gs.view.Servers(), err)
		}
		var ae *api.Error
		if errors.As(err, &ae) {
			out := *ae
			out.Message = fmt.Sprintf("%s (node %d of %d of group %s; nothing was kept)", ae.Message, i+1, len(ids), e.rec.Name)
			return nil, &out
		}
		return nil, fmt.Errorf("group %s: node %s: %w; nothing was kept", e.rec.Name, id, err)
	}
	if err := f.check(ctx); err != nil {
		return nil, stop(err)
	}
	return placed, nil
}

// groupStep runs the test hook before a group operation changes a node.
func (gs *Groups) groupStep(group, node string) {
	if gs.onStep != nil {
		gs.onStep(group, node)
	}
}

// nodesKept is placeGroupNodes' failure when nodes it placed could not
// be released: the group's record must stay so that a delete finds them.
type nodesKept struct{ err *api.Error }

func (e *nodesKept) Error() string { return e.err.Error() }
func (e *nodesKept) Unwrap() error { return e.err }

// refuseGroup is the answer when nodes nodes of items cannot all be
// placed: not available, with the alternatives every node could have at
// once. cause, when set, is a node's own refusal, whose owners' reasons
// are kept.
func (gs *Groups) refuseGroup(name string, items []api.Item, nodes int, servers []placement.Server, cause error) *api.Error {
	e := &api.Error{Code: api.CodeNotAvailable,
		Message: fmt.Sprintf("%s (%d nodes of group %s, each on one server; nothing was kept)", api.NotAvailableMessage(items), nodes, name),
		Missing: items, Refusals: api.RefusalsOf(cause)}
	for _, alt := range placement.GroupAlternatives(servers, items, gs.catalog.ModelNames(), nodes) {
		e.Alternatives = append(e.Alternatives, api.Alternative{GPUs: slices.Clone(alt.Items), Servers: alt.Servers})
	}
	return e
}

// groupState is a group read whole: its record, and each node's claim
// (absent: the node claim is missing).
type groupState struct {
	e      groupEntry
	claims map[string]api.Claim
}

// view is the group as the API shows it.
func (s groupState) view() api.Group {
	g := api.Group{GroupRecord: s.e.rec, GPUs: s.e.gpus, Claims: []api.Claim{}}
	for _, id := range s.e.nodes {
		if c, ok := s.claims[id]; ok {
			g.Claims = append(g.Claims, c)
			if len(g.Claims) == 1 {
				g.GPUs = c.Items
			}
		} else {
			g.Missing = append(g.Missing, id)
		}
	}
	return g
}

// readGroupState reads a group and the claim of each of its nodes; a node
// claim that no server holds is missing, a node whose server does not
// answer makes the read fail (a retryable unavailable naming it).
func (gs *Groups) readGroupState(ctx context.Context, name string) (groupState, error) {
	if err := validateGroupName(name); err != nil {
		return groupState{}, err
	}
	e, err := gs.readGroup(ctx, name)
	if err != nil {
		return groupState{}, err
	}
	return gs.readNodes(ctx, e)
}

// readNodes reads the claim of each node of group e.
func (gs *Groups) readNodes(ctx context.Context, e groupEntry) (groupState, error) {
	name := e.rec.Name
	s := groupState{e: e, claims: map[string]api.Claim{}}
	for _, id := range e.nodes {
		c, err := gs.claims.Get(ctx, id)
		switch {
		case err == nil:
			s.claims[id] = c
		case api.IsCode(err, api.CodeNotFound):
		default:
			return groupState{}, api.Annotate(err, "group %[2]s: node claim %[3]s: %[1]s", name, id)
		}
	}
	return s, nil
}

// GetGroup returns a group and its nodes' claims; Missing lists the node
// claims no server holds (released directly): group repair places them.
func (gs *Groups) GetGroup(ctx context.Context, name string) (api.Group, error) {
	s, err := gs.readGroupState(ctx, name)
	if err != nil {
		return api.Group{}, err
	}
	return s.view(), nil
}

// RepairGroup places again the node claims of a group that no server
// holds, with the GPUs of its other nodes, all or nothing.
func (gs *Groups) RepairGroup(ctx context.Context, name string) (api.Group, error) {
	ctx, cancel := groupContext(ctx)
	defer cancel()
	if err := validateGroupName(name); err != nil {
		return api.Group{}, err
	}
	e, err := gs.readGroup(ctx, name)
	if err != nil {
		return api.Group{}, err
	}
	return gs.repairGroup(ctx, e)
}

func (gs *Groups) repairGroup(ctx context.Context, e groupEntry) (api.Group, error) {
	fresh, f, err := gs.beginGroupOp(ctx, e)
	if err != nil {
		return api.Group{}, err
	}
	fresh.kubernetes = fresh.kubernetes || e.kubernetes
	s, err := gs.readNodes(ctx, fresh)
	if err != nil {
		return api.Group{}, err
	}
	g := s.view()
	if len(g.Missing) == 0 {
		return g, nil
	}
	if len(g.GPUs) == 0 {
		return api.Group{}, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("group %s: no node holds GPUs and its record does not say which it had; give it GPUs with group resize %s --gpu MODEL[:COUNT]", e.rec.Name, e.rec.Name)}
	}
	s.e.kubernetes = s.e.kubernetes || e.kubernetes || kubernetesNodes(s.claims)
	if _, err := gs.placeGroupNodes(ctx, f, s.e, g.Missing, g.GPUs); err != nil {
		return api.Group{}, err
	}
	gs.log.Info("group repaired", "group", e.rec.Name, "placed", g.Missing)
	return gs.GetGroup(ctx, e.rec.Name)
}

// DeleteGroupClaims releases every node's claim and forgets the group; its
// name is free again. Nodes released before are skipped. When a node
// cannot be released the group stays, so that a retry finds it.
func (gs *Groups) DeleteGroupClaims(ctx context.Context, name string) (api.Group, error) {
	ctx, cancel := groupContext(ctx)
	defer cancel()
	// Stamped first: an older operation on the group still running
	// (its client gave up) stops at its next node, and releases what it
	// placed once it finds the group gone.
	s, _, err := gs.startGroupOp(ctx, name)
	if err != nil {
		return api.Group{}, err
	}
	g := s.view()
	for _, c := range g.Claims {
		if _, err := gs.claims.Release(ctx, c.ID); err != nil && !api.IsCode(err, api.CodeNotFound) {
			return api.Group{}, api.Annotate(err, "group %[2]s: releasing %[3]s: %[1]s; the group stays: run group delete again", name, c.ID)
		}
	}
	if err := gs.forgetGroup(ctx, s.e); err != nil {
		return api.Group{}, err
	}
	gs.log.Info("group deleted", "group", name)
	return g, nil
}

const (
	// groupOpTimeout bounds a group operation once begun: every node's
	// claim, move or release, one after the other.
	groupOpTimeout = 5 * time.Minute
	// lookupTimeout and ownerOpTimeout bound one call to a server's record
	// file, as the coordinator's calls to owners are bounded.
	lookupTimeout  = 2 * time.Second
	ownerOpTimeout = 5 * time.Second
)

// groupContext detaches a group operation from its client: a client that
// gives up (a timeout, a dropped connection) must not stop a create,
// resize or delete half-way, which would leave some nodes changed and
// others not. It runs to completion, or to its own rollback, under the
// agent's deadline.
func groupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), groupOpTimeout)
}
