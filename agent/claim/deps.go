// Package claim is the coordinator role of the claim protocol
// (docs/protocol.md, "Placing a claim"): it places a user's request on one
// server, all of it or nothing, through the owners' API and the ID's home
// or the name registry, and finds, releases, resizes and lists claims
// again. It chooses where to ask and asks; the owners decide. It is built
// from named dependencies (Deps), never from the agent.
package claim

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/home"
	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/owner"
	"github.com/gpuherd/gpuherd/internal/clock"
	"github.com/gpuherd/gpuherd/internal/keyedlock"
)

// Config is what the coordinator reads of the agent's configuration.
type Config struct {
	NodeName         string
	ReservationLease time.Duration
	MaxGPUsPerClaim  int
}

// Names is what the coordinator asks of the name registry (a move of a
// name also needs owner.NameMover).
type Names interface {
	Lookup(ctx context.Context, key names.Key, mode names.ReadMode) (names.Record, error)
	List(ctx context.Context, f names.Filter, mode names.ReadMode) (names.Listing, error)
	Release(ctx context.Context, key names.Key, token uint64, node string) (names.Record, error)
}

// View is the coordinator's view of the servers: this one exactly, the
// others as gossip tells of them.
type View interface {
	// Targets are the servers a claim may be placed on now, this one first.
	Targets() []Target
	// Self is this server's own target, as in Targets, alone.
	Self() Target
	// Clustered reports whether this server runs in a cluster.
	Clustered() bool
	// Joined reports whether it has joined its cluster.
	Joined() bool
	// Suspects are the members held suspect now, with their last capacity.
	Suspects() []Target
	// Unasked names the members other than asked that may hold claims.
	Unasked(asked []string) []string
	// Refresh brings the view's figures of name up to date after name
	// refused what they said it could hold: from summary, the capacity
	// name answered with (api.SummaryOf), when it sent one; else by asking
	// gossip for name's state now.
	Refresh(name string, summary []byte)
	// MemberStates describes every member's state, for messages.
	MemberStates() string
	// RankAvoidedLast moves members whose peer API did not answer
	// recently to the end of ranked.
	RankAvoidedLast(ranked []string) []string
	// Members are the members as the API lists them.
	Members(ctx context.Context) ([]api.Member, error)
}

// Registry is the state of the name registry this agent runs.
type Registry interface {
	// AwaitFounding returns once the cluster has a registry, after a
	// bounded wait, or when ctx ends.
	AwaitFounding(ctx context.Context)
	// Leaderless reports whether this agent's copy knows no leader now.
	Leaderless() bool
}

// Deps is what the coordinator uses, by name.
type Deps struct {
	Config   Config
	Clock    clock.Clock
	Recorder events.Recorder
	Log      *slog.Logger
	// Ledger is this server's ledger, read for the claims held here.
	Ledger *ledger.Ledger
	// Host is this server's GPUs, read to pin a claim to named GPUs.
	Host *host.Host
	// Home is this server's home of claim IDs.
	Home *home.Home
	View View
	// Names is the name registry now; nil while there is none.
	Names    func() Names
	Registry Registry
	Catalog  *inventory.Catalog
	// ClaimLocks serialise the requests for one claim ID through this
	// agent; the owner's anti-entropy takes them too.
	ClaimLocks *keyedlock.Set
	// Random seeds the choices between equally good servers; nil is
	// math/rand's. The simulation passes its seed's.
	Random func() uint64
}

// Coordinator is this server's coordinator role.
type Coordinator struct {
	cfg        Config
	clk        clock.Clock
	rec        events.Recorder
	log        *slog.Logger
	ledger     *ledger.Ledger
	host       *host.Host
	home       *home.Home
	servers    View // the view of the servers
	namesNow   func() Names
	registry   Registry
	catalog    *inventory.Catalog
	claimLocks *keyedlock.Set
	random     func() uint64

	// readFirstUntil is until when claims through this agent read their
	// ID in the registry before placing it (clock UnixNano; readNameFirst).
	readFirstUntil atomic.Int64
}

// New builds the coordinator over d.
func New(d Deps) *Coordinator {
	co := &Coordinator{cfg: d.Config, clk: d.Clock, rec: d.Recorder, log: d.Log, ledger: d.Ledger, host: d.Host,
		home: d.Home, servers: d.View, namesNow: d.Names, registry: d.Registry, catalog: d.Catalog, claimLocks: d.ClaimLocks, random: d.Random}
	if co.random == nil {
		co.random = rand.Uint64
	}
	return co
}

// names is the registry now, or nil.
func (co *Coordinator) names() Names {
	if co.namesNow == nil {
		return nil
	}
	return co.namesNow()
}

// apiError maps the ledger's and the host's errors to the API's, for an
// answer of this server.
func (co *Coordinator) apiError(err error) error { return owner.APIError(co.cfg.NodeName, err) }

// rnd breaks ties between equally good servers; each call gets its own
// generator, so concurrent claims need no lock.
func (co *Coordinator) rnd() *rand.Rand { return rand.New(rand.NewPCG(co.random(), co.random())) }

// readFirstFor is how long claims through an agent read their ID in the
// registry before placing it, after a placement through it could not be
// confirmed (placeNamed).
const readFirstFor = 30 * time.Second

// readNameFirst reports whether a claim through this agent reads its ID in
// the registry before it places it (placeNamed): while this agent's copy of
// the registry knows no leader, and for readFirstFor after a placement
// through it could not be confirmed (readNamesFirst).
func (co *Coordinator) readNameFirst() bool {
	return co.registryLeaderless() || co.clk.Now().UnixNano() < co.readFirstUntil.Load()
}

// readNamesFirst makes the claims through this agent read their IDs first
// for readFirstFor.
func (co *Coordinator) readNamesFirst() {
	co.readFirstUntil.Store(co.clk.Now().Add(readFirstFor).UnixNano())
}

// registryLeaderless reports whether this agent runs the registry and its
// copy knows no leader now.
func (co *Coordinator) registryLeaderless() bool {
	return co.registry != nil && co.registry.Leaderless()
}

// awaitFounding waits for the registry's founding (Registry.AwaitFounding).
func (co *Coordinator) awaitFounding(ctx context.Context) {
	if co.registry != nil {
		co.registry.AwaitFounding(ctx)
	}
}
