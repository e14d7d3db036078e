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

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
)

// Kubernetes node groups. Every node of a group gets the same GPUs, all of
// a node's on one server (servers may differ between nodes); a group is
// created all or nothing. Node i's GPUs are the claim NAME.node-i, an
// ordinary claim; the agent that created the group keeps its record, which
// remembers whether it was created with GPUs: one created without can never
// get any, one created with must keep at least one.

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

func (a *Agent) groupPath(name string) string {
	return filepath.Join(a.cfg.DataDir, groupsDir, name+".json")
}

// LookupGroup returns a group record this server keeps.
func (a *Agent) LookupGroup(_ context.Context, name string) (api.GroupRecord, error) {
	if err := validateGroupName(name); err != nil {
		return api.GroupRecord{}, err
	}
	data, err := os.ReadFile(a.groupPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return api.GroupRecord{}, &api.Error{Code: api.CodeNotFound, Message: "no group " + name}
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

// DeleteGroup forgets a group record this server keeps.
func (a *Agent) DeleteGroup(ctx context.Context, name string) (api.GroupRecord, error) {
	rec, err := a.LookupGroup(ctx, name)
	if err != nil {
		return rec, err
	}
	return rec, os.Remove(a.groupPath(name))
}

// findGroup looks for a group's record on every server of the view.
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

// CreateGroup places every node's GPUs, each node on one server, all or
// nothing: when one node cannot be placed, the nodes already placed are
// released and the answer says which GPUs were not available.
func (a *Agent) CreateGroup(ctx context.Context, name string, req api.GroupRequest) (api.Group, error) {
	if err := validateGroupName(name); err != nil {
		return api.Group{}, err
	}
	if req.Nodes < 1 || req.Nodes > maxGroupNodes {
		return api.Group{}, api.Invalid("nodes", "a group has between 1 and %d nodes, not %d", maxGroupNodes, req.Nodes)
	}
	var items []ledger.Item
	if len(req.GPUs) > 0 {
		lreq, err := a.resolve(api.ClaimRequest{GPUs: req.GPUs})
		if err != nil {
			return api.Group{}, err
		}
		items = lreq.Items
	}
	if _, _, err := a.findGroup(ctx, name); err == nil {
		return api.Group{}, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("group %s already exists; delete it first or choose another name", name)}
	}
	rec := api.GroupRecord{Name: name, Nodes: req.Nodes, WithGPUs: len(items) > 0, Coordinator: a.cfg.NodeName, CreatedAt: a.now().UTC()}
	if err := os.MkdirAll(filepath.Join(a.cfg.DataDir, groupsDir), 0o700); err != nil {
		return api.Group{}, err
	}
	data, _ := json.Marshal(rec)
	if err := writeFileAtomic(a.groupPath(name), data); err != nil {
		return api.Group{}, fmt.Errorf("writing group record: %w", err)
	}
	g := api.Group{GroupRecord: rec, GPUs: apiItems(items), Claims: []api.Claim{}}
	if !rec.WithGPUs {
		a.log.Info("group created without GPUs", "group", name, "nodes", req.Nodes)
		return g, nil
	}
	for i := range req.Nodes {
		id := nodeClaimID(name, i)
		// any_node: a node of an earlier group of this name is remembered
		// where it ran, which must not pin the new group's nodes there.
		c, err := a.Claim(ctx, id, api.ClaimRequest{GPUs: apiItems(items), Labels: map[string]string{groupLabel: name}, AnyNode: true})
		if err != nil {
			a.log.Warn("group creation failed; releasing its placed nodes", "group", name, "node", i, "err", err)
			for j := range i {
				if _, rerr := a.Release(context.WithoutCancel(ctx), nodeClaimID(name, j)); rerr != nil {
					a.log.Error("releasing a node of a failed group", "group", name, "claim", nodeClaimID(name, j), "err", rerr)
				}
			}
			_ = os.Remove(a.groupPath(name))
			var e *api.Error
			if errors.As(err, &e) {
				e2 := *e
				e2.Message = fmt.Sprintf("%s (node %d of %d of group %s; nothing was kept)", e.Message, i+1, req.Nodes, name)
				return api.Group{}, &e2
			}
			return api.Group{}, err
		}
		g.Claims = append(g.Claims, c)
	}
	a.log.Info("group created", "group", name, "nodes", req.Nodes, "gpus_per_node", api.DescribeItems(g.GPUs))
	return g, nil
}

// GetGroup returns a group and its nodes' claims.
func (a *Agent) GetGroup(ctx context.Context, name string) (api.Group, error) {
	if err := validateGroupName(name); err != nil {
		return api.Group{}, err
	}
	rec, _, err := a.findGroup(ctx, name)
	if err != nil {
		return api.Group{}, err
	}
	g := api.Group{GroupRecord: rec, Claims: []api.Claim{}}
	if !rec.WithGPUs {
		return g, nil
	}
	for i := range rec.Nodes {
		c, err := a.Get(ctx, nodeClaimID(name, i))
		if err != nil {
			return api.Group{}, fmt.Errorf("group %s: node %d: %w", name, i, err)
		}
		g.Claims = append(g.Claims, c)
		g.GPUs = c.Items
	}
	return g, nil
}

// ResizeGroup gives every node of a group the new GPUs. A group created
// without GPUs never gets one, and one with GPUs keeps at least one. When a
// node cannot be resized, the nodes already changed go back to the old GPUs.
func (a *Agent) ResizeGroup(ctx context.Context, name string, req api.ResizeRequest) (api.Group, error) {
	g, err := a.GetGroup(ctx, name)
	if err != nil {
		return api.Group{}, err
	}
	if !g.WithGPUs {
		return api.Group{}, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("group %s was created without GPUs and can never get one; create a new group with GPUs", name)}
	}
	if len(req.GPUs) == 0 {
		return api.Group{}, api.Invalid("gpus", "group %s has GPUs and must keep at least one per node", name)
	}
	old := g.GPUs
	for i := range g.Nodes {
		if _, err := a.Resize(ctx, nodeClaimID(name, i), req); err != nil {
			for j := range i {
				if _, rerr := a.Resize(context.WithoutCancel(ctx), nodeClaimID(name, j), api.ResizeRequest{GPUs: old}); rerr != nil {
					a.log.Error("rolling back a node of a failed group resize", "group", name, "claim", nodeClaimID(name, j), "err", rerr)
				}
			}
			return api.Group{}, err
		}
	}
	return a.GetGroup(ctx, name)
}

// DeleteGroupClaims releases every node's claim and forgets the group.
func (a *Agent) DeleteGroupClaims(ctx context.Context, name string) (api.Group, error) {
	g, err := a.GetGroup(ctx, name)
	if err != nil {
		return api.Group{}, err
	}
	for _, c := range g.Claims {
		if _, err := a.Release(ctx, c.ID); err != nil && !isCode(err, api.CodeNotFound) {
			return api.Group{}, fmt.Errorf("group %s: releasing %s: %w", name, c.ID, err)
		}
	}
	_, where, err := a.findGroup(ctx, name)
	if err == nil {
		dctx, cancel := context.WithTimeout(ctx, ownerOpTimeout)
		_, err = where.owner.DeleteGroup(dctx, name)
		cancel()
	}
	if err != nil && !isCode(err, api.CodeNotFound) {
		return api.Group{}, err
	}
	return g, nil
}
