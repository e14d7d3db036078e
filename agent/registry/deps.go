// Package registry runs this agent's part in the name registry
// (docs/names.md): raft over mutual TLS on its own listener when the agent
// is a voter or may become one, or a client that forwards; founding a
// registry in a cluster without names_voters and growing its voters; and
// the registry's calls on the agent's API (a request relayed from another
// agent, a member removed for good). It is built from named dependencies
// (Deps, ServiceDeps), never from the agent.
package registry

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/pki"
	"github.com/gpuherd/gpuherd/gossip"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// Config is what the registry reads of the agent's configuration.
type Config struct {
	// Node is this server's name, its server ID in raft.
	Node string
	// Voters are names_voters; empty: the registry founds itself and
	// grows to Expect voters.
	Voters []string
	// Expect is names_bootstrap_expect, the voters an automatic registry
	// grows to.
	Expect int
	// RunsRaft: this agent is a server of the registry (a voter, or one
	// that may become one), not a client.
	RunsRaft bool
	// Dir holds the raft state (names_dir).
	Dir string
	// DirectorySettle is directory_settle; FoundingSettle caps it for the
	// founder's wait for a steady membership (DefaultFoundingSettle when 0).
	DirectorySettle time.Duration
	FoundingSettle  time.Duration
	// Timing is raft's timing.
	Timing names.Timing
}

// Gossip is the cluster's membership as the registry reads it.
type Gossip interface {
	// Members is the gossip view, self included.
	Members() []gossip.Member
	// Member is one member of the view: what raft's address lookups and
	// forwarded requests read, several times a claim, without copying
	// the view.
	Member(name string) (gossip.Member, bool)
	// Subscribe is told of every membership change until cancel.
	Subscribe() (changes <-chan struct{}, cancel func())
}

// Peer carries a registry request to another agent's peer API
// (*api.PeerClient).
type Peer interface {
	Names(ctx context.Context, req, resp any) error
}

// Deps is what a Registry uses, by name.
type Deps struct {
	Config Config
	Gossip Gossip
	// Joined reports whether a seed answered: before, the view may lack
	// members that know a registry.
	Joined func() bool
	// Publish re-advertises this agent's gossip summary, which carries
	// Info.
	Publish func()
	// Peer is the client of another agent's peer API at addr, or why
	// there is none.
	Peer func(node, addr string) (Peer, error)
	// TLS are the node's certificate files, for raft's mutual TLS.
	TLS pki.Files
	// PeerAddr is the peer API's advertised address: its host is raft's
	// when Listener listens on every address.
	PeerAddr string
	// Listener is raft's, bound before any driver moved; nil for a client.
	// Open takes it over: it closes it, on failure too.
	Listener net.Listener
	// StorageResult reports each write of the raft log (names.StorageLog)
	// and snapshots (names.StorageSnapshots) to the storage health.
	StorageResult func(part, op string, err error)
	// StorageTime is told how long each successful write of the raft log
	// and stable store took (names.Config.StorageTime).
	StorageTime func(part, op string, d time.Duration)
	Clock       clock.Clock
	Log         *slog.Logger
}

// Authority is what the registry's API calls need of the name authority
// (the agent's NameAuthority; *names.Registry is the real one).
type Authority interface {
	RemoveMember(ctx context.Context, node string) ([]names.Key, error)
	List(ctx context.Context, f names.Filter, mode names.ReadMode) (names.Listing, error)
}

// Cluster is the membership a removal changes.
type Cluster interface {
	// State is node's state in this agent's gossip view, "" when the view
	// does not hold it.
	State(node string) string
	// Forget drops a member that is not alive from the gossip view.
	Forget(node string)
	// ForgetKnown drops node from the servers this agent has seen, so
	// that listings stop waiting for it.
	ForgetKnown(node string)
}

// ServiceDeps is what a Service uses, by name.
type ServiceDeps struct {
	// Node is this server's name.
	Node string
	// Names is the name authority now; nil while there is none (alone,
	// or before the cluster started).
	Names func() Authority
	// Registry is the registry this agent runs now; nil when it runs
	// none (alone, or with an injected authority).
	Registry func() *Registry
	// Cluster is the membership now; nil while this server runs alone.
	Cluster func() Cluster
	Log     *slog.Logger
}
