// Package owner is the owner role of the claim protocol (docs/protocol.md):
// it reserves, commits, aborts, releases and resizes the claims of this
// server in its ledger and binds their GPUs through the host; holds their
// names in the registry; keeps the homes of its claim IDs up to date; runs
// the anti-entropy pass between the registry and its ledger; and answers
// the libvirt hook about the domains using its claims. It is built from
// named dependencies (Deps), never from the agent.
package owner

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/home"
	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/internal/clock"
	"github.com/gpuherd/gpuherd/internal/keyedlock"
	"github.com/gpuherd/gpuherd/vfio"
)

// Config is what the owner reads of the agent's configuration.
type Config struct {
	NodeName         string
	ReservationLease time.Duration
	RememberReleased time.Duration
	IdlePolicy       vfio.IdlePolicy
}

// Names is what the owner asks of the name registry.
type Names interface {
	Acquire(ctx context.Context, key names.Key, caller, owner, request string, members []string) (names.Grant, error)
	Confirm(ctx context.Context, key names.Key, token uint64, owner string, members []string) (names.Record, error)
	Hold(ctx context.Context, key names.Key, caller, owner, request string, recall bool) (names.Record, error)
	Release(ctx context.Context, key names.Key, token uint64, node string) (names.Record, error)
	ReleaseRemembering(ctx context.Context, key names.Key, token uint64, node string, keep time.Duration) (names.Record, error)
	Lookup(ctx context.Context, key names.Key, mode names.ReadMode) (names.Record, error)
	List(ctx context.Context, f names.Filter, mode names.ReadMode) (names.Listing, error)
}

// NameMover is what a move of a name needs of the registry beyond Names
// (*names.Registry has it).
type NameMover interface {
	Move(ctx context.Context, key names.Key, token uint64, from, to, caller string) (names.Record, error)
	ConfirmMove(ctx context.Context, key names.Key, token uint64, owner, caller string) (names.Record, error)
}

var _ NameMover = (*names.Registry)(nil)

// Cluster is the membership the owner follows for the claim directory.
type Cluster interface {
	// Subscribe is told of every membership change until cancel.
	Subscribe() (changes <-chan struct{}, cancel func())
	// Usable are the members a coordinator may place claims on now.
	Usable() []home.Member
}

// Server is the agent an owner serves, as the owner reads it when it uses
// it: the cluster started after the roles were built.
type Server interface {
	// Cluster is the membership now; nil while this server runs alone.
	Cluster() Cluster
	// Peers are the servers now, this one first.
	Peers() []Peer
	// Drained reports whether the server is drained (no new claims).
	Drained() bool
	// Changed is called whenever this server's capacity may have changed.
	Changed()
}

// Peer is a server this owner tells or asks: itself or another.
type Peer struct {
	Name  string
	Owner api.Owner // its owner API (a home also serves api.Directory)
}

// Counters are the anti-entropy events the metrics count.
type Counters interface {
	SetClaimDuplicates(n int)
	AntiEntropySkipped()
	ClaimNameFreed()
	ClaimNameAdopted()
	ClaimDuplicateReleased()
	// ClaimAwaitingDecided counts a commit awaiting its name decided from
	// the registry (commitahead.go): kept, or undone.
	ClaimAwaitingDecided(kept bool)
}

// Deps is what the owner uses, by name.
type Deps struct {
	Config   Config
	Ledger   *ledger.Ledger
	Host     *host.Host
	Home     *home.Home // this server's home, told of membership changes
	Clock    clock.Clock
	Recorder events.Recorder
	Counters Counters
	Log      *slog.Logger
	// Names is the name registry now; nil while there is none (a server
	// alone, or a cluster not joined yet).
	Names func() Names
	// Server is the agent this owner serves, read when used.
	Server Server
	// ClaimLocks are the coordinator's locks by claim ID: anti-entropy
	// repairs a claim only while no request of it runs through this agent.
	ClaimLocks *keyedlock.Set
	// Random spreads the periodic passes; nil is math/rand's. The
	// simulation passes its seed's.
	Random func() uint64
}

// Owner is this server's owner role.
type Owner struct {
	cfg        Config
	ledger     *ledger.Ledger
	host       *host.Host
	home       *home.Home
	clk        clock.Clock
	rec        events.Recorder
	counters   Counters
	log        *slog.Logger
	namesNow   func() Names
	clusterNow func() Cluster
	peers      func() []Peer
	drained    func() bool
	changed    func()
	claimLocks *keyedlock.Set
	random     func() uint64

	// commitLocks run an owner's commits of one claim ID one at a time
	// (Commit): a commit that failed after its hold lets the name go
	// before another reservation of the ID holds it.
	commitLocks keyedlock.Set
	// bound maps a claim ID to the CreatedAt of its reservation once
	// reserveAndBind has bound all of its GPUs: its commit then need not
	// check them again (see Commit).
	bound   sync.Map
	notices *dirNotices // what the homes are owed (notices.go)
	// nameTime is how long registry writes take from here lately, for
	// the ledger's fdatasyncs written beside them (syncwindow.go).
	nameTime nameWriteTime
	besides  atomic.Int32 // records waiting beside a registry write (durableBeside)
	ae       antiEntropy  // the pass over names and ledger (antientropy.go)
}

// New builds the owner over d.
func New(d Deps) *Owner {
	o := &Owner{cfg: d.Config, ledger: d.Ledger, host: d.Host, home: d.Home, clk: d.Clock, rec: d.Recorder,
		counters: d.Counters, log: d.Log, namesNow: d.Names, clusterNow: d.Server.Cluster, peers: d.Server.Peers,
		drained: d.Server.Drained, changed: d.Server.Changed, claimLocks: d.ClaimLocks, random: d.Random, notices: newDirNotices()}
	if o.random == nil {
		o.random = rand.Uint64
	}
	return o
}

// jitter is a duration in [lo, hi), from the owner's source of randomness.
func (o *Owner) jitter(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(o.random()%uint64(hi-lo))
}

// names is the registry now, or nil.
func (o *Owner) names() Names {
	if o.namesNow == nil {
		return nil
	}
	return o.namesNow()
}

// cluster is the membership now, or nil.
func (o *Owner) cluster() Cluster {
	if o.clusterNow == nil {
		return nil
	}
	return o.clusterNow()
}

// peer is the server named name among the peers now.
func (o *Owner) peer(name string) (Peer, bool) {
	for _, p := range o.peers() {
		if p.Name == name {
			return p, true
		}
	}
	return Peer{}, false
}
