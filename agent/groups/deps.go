package groups

import (
	"context"
	"log/slog"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/placement"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// Coordinator is the claim coordinator as a group uses it: each node is
// one claim, placed, read, released and resized through any agent.
type Coordinator interface {
	Claim(ctx context.Context, id string, req api.ClaimRequest) (api.Claim, error)
	Get(ctx context.Context, id string) (api.Claim, error)
	Release(ctx context.Context, id string) (api.Claim, error)
	// Resize is api.Service's Resize that, when the claim moves, prefers
	// server prefer ("" for none): a failed group resize puts a node back
	// where it was.
	Resize(ctx context.Context, id string, req api.ResizeRequest, prefer string) (api.Claim, error)
}

// Names is what a group needs of the name authority (agent/names): its
// name is acquired, confirmed with the node claims as members, read and
// released. An authority that also is a Stamper fences group operations
// (fence.go); one that is a Requester keeps a group's GPUs per node
// through a resize.
type Names interface {
	Acquire(ctx context.Context, key names.Key, caller, owner, request string, members []string) (names.Grant, error)
	Confirm(ctx context.Context, key names.Key, token uint64, owner string, members []string) (names.Record, error)
	Release(ctx context.Context, key names.Key, token uint64, node string) (names.Record, error)
	Lookup(ctx context.Context, key names.Key, mode names.ReadMode) (names.Record, error)
}

// View is the servers of the platform as this agent sees them, this one
// first.
type View interface {
	// Servers is each server with its free GPUs as last heard.
	Servers() []placement.Server
	// ServersNow is Servers with the free GPUs read now from every server
	// that could hold want; a server that does not answer keeps its view.
	ServersNow(ctx context.Context, want []placement.Want) []placement.Server
	// Keepers are the servers that may keep a group's record file: this
	// one (its own Groups) and each peer.
	Keepers() []RecordKeeper
}

// Catalog resolves what a request asks for to the catalog's models.
type Catalog interface {
	// Resolve turns the request's model names into canonical ones and
	// merges repeated models.
	Resolve(req api.ClaimRequest) (ledger.Request, error)
	// ModelNames is every model a claim may ask for.
	ModelNames() []string
}

// Deps is everything a Groups uses.
type Deps struct {
	// Node is this server's name.
	Node string
	// Dir keeps the record files of the groups created here while this
	// server runs alone.
	Dir string
	// MaxGPUsPerClaim bounds a node's GPUs.
	MaxGPUsPerClaim int
	// Claims places, reads, releases and resizes the node claims.
	Claims Coordinator
	// Names returns the name authority, nil while this server runs alone
	// (the records are then files). A function: the agent opens its
	// registry after it builds its roles.
	Names func() Names
	// AwaitFounding returns once the registry this agent founds exists,
	// or ctx ends; nil when there is none to wait for.
	AwaitFounding func(ctx context.Context)
	// View is the servers as this agent sees them.
	View View
	// Catalog resolves requests to models.
	Catalog Catalog
	// Log receives what the operations did.
	Log *slog.Logger
	// Clock dates the record files.
	Clock clock.Clock
	// OnStep, when set (tests), runs before an operation changes a node.
	OnStep func(group, node string)
}

var _ Names = (*names.Registry)(nil)
