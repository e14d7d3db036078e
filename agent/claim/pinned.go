package claim

import (
	"fmt"
	"slices"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/vfio"
)

// pinned turns a claim that names its GPUs (api.ClaimRequest.Devices) into
// the request the protocol places: the items counted from the GPUs' models,
// kept on this server and nowhere else, the devices sorted. Only this
// server's agent knows its GPUs' models for sure, so only it takes one.
func (co *Coordinator) pinned(req api.ClaimRequest) (api.ClaimRequest, error) {
	node := req.PreferNode
	if node == "" {
		node = co.cfg.NodeName
	}
	if node != co.cfg.NodeName {
		return req, api.Invalid("devices", "GPUs named by address are claimed through their own server's agent (%s), not through %s", node, co.cfg.NodeName)
	}
	if req.AnyNode {
		return req, api.Invalid("any_node", "a claim of named GPUs stays on their server: leave any_node out")
	}
	if len(req.Devices) > co.cfg.MaxGPUsPerClaim {
		return req, api.Invalid("devices", "%d GPUs named: a claim holds at most %d", len(req.Devices), co.cfg.MaxGPUsPerClaim)
	}
	counts := map[string]int{}
	var order []string
	for i, addr := range req.Devices {
		field := fmt.Sprintf("devices[%d]", i)
		if err := vfio.ValidateAddress(addr); err != nil {
			return req, api.Invalid(field, "%v", err)
		}
		if slices.Contains(req.Devices[:i], addr) {
			return req, api.Invalid(field, "%s is named twice", addr)
		}
		g, ok := co.host.GPU(addr)
		if !ok {
			return req, &api.Error{Code: api.CodeNotFound, Field: field,
				Message: fmt.Sprintf("no GPU at %s on %s (see `gpuherd status`)", addr, co.cfg.NodeName)}
		}
		if counts[g.Model] == 0 {
			order = append(order, g.Model)
		}
		counts[g.Model]++
	}
	items := make([]api.Item, 0, len(order))
	for _, m := range order {
		items = append(items, api.Item{Model: m, Count: counts[m]})
	}
	if len(req.GPUs) > 0 {
		asked, err := co.resolve(req)
		if err != nil {
			return req, err
		}
		if !api.SameItems(asked.Items, items) {
			return req, api.Invalid("gpus", "asks for %s but the GPUs named are %s: give one or the other", api.DescribeItems(asked.Items), api.DescribeItems(items))
		}
	}
	req.GPUs = items
	req.PreferNode, req.SameNode = node, true
	req.Devices = slices.Sorted(slices.Values(req.Devices))
	return req, nil
}
