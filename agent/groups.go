package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/internal/atomicfile"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/placement"
)

// Kubernetes node groups. Every node of a group gets the same GPUs, all of
// a node's on one server (servers may differ between nodes); a group is
// created all or nothing. Node i's GPUs are the claim NAME.node-i, an
// ordinary claim. The group's record says whether it was created with
// GPUs: one created without can never get any, one created with must keep
// at least one. Under the name registry the record is the group name's
// registry record (groups_registry.go), readable through any agent; a
// server running alone keeps it in a file (below). A node claim released
// directly leaves its group readable, with the node missing: repair places
// it again, resize and delete work as usual.

const groupsDir = "groups"

// groupLabel marks the claims of a group's nodes.
const groupLabel = "gpuherd.group"

// maxGroupNodes bounds a group; a larger fleet is several groups.
const maxGroupNodes = 256

func nodeClaimID(group string, i int) string { return fmt.Sprintf("%s.node-%d", group, i) }

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
	// index is the registry record's Index as read (groups_fence.go).
	index uint64
	// where keeps the record file.
	where target
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
		out[i] = nodeClaimID(rec.Name, i)
	}
	return out
}

// readGroup reads a group's record from wherever it is kept.
func (a *Agent) readGroup(ctx context.Context, name string) (groupEntry, error) {
	if a.names != nil {
		return a.readGroupName(ctx, name)
	}
	rec, where, err := a.findGroup(ctx, name)
	if err != nil {
		return groupEntry{}, err
	}
	return groupEntry{rec: rec, nodes: legacyNodes(rec), where: where}, nil
}

// forgetGroup drops a group's record; its node claims must be gone.
func (a *Agent) forgetGroup(ctx context.Context, e groupEntry) error {
	if a.names != nil {
		return a.releaseGroupName(ctx, e)
	}
	dctx, cancel := context.WithTimeout(ctx, ownerOpTimeout)
	defer cancel()
	if _, err := e.where.owner.DeleteGroup(dctx, e.rec.Name); err != nil && !isCode(err, api.CodeNotFound) {
		return err
	}
	return nil
}

func (a *Agent) groupPath(name string) string {
	return filepath.Join(a.cfg.DataDir, groupsDir, name+".json")
}

// LookupGroup returns a group record this server keeps in a file.
func (a *Agent) LookupGroup(_ context.Context, name string) (api.GroupRecord, error) {
	if err := validateGroupName(name); err != nil {
		return api.GroupRecord{}, err
	}
	data, err := os.ReadFile(a.groupPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return api.GroupRecord{}, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("group %s not found on %s", name, a.cfg.NodeName)}
	}
	if err != nil {
		return api.GroupRecord{}, err
	}
	var rec api.GroupRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return api.GroupRecord{}, fmt.Errorf("group record %s is corrupt: %w", a.groupPath(name), err)
	}
	return rec, nil
}

// DeleteGroup forgets a group record this server keeps in a file.
func (a *Agent) DeleteGroup(ctx context.Context, name string) (api.GroupRecord, error) {
	rec, err := a.LookupGroup(ctx, name)
	if err != nil {
		return rec, err
	}
	return rec, os.Remove(a.groupPath(name))
}

// findGroup looks for a group's record file on every server of the view.
func (a *Agent) findGroup(ctx context.Context, name string) (api.GroupRecord, target, error) {
	targets := a.targets()
	var (
		mu    sync.Mutex
		found *api.GroupRecord
		where target
		wg    sync.WaitGroup
	)
	for _, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
			defer cancel()
			rec, err := t.owner.LookupGroup(lctx, name)
			if err != nil {
				return
			}
			mu.Lock()
			found, where = &rec, t
			mu.Unlock()
		}()
	}
	wg.Wait()
	if found == nil {
		return api.GroupRecord{}, target{}, &api.Error{Code: api.CodeNotFound,
			Message: fmt.Sprintf("group %s not found on any server", name)}
	}
	return *found, where, nil
}

// createGroupFile writes the record file of a new group on this server.
func (a *Agent) createGroupFile(ctx context.Context, rec api.GroupRecord) (groupEntry, error) {
	if _, _, err := a.findGroup(ctx, rec.Name); err == nil {
		return groupEntry{}, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("group %s already exists; delete it first or choose another name", rec.Name)}
	}
	if err := os.MkdirAll(filepath.Join(a.cfg.DataDir, groupsDir), 0o700); err != nil {
		return groupEntry{}, err
	}
	data, _ := json.Marshal(rec)
	if err := atomicfile.Write(a.groupPath(rec.Name), data, 0o600); err != nil {
		return groupEntry{}, fmt.Errorf("writing group record: %w", err)
	}
	self, _ := targetNamed(a.targets(), a.cfg.NodeName)
	return groupEntry{rec: rec, nodes: legacyNodes(rec), where: self}, nil
}

// CreateGroup places every node's GPUs, each node on one server, all or
// nothing: when the nodes cannot all be placed, the nodes already placed
// are released, the group's name is let go, and the answer says which
// GPUs were not available, with what every node could have instead. Under
// the name registry a retry of the same request, through any agent,
// answers the group (placing the nodes it lacks); another request for the
// name is a conflict.
func (a *Agent) CreateGroup(ctx context.Context, name string, req api.GroupRequest) (api.Group, error) {
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
		lreq, err := a.resolve(api.ClaimRequest{GPUs: req.GPUs})
		if err != nil {
			return api.Group{}, err
		}
		if err := ledger.ValidateRequest(lreq, a.cfg.MaxGPUsPerClaim); err != nil {
			return api.Group{}, a.apiError(err)
		}
		items = apiItems(lreq.Items)
	}
	rec := api.GroupRecord{Name: name, Nodes: req.Nodes, WithGPUs: len(items) > 0, Coordinator: a.cfg.NodeName}
	var (
		e   groupEntry
		err error
	)
	if a.names != nil {
		var retry bool
		e, retry, err = a.acquireGroupName(ctx, rec, items)
		if err != nil {
			return api.Group{}, err
		}
		if retry {
			// The same request again (a client's retry, through any
			// agent): the group, with whatever nodes it lacks placed.
			return a.repairGroup(ctx, e)
		}
	} else {
		rec.CreatedAt = a.clk.Now().UTC()
		if e, err = a.createGroupFile(ctx, rec); err != nil {
			return api.Group{}, err
		}
	}
	e.gpus = items
	e.kubernetes = req.Kubernetes
	g := api.Group{GroupRecord: e.rec, GPUs: items, Claims: []api.Claim{}}
	if !rec.WithGPUs {
		a.log.Info("group created without GPUs", "group", name, "nodes", req.Nodes)
		return g, nil
	}
	claims, err := a.placeGroupNodes(ctx, a.fenceOf(e), e, e.nodes, items)
	if err != nil {
		if errors.As(err, new(*nodesKept)) {
			// Nodes stay placed (or the group is another operation's
			// now): the record stays, for group delete.
			return api.Group{}, err
		}
		if ferr := a.forgetGroup(context.WithoutCancel(ctx), e); ferr != nil {
			a.log.Error("a failed group's name could not be let go", "group", name, "err", ferr)
			return api.Group{}, annotate(err, "%s; the group's name is still taken (%v): run group delete %s", ferr, name)
		}
		return api.Group{}, err
	}
	g.Claims = claims
	a.log.Info("group created", "group", name, "nodes", req.Nodes, "gpus_per_node", api.DescribeItems(g.GPUs))
	return g, nil
}

// placeGroupNodes claims ids for group e, each with items, all or nothing:
// it first checks that the servers can hold every one of them at once (by
// this agent's view), then places them one after the other; when one
// cannot be placed it releases those it placed. The error is the node's,
// with the alternatives every node could have.
func (a *Agent) placeGroupNodes(ctx context.Context, f *groupFence, e groupEntry, ids []string, items []api.Item) ([]api.Claim, error) {
	want := itemWants(items)
	servers := serversOf(a.targets())
	if placement.Copies(servers, want) < len(ids) {
		return nil, a.refuseGroup(e.rec.Name, items, len(ids), servers, nil)
	}
	var placed []api.Claim
	stop := func(err error) error {
		return &nodesKept{err: asAPIError(f.stopped(ctx, err, fmt.Sprintf("%d of %d nodes placed", len(placed), len(ids)), placed))}
	}
	for i, id := range ids {
		a.groupStep(e.rec.Name, id)
		if err := f.check(ctx); err != nil {
			return nil, stop(err)
		}
		// any_node: a node of an earlier group of this name is remembered
		// where it ran, which must not pin the new group's nodes there.
		c, err := a.Claim(ctx, id, api.ClaimRequest{GPUs: items, Labels: e.nodeLabels(), AnyNode: true})
		if err == nil {
			placed = append(placed, c)
			continue
		}
		if ferr := f.check(ctx); ferr != nil {
			// Not this operation's group to roll back any more.
			return nil, stop(ferr)
		}
		a.log.Warn("group nodes not placed; releasing those placed", "group", e.rec.Name, "node", id, "err", err)
		var kept []string
		for _, p := range placed {
			if _, rerr := a.Release(context.WithoutCancel(ctx), p.ID); rerr != nil && !isCode(rerr, api.CodeNotFound) {
				a.log.Error("releasing a node of a group that could not be placed", "group", e.rec.Name, "claim", p.ID, "err", rerr)
				kept = append(kept, fmt.Sprintf("%s on %s (%v)", p.ID, p.Node, rerr))
			}
		}
		if len(kept) > 0 {
			return nil, &nodesKept{err: &api.Error{Code: api.CodeUnavailable,
				Message: fmt.Sprintf("group %s: node %s could not be placed (%v), and these nodes placed before it could not be released: %v; run group delete %s", e.rec.Name, id, err, kept, e.rec.Name)}}
		}
		if isCode(err, api.CodeNotAvailable) {
			return nil, a.refuseGroup(e.rec.Name, items, len(ids), serversOf(a.targets()), err)
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

// asAPIError is err as the *api.Error it carries, or an internal one.
func asAPIError(err error) *api.Error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae
	}
	return &api.Error{Code: api.CodeInternal, Message: err.Error()}
}

// groupStep runs the test hook before a group operation changes a node.
func (a *Agent) groupStep(group, node string) {
	if a.onGroupStep != nil {
		a.onGroupStep(group, node)
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
func (a *Agent) refuseGroup(name string, items []api.Item, nodes int, servers []placement.Server, cause error) *api.Error {
	e := &api.Error{Code: api.CodeNotAvailable,
		Message: fmt.Sprintf("%s (%d nodes of group %s, each on one server; nothing was kept)", api.NotAvailableMessage(items), nodes, name),
		Missing: items, Refusals: refusalsOf(cause)}
	for _, alt := range placement.GroupAlternatives(servers, itemWants(items), a.modelNames(), nodes) {
		var g []api.Item
		for _, w := range alt.Items {
			g = append(g, api.Item{Model: w.Model, Count: w.Count})
		}
		e.Alternatives = append(e.Alternatives, api.Alternative{GPUs: g, Servers: alt.Servers})
	}
	return e
}

func itemWants(items []api.Item) []placement.Want {
	out := make([]placement.Want, len(items))
	for i, it := range items {
		out[i] = placement.Want{Model: it.Model, Count: it.Count}
	}
	return out
}

func serversOf(targets []target) []placement.Server {
	out := make([]placement.Server, len(targets))
	for i, t := range targets {
		out[i] = t.server
	}
	return out
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
func (a *Agent) readGroupState(ctx context.Context, name string) (groupState, error) {
	if err := validateGroupName(name); err != nil {
		return groupState{}, err
	}
	e, err := a.readGroup(ctx, name)
	if err != nil {
		return groupState{}, err
	}
	return a.readNodes(ctx, e)
}

// readNodes reads the claim of each node of group e.
func (a *Agent) readNodes(ctx context.Context, e groupEntry) (groupState, error) {
	name := e.rec.Name
	s := groupState{e: e, claims: map[string]api.Claim{}}
	for _, id := range e.nodes {
		c, err := a.Get(ctx, id)
		switch {
		case err == nil:
			s.claims[id] = c
		case isCode(err, api.CodeNotFound):
		default:
			return groupState{}, annotate(err, "group %[2]s: node claim %[3]s: %[1]s", name, id)
		}
	}
	return s, nil
}

// GetGroup returns a group and its nodes' claims; Missing lists the node
// claims no server holds (released directly): group repair places them.
func (a *Agent) GetGroup(ctx context.Context, name string) (api.Group, error) {
	s, err := a.readGroupState(ctx, name)
	if err != nil {
		return api.Group{}, err
	}
	return s.view(), nil
}

// RepairGroup places again the node claims of a group that no server
// holds, with the GPUs of its other nodes, all or nothing.
func (a *Agent) RepairGroup(ctx context.Context, name string) (api.Group, error) {
	ctx, cancel := groupContext(ctx)
	defer cancel()
	if err := validateGroupName(name); err != nil {
		return api.Group{}, err
	}
	e, err := a.readGroup(ctx, name)
	if err != nil {
		return api.Group{}, err
	}
	return a.repairGroup(ctx, e)
}

func (a *Agent) repairGroup(ctx context.Context, e groupEntry) (api.Group, error) {
	fresh, f, err := a.beginGroupOp(ctx, e)
	if err != nil {
		return api.Group{}, err
	}
	fresh.kubernetes = fresh.kubernetes || e.kubernetes
	s, err := a.readNodes(ctx, fresh)
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
	if _, err := a.placeGroupNodes(ctx, f, s.e, g.Missing, g.GPUs); err != nil {
		return api.Group{}, err
	}
	a.log.Info("group repaired", "group", e.rec.Name, "placed", g.Missing)
	return a.GetGroup(ctx, e.rec.Name)
}

// DeleteGroupClaims releases every node's claim and forgets the group; its
// name is free again. Nodes released before are skipped. When a node
// cannot be released the group stays, so that a retry finds it.
func (a *Agent) DeleteGroupClaims(ctx context.Context, name string) (api.Group, error) {
	ctx, cancel := groupContext(ctx)
	defer cancel()
	// Stamped first: an older operation on the group still running
	// (its client gave up) stops at its next node, and releases what it
	// placed once it finds the group gone.
	s, _, err := a.startGroupOp(ctx, name)
	if err != nil {
		return api.Group{}, err
	}
	g := s.view()
	for _, c := range g.Claims {
		if _, err := a.Release(ctx, c.ID); err != nil && !isCode(err, api.CodeNotFound) {
			return api.Group{}, annotate(err, "group %[2]s: releasing %[3]s: %[1]s; the group stays: run group delete again", name, c.ID)
		}
	}
	if err := a.forgetGroup(ctx, s.e); err != nil {
		return api.Group{}, err
	}
	a.log.Info("group deleted", "group", name)
	return g, nil
}

// groupOpTimeout bounds a group operation once begun: every node's claim,
// move or release, one after the other.
const groupOpTimeout = 5 * time.Minute

// groupContext detaches a group operation from its client: a client that
// gives up (a timeout, a dropped connection) must not stop a create,
// resize or delete half-way, which would leave some nodes changed and
// others not. It runs to completion, or to its own rollback, under the
// agent's deadline.
func groupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), groupOpTimeout)
}
