package groups

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/claim"
	"github.com/gpuherd/gpuherd/agent/names"
)

// A node group's record in the name registry is the record of its name
// (names.Group): held by the agent that created it, with the node claim
// IDs as members and the create request, encoded by groupSpec, as the
// request digest. So a retry of the same create, through any agent, finds
// the same record ("same"), another request for the name is a conflict,
// and every agent reads the group from the registry, whether or not its
// creator is up.

// groupSpecPrefix versions the encoding of a group's create request.
const groupSpecPrefix = "group/1"

// groupSpec encodes a group's create request: its node count and the GPUs
// per node, models sorted, e.g. "group/1;nodes=3;gpus=NVIDIA L40S:2".
func groupSpec(nodes int, items []api.Item) (string, error) {
	parts := make([]string, 0, len(items))
	for _, it := range items {
		if strings.ContainsAny(it.Model, ";,") {
			return "", api.Invalid("gpus", "model %q holds ';' or ','", it.Model)
		}
		parts = append(parts, it.Model+":"+strconv.Itoa(it.Count))
	}
	slices.Sort(parts)
	s := fmt.Sprintf("%s;nodes=%d;gpus=%s", groupSpecPrefix, nodes, strings.Join(parts, ","))
	if len(s) > 253 {
		return "", api.Invalid("gpus", "a group's GPUs per node take %d bytes written out; at most 253 fit its record", len(s))
	}
	return s, nil
}

// parseGroupSpec reads what groupSpec wrote.
func parseGroupSpec(s string) (nodes int, items []api.Item, err error) {
	f := strings.Split(s, ";")
	if len(f) != 3 || f[0] != groupSpecPrefix || !strings.HasPrefix(f[1], "nodes=") || !strings.HasPrefix(f[2], "gpus=") {
		return 0, nil, fmt.Errorf("group record %q is not in the form %s;nodes=N;gpus=MODEL:COUNT,...: written by a newer version?", s, groupSpecPrefix)
	}
	if nodes, err = strconv.Atoi(strings.TrimPrefix(f[1], "nodes=")); err != nil || nodes < 1 {
		return 0, nil, fmt.Errorf("group record %q: bad node count", s)
	}
	if g := strings.TrimPrefix(f[2], "gpus="); g != "" {
		for _, p := range strings.Split(g, ",") {
			i := strings.LastIndexByte(p, ':')
			n, cerr := strconv.Atoi(p[i+1:])
			if i < 1 || cerr != nil || n < 1 {
				return 0, nil, fmt.Errorf("group record %q: bad GPUs %q", s, p)
			}
			items = append(items, api.Item{Model: p[:i], Count: n})
		}
	}
	return nodes, items, nil
}

// groupEntryOf reads a group's registry record.
func groupEntryOf(r names.Record) (groupEntry, error) {
	nodes, items, err := parseGroupSpec(r.Request)
	if err != nil {
		return groupEntry{}, err
	}
	e := groupEntry{
		rec:   api.GroupRecord{Name: r.Name, Nodes: nodes, WithGPUs: len(items) > 0, Coordinator: r.Caller},
		gpus:  items,
		nodes: slices.Clone(r.Members),
		token: r.Token,
		index: r.Index,
	}
	return e, nil
}

// acquireGroupName takes the group's name in the registry, held by this
// agent, with its node claims as members. retry: the name was taken for
// the same request before (its first try, through any agent).
func (gs *Groups) acquireGroupName(ctx context.Context, rec api.GroupRecord, items []api.Item) (groupEntry, bool, error) {
	spec, err := groupSpec(rec.Nodes, items)
	if err != nil {
		return groupEntry{}, false, err
	}
	var members []string
	if len(items) > 0 {
		for i := range rec.Nodes {
			members = append(members, NodeClaimID(rec.Name, i))
		}
	}
	key := names.Group(rec.Name)
	gs.awaitFounding(ctx)
	g, err := gs.names().Acquire(ctx, key, gs.node, gs.node, spec, members)
	if err != nil {
		var re *names.RefusedError
		if errors.As(err, &re) && re.Record != nil && (re.Code == names.CodeConflict || re.Code == names.CodeLost) {
			return groupEntry{}, false, &api.Error{Code: api.CodeConflict,
				Message: fmt.Sprintf("group %s already exists (created through %s with another request); delete it first or choose another name", rec.Name, re.Record.Caller)}
		}
		return groupEntry{}, false, claim.RegistryError(err, "group "+rec.Name)
	}
	r := g.Record
	if r.State == names.StatePending {
		// Held at once, before any node is placed: from here the group
		// outlives this agent, and a create that stops half-way leaves a
		// group that get shows with its missing nodes.
		if r, err = gs.names().Confirm(ctx, key, r.Token, gs.node, members); err != nil {
			return groupEntry{}, false, claim.RegistryError(err, "group "+rec.Name)
		}
	}
	e, err := groupEntryOf(r)
	return e, g.Retry, err
}

// readGroupName reads a group from the registry.
func (gs *Groups) readGroupName(ctx context.Context, name string) (groupEntry, error) {
	r, err := gs.names().Lookup(ctx, names.Group(name), names.Linearizable)
	if errors.Is(err, names.ErrNotFound) {
		return groupEntry{}, &api.Error{Code: api.CodeNotFound,
			Message: fmt.Sprintf("group %s not found: the name registry holds no such group (gpuherd group create %s --nodes N --gpu MODEL[:COUNT] makes one)", name, name)}
	}
	if err != nil {
		return groupEntry{}, claim.RegistryError(err, "group "+name)
	}
	return groupEntryOf(r)
}

// releaseGroupName frees the group's name; a name already free is fine.
func (gs *Groups) releaseGroupName(ctx context.Context, e groupEntry) error {
	_, err := gs.names().Release(ctx, names.Group(e.rec.Name), e.token, "")
	if err == nil || errors.Is(err, names.ErrNotFound) {
		return nil
	}
	return claim.RegistryError(err, "group "+e.rec.Name)
}

// Requester is what a group resize needs of the name authority beyond
// Names (*names.Registry has it).
type Requester interface {
	SetRequest(ctx context.Context, key names.Key, token uint64, request string) (names.Record, error)
}

var _ Requester = (*names.Registry)(nil)

// noteGroupGPUs records, after a resize, the GPUs every node of the group
// now has, so that the record says so even when no node is left to ask
// (all released directly: repair places them with these). A record that
// cannot be updated is logged: the nodes have their GPUs either way.
func (gs *Groups) noteGroupGPUs(ctx context.Context, e groupEntry, items []api.Item) {
	if gs.names() == nil || api.SameItems(e.gpus, items) {
		return
	}
	spec, err := groupSpec(e.rec.Nodes, items)
	if err == nil {
		if gr, ok := gs.names().(Requester); ok {
			_, err = gr.SetRequest(ctx, names.Group(e.rec.Name), e.token, spec)
		} else {
			err = errors.New("the name authority cannot change a group's request")
		}
	}
	if err != nil {
		gs.log.Warn("group resized, but its record still names its old GPUs per node", "group", e.rec.Name,
			"record", api.DescribeItems(e.gpus), "nodes", api.DescribeItems(items), "err", err)
	}
}
