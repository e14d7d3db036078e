package owner

import (
	"fmt"
	"slices"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
)

// ClaimView is claim c of this server as the API shows it.
func (o *Owner) ClaimView(c ledger.Claim) api.Claim {
	v := api.Claim{
		ID:          c.ID,
		Node:        o.cfg.NodeName,
		State:       api.StateReserved,
		Labels:      c.Labels,
		CreatedAt:   c.CreatedAt,
		ExpiresAt:   c.ExpiresAt,
		CommittedAt: c.CommittedAt,
		GPUs:        make([]api.ClaimGPU, 0, len(c.GPUs)),
	}
	if c.Named() {
		// A claim committed ahead of its name is not a claim until the
		// registry's answer settles it (commitahead.go).
		v.State = api.StateClaimed
	}
	v.Items = slices.Clone(c.Items)
	for _, addr := range c.GPUs {
		g, _ := o.host.GPU(addr)
		cg := api.ClaimGPU{PCIAddress: addr, Model: g.Model, IOMMUGroup: g.IOMMUGroup}
		if g.IOMMUGroup >= 0 {
			cg.VFIODevice = fmt.Sprintf("/dev/vfio/%d", g.IOMMUGroup)
		}
		for _, f := range g.Companions {
			cg.Companions = append(cg.Companions, api.PCIFunction{PCIAddress: f})
		}
		v.GPUs = append(v.GPUs, cg)
	}
	if u := c.Use; u.Domain != "" {
		v.Domain = &api.DomainUse{UUID: u.Domain, Name: u.Name, Started: u.Started, Since: u.Since}
	}
	o.duplicateMark(&v)
	return v
}
