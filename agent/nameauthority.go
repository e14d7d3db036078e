package agent

import (
	"context"
	"time"

	"github.com/gpuherd/gpuherd/agent/claim"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/owner"
)

// NameAuthority is the cluster's one authority over claim IDs and
// node-group names (agent/names, docs/names.md): a claim ID is held by the
// owner that commits it, in one write, and released once the owner's
// ledger has let it go; a group name is acquired before its nodes are
// placed and confirmed once they are. *names.Registry is
// the real one; nil when this server runs alone (its ledger is then the
// only authority it needs).
type NameAuthority interface {
	Acquire(ctx context.Context, key names.Key, caller, owner, request string, members []string) (names.Grant, error)
	Confirm(ctx context.Context, key names.Key, token uint64, owner string, members []string) (names.Record, error)
	// Hold is a claim's one registry write: the owner holds the claim ID
	// for a request at commit, unless another server or request has it.
	// With recall it is refused (names.ErrRecalled) when the ID last ran
	// on another server within its remember window.
	Hold(ctx context.Context, key names.Key, caller, owner, request string, recall bool) (names.Record, error)
	Release(ctx context.Context, key names.Key, token uint64, node string) (names.Record, error)
	// ReleaseRemembering releases a claim ID that ran on node, remembering
	// that server for keep (remember_released).
	ReleaseRemembering(ctx context.Context, key names.Key, token uint64, node string, keep time.Duration) (names.Record, error)
	SetMembers(ctx context.Context, key names.Key, token uint64, members []string) (names.Record, error)
	Lookup(ctx context.Context, key names.Key, mode names.ReadMode) (names.Record, error)
	RemoveMember(ctx context.Context, node string) ([]names.Key, error)
	// List reads the records that match a filter: an owner's names for
	// its anti-entropy pass, the lost names for the claim list.
	List(ctx context.Context, f names.Filter, mode names.ReadMode) (names.Listing, error)
}

var _ NameAuthority = (*names.Registry)(nil)

// WithNames makes n the agent's name authority instead of the registry its
// configuration describes; tests share one in-process registry this way.
// A *names.Registry given so also answers other agents' registry requests
// on the peer route (POST /v1/peer/names), as the agent's own would.
func WithNames(n NameAuthority) Option { return func(o *options) { o.names = n } }

// Every role's view of the registry is part of the authority (namesFor).
var (
	_ owner.Names = NameAuthority(nil)
	_ claim.Names = NameAuthority(nil)
)
