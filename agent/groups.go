package agent

import (
	"context"
	"path/filepath"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/claim"
	"github.com/gpuherd/gpuherd/agent/groups"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/placement"
)

// Node groups are agent/groups; this is what it is given of the agent.

// groupsDir keeps the record files of groups created while running alone.
const groupsDir = "groups"

// newGroups builds a's node-group role over its coordinator, its view of
// the servers and its name authority.
func newGroups(a *Agent) *groups.Groups {
	return groups.New(groups.Deps{
		Node:            a.cfg.NodeName,
		Dir:             filepath.Join(a.cfg.DataDir, groupsDir),
		MaxGPUsPerClaim: a.cfg.MaxGPUsPerClaim,
		Claims:          groupClaims{a.Coordinator},
		Names:           func() groups.Names { return a.names },
		AwaitFounding:   func(ctx context.Context) { a.registry.AwaitFounding(ctx) },
		View:            groupView{a},
		Catalog:         groupView{a},
		Log:             a.log,
		Clock:           a.clk,
		OnStep: func(group, node string) {
			if a.onGroupStep != nil {
				a.onGroupStep(group, node)
			}
		},
	})
}

// groupClaims is the coordinator as a group takes it.
type groupClaims struct{ *claim.Coordinator }

func (c groupClaims) Resize(ctx context.Context, id string, req api.ResizeRequest, prefer string) (api.Claim, error) {
	return c.ResizeOn(ctx, id, req, prefer)
}

// groupView is the agent's view of the servers and its catalog as a group
// sees them.
type groupView struct{ a *Agent }

func (v groupView) Servers() []placement.Server { return claim.Servers(v.a.targets()) }

func (v groupView) ServersNow(ctx context.Context, want []placement.Want) []placement.Server {
	return v.a.Coordinator.ServersNow(ctx, want)
}

func (v groupView) Keepers() []groups.RecordKeeper {
	targets := v.a.targets()
	out := make([]groups.RecordKeeper, len(targets))
	for i, t := range targets {
		out[i] = t.Owner()
	}
	return out
}

func (v groupView) Resolve(req api.ClaimRequest) (ledger.Request, error) {
	return v.a.Coordinator.Resolve(req)
}

func (v groupView) ModelNames() []string { return v.a.Coordinator.ModelNames() }
