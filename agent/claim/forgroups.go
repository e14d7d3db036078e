package claim

import (
	"context"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/placement"
)

// What node groups (agent/groups) use of the coordinator beside its API.

// ResizeOn resizes claim id as Resize does, preferring the server prefer
// when the claim must move (a group puts a node back where it was).
func (co *Coordinator) ResizeOn(ctx context.Context, id string, req api.ResizeRequest, prefer string) (api.Claim, error) {
	return co.resizeOn(ctx, id, req, prefer)
}

// ServersNow are the servers of the view with the capacity their owners
// answer now, for want (the view's figures where an owner does not answer).
func (co *Coordinator) ServersNow(ctx context.Context, want []placement.Want) []placement.Server {
	at := &attempt{Coordinator: co, want: want}
	return at.recheck(ctx, co.servers.Targets())
}

// Servers are targets as placement ranks them.
func Servers(targets []Target) []placement.Server {
	out := make([]placement.Server, len(targets))
	for i, t := range targets {
		out[i] = t.server
	}
	return out
}

// Resolve turns a user's request into the ledger's, models resolved.
func (co *Coordinator) Resolve(req api.ClaimRequest) (ledger.Request, error) { return co.resolve(req) }

// ModelNames is every model name a claim may ask for.
func (co *Coordinator) ModelNames() []string { return co.modelNames() }
