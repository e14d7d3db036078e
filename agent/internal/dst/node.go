package dst

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/claim"
	"github.com/gpuherd/gpuherd/agent/home"
	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/agent/host/hosttest"
	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/owner"
	"github.com/gpuherd/gpuherd/internal/clock"
	"github.com/gpuherd/gpuherd/internal/keyedlock"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// node is one server: its machine (the simulated kernel, which outlives
// the agent's process), its ledger file, and, while alive, one process of
// the agent: the roles, built afresh at each start. gen counts the
// process's lives; a kill ends what the last one was doing.
type node struct {
	w           *world
	idx         int
	name        string
	kernel      *fakekernel.Kernel
	path        string
	alive       bool
	gen         int
	pausedUntil time.Time

	ctx    context.Context
	cancel context.CancelFunc
	ledger *ledger.Ledger
	host   *host.Host
	owner  *owner.Owner
	coord  *claim.Coordinator
	home   *home.Home
}

var quiet = slog.New(slog.DiscardHandler)

// start runs a new process of the agent on the node: the ledger opened
// (reservations, which live in memory, are gone; commits kept), the host
// reconciled with it, the roles built and their loops started.
func (n *node) start() error {
	l, err := ledger.Open(n.path, ledger.WithLockTimeout(time.Second))
	if err != nil {
		return fmt.Errorf("open the ledger of %s: %w", n.name, err)
	}
	clk := clock.Monotonic(clock.Wall)
	h, err := hosttest.On(hosttest.Parts{Kernel: n.kernel, Ledger: l, Clock: clk, Node: n.name,
		Counters: &hosttest.Counters{}, Recorder: &hosttest.Recorder{}, Log: quiet, Changed: func() {}})
	if err != nil {
		l.Close()
		return fmt.Errorf("start %s: %w", n.name, err)
	}
	w := n.w
	w.mu.Lock()
	n.gen++
	gen := n.gen
	n.alive = true
	w.mu.Unlock()
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.ledger, n.host = l, h
	lease := time.Duration(w.cfg.ReservationLease) * time.Millisecond
	view := &view{w: w, self: n.idx, gen: gen, ledger: l}
	n.home = home.New(home.Deps{NodeName: n.name, Clock: clk, Members: view,
		DirectorySettle: time.Second, RememberReleased: time.Duration(w.cfg.RememberReleased) * time.Millisecond,
		PendingTTL: claim.PendingTTL(lease)})
	names := w.reg.front(n.idx, gen)
	random := seeded(w.cfg.Seed, uint64(n.idx)<<32|uint64(gen))
	var claimLocks keyedlock.Set
	n.owner = owner.New(owner.Deps{
		Config: owner.Config{NodeName: n.name, ReservationLease: lease,
			RememberReleased: time.Duration(w.cfg.RememberReleased) * time.Millisecond},
		Ledger: l, Host: h, Home: n.home, Clock: clk, Recorder: &hosttest.Recorder{}, Counters: counters{w}, Log: quiet,
		Names: func() owner.Names { return names }, Server: server{view}, ClaimLocks: &claimLocks, Random: random,
	})
	n.coord = claim.New(claim.Deps{
		Config: claim.Config{NodeName: n.name, ReservationLease: lease, MaxGPUsPerClaim: 8},
		Clock:  clk, Recorder: &hosttest.Recorder{}, Log: quiet, Ledger: l, Host: h, Home: n.home,
		View: view, Names: func() claim.Names { return names }, Registry: view, Catalog: catalog(),
		ClaimLocks: &claimLocks, Random: random,
	})
	go n.owner.RunNotices(n.ctx)
	go n.owner.RunAntiEntropy(n.ctx)
	go n.sweep(n.ctx, n.owner, lease)
	return nil
}

// sweep expires lapsed reservations, as the agent's serve loop does.
func (n *node) sweep(ctx context.Context, o *owner.Owner, lease time.Duration) {
	// Off the whole milliseconds the roles' own tickers keep: the two
	// never fire at one instant.
	t := time.NewTicker(max(lease/4, 250*time.Millisecond) + 1371*time.Microsecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			o.Sweep(ctx)
		}
	}
}

// kill ends the process as kill -9 does: its calls in flight are dropped,
// its ledger let go without storing its journal in its file (the next
// start applies it); what its goroutines still try fails.
func (n *node) kill() {
	n.w.mu.Lock()
	n.alive = false
	n.pausedUntil = time.Time{}
	n.w.mu.Unlock()
	n.cancel()
	if err := n.ledger.Abandon(); err != nil {
		panic(err)
	}
}

// counters are the owners' metrics: only the decisions on commits
// awaiting their name are counted, for the run's summary.
type counters struct{ w *world }

func (counters) SetClaimDuplicates(int)  {}
func (counters) AntiEntropySkipped()     {}
func (counters) ClaimNameFreed()         {}
func (counters) ClaimNameAdopted()       {}
func (counters) ClaimDuplicateReleased() {}
func (c counters) ClaimAwaitingDecided(kept bool) {
	if kept {
		c.w.awaitingKept.Add(1)
	} else {
		c.w.awaitingUndone.Add(1)
	}
}

// view is one process's view of the cluster: the servers gossip would
// show it (every other server whose process answered gossip lately, with
// the capacity it last published), the membership, and the registry.
type view struct {
	w      *world
	self   int
	gen    int
	ledger *ledger.Ledger // the process's own, read exactly
}

// members are the servers in the view, this one first.
func (v *view) members() []int {
	out := []int{v.self}
	for _, i := range v.w.gossip.seen(v.self) {
		if i != v.self {
			out = append(out, i)
		}
	}
	return out
}

func (v *view) Targets() []claim.Target {
	var out []claim.Target
	for _, i := range v.members() {
		out = append(out, v.target(i))
	}
	return out
}

func (v *view) Self() claim.Target { return v.target(v.self) }

func (v *view) target(i int) claim.Target {
	caps := v.w.gossip.capacity(i)
	if i == v.self {
		caps = v.ledger.Totals(time.Now())
	}
	free := make(map[string]int, len(caps))
	for m, c := range caps {
		free[m] = c.Free
	}
	return claim.NewTarget(v.w.nodes[i].name, i == v.self, v.peer(i), free, false, caps)
}

func (v *view) peer(i int) api.Owner { return peer{w: v.w, from: v.self, gen: v.gen, to: i} }

// server is the view as the owner reads it (owner.Server): a simulated
// server is never drained.
type server struct{ *view }

func (s server) Cluster() owner.Cluster { return s.view }
func (s server) Drained() bool          { return false }
func (s server) Changed()               {}

func (s server) Peers() []owner.Peer {
	v := s.view
	var out []owner.Peer
	for _, i := range v.members() {
		out = append(out, owner.Peer{Name: v.w.nodes[i].name, Owner: v.peer(i)})
	}
	return out
}

func (v *view) Clustered() bool               { return true }
func (v *view) Joined() bool                  { return true }
func (v *view) Suspects() []claim.Target      { return nil }
func (v *view) Refresh(string, []byte)        {}
func (v *view) MemberStates() string          { return "" }
func (v *view) AwaitFounding(context.Context) {}
func (v *view) Leaderless() bool              { return false }

func (v *view) RankAvoidedLast(ranked []string) []string { return ranked }

func (v *view) Members(context.Context) ([]api.Member, error) { return nil, nil }

// Unasked are the members other than asked: every server of the cluster
// may hold a claim.
func (v *view) Unasked(asked []string) []string {
	var out []string
	for _, nd := range v.w.nodes {
		if nd.idx != v.self && !slices.Contains(asked, nd.name) {
			out = append(out, nd.name)
		}
	}
	return out
}

// Peers names the other members, for the home.
func (v *view) Peers() []string {
	var out []string
	for _, i := range v.members()[1:] {
		out = append(out, v.w.nodes[i].name)
	}
	return out
}

// Subscribe and Usable are the membership the owner follows: its notices
// go to the homes of the usable members.
func (v *view) Subscribe() (<-chan struct{}, func()) { return v.w.gossip.subscribe() }

func (v *view) Usable() []home.Member {
	var out []home.Member
	for _, i := range v.members() {
		out = append(out, home.Member{Name: v.w.nodes[i].name, Boot: uint64(v.w.gossip.boot(i))})
	}
	return out
}

// peer is one server's owner and home API as another reaches it: each
// call a message on the network, its answer as the peer API's JSON
// carries it.
type peer struct {
	w    *world
	from int
	gen  int
	to   int
}

type result[T any] struct {
	v   T
	err *api.Error
}

func (r result[T]) text() string {
	b, err := json.Marshal(r.v)
	if err != nil {
		panic(err)
	}
	if r.err != nil {
		return fmt.Sprintf("%s %s", b, r.err.Error())
	}
	return string(b)
}

// notSent answers a call to a server whose process is gone: the
// connection is refused.
type notSent struct{}

func peerCall[T any](ctx context.Context, p peer, desc string, f func(ctx context.Context, nd *node) (T, error)) (T, error) {
	var zero T
	a, ok := p.w.call(ctx, p.from, p.gen, p.to, desc, func(hctx context.Context) any {
		v, err := f(hctx, p.w.nodes[p.to])
		return result[T]{v: wire(v), err: wireError(err)}
	})
	switch {
	case !ok && ctx.Err() == nil:
		return zero, fmt.Errorf("peer %s: the caller's process is gone: %w", p.w.name(p.to), api.ErrNotSent)
	case !ok:
		return zero, fmt.Errorf("peer %s did not answer: %w", p.w.name(p.to), ctx.Err())
	}
	if _, refused := a.(notSent); refused {
		return zero, fmt.Errorf("peer %s: connection refused: %w", p.w.name(p.to), api.ErrNotSent)
	}
	r := a.(result[T])
	if r.err != nil {
		return r.v, r.err
	}
	return r.v, nil
}

// wire is v as the other end reads it from JSON.
func wire[T any](v T) T {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out T
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

// wireError is err as the peer API answers it: an *api.Error as it is, any
// other an internal error.
func wireError(err error) *api.Error {
	if err == nil {
		return nil
	}
	var e *api.Error
	if errors.As(err, &e) {
		return wire(e)
	}
	return &api.Error{Status: http.StatusInternalServerError, Code: api.CodeInternal, Message: err.Error()}
}

func (p peer) Reserve(ctx context.Context, id string, rr api.ReserveRequest) (api.Claim, error) {
	return peerCall(ctx, p, fmt.Sprintf("reserve %s %v token=%d commit=%v", id, rr.Items, rr.Token, rr.Commit), func(ctx context.Context, nd *node) (api.Claim, error) {
		c, err := nd.owner.Reserve(ctx, id, wire(rr))
		p.w.checkCommitted(nd, id, c, err)
		return c, err
	})
}

func (p peer) Commit(ctx context.Context, id string) (api.Claim, error) {
	return peerCall(ctx, p, "commit "+id, func(ctx context.Context, nd *node) (api.Claim, error) {
		c, err := nd.owner.Commit(ctx, id)
		p.w.checkCommitted(nd, id, c, err)
		return c, err
	})
}

// checkCommitted checks an owner's answer that claim id is committed on
// nd, at the instant it answers: the registry holds the name on nd under
// the token nd's ledger committed it with. Other servers may still hold an
// older copy then (a move commits before it releases the old one).
func (w *world) checkCommitted(nd *node, id string, c api.Claim, err error) {
	if err != nil || c.State != api.StateClaimed {
		return
	}
	lc, lerr := nd.ledger.Get(id)
	if lerr != nil || lc.State != ledger.StateCommitted {
		return // killed meanwhile, or released by another call already
	}
	rec, rerr := w.reg.base.Lookup(context.Background(), names.Claim(id), names.Linearizable)
	switch {
	case rerr != nil:
		w.violation("claim %s answered committed on %s (token %d), but the registry holds no name for it (%v)", id, nd.name, lc.NameToken, rerr)
	case rec.State != names.StateHeld || rec.Owner != nd.name || rec.Token != lc.NameToken:
		w.violation("claim %s answered committed on %s under token %d, but the registry has it %s on %s under token %d", id, nd.name, lc.NameToken, rec.State, rec.Owner, rec.Token)
	}
}

func (p peer) Abort(ctx context.Context, id string) (api.Claim, error) {
	return peerCall(ctx, p, "abort "+id, func(ctx context.Context, nd *node) (api.Claim, error) { return nd.owner.Abort(ctx, id) })
}

func (p peer) AbortReservation(ctx context.Context, id string) (api.Claim, error) {
	return peerCall(ctx, p, "abort-reservation "+id, func(ctx context.Context, nd *node) (api.Claim, error) {
		return nd.owner.AbortReservation(ctx, id)
	})
}

func (p peer) Lookup(ctx context.Context, id string) (api.Claim, error) {
	return peerCall(ctx, p, "lookup "+id, func(ctx context.Context, nd *node) (api.Claim, error) { return nd.owner.Lookup(ctx, id) })
}

func (p peer) List(ctx context.Context) ([]api.Claim, error) {
	return peerCall(ctx, p, "list", func(ctx context.Context, nd *node) ([]api.Claim, error) { return nd.owner.List(ctx) })
}

func (p peer) ResizeInPlace(ctx context.Context, id string, items []api.Item) (api.Claim, error) {
	return peerCall(ctx, p, fmt.Sprintf("resize-in-place %s %v", id, items), func(ctx context.Context, nd *node) (api.Claim, error) {
		return nd.owner.ResizeInPlace(ctx, id, wire(items))
	})
}

func (p peer) LookupGroup(context.Context, string) (api.GroupRecord, error) {
	return api.GroupRecord{}, &api.Error{Status: http.StatusNotFound, Code: api.CodeNotFound, Message: "node groups are not simulated"}
}

func (p peer) DeleteGroup(context.Context, string) (api.GroupRecord, error) {
	return api.GroupRecord{}, &api.Error{Status: http.StatusNotFound, Code: api.CodeNotFound, Message: "node groups are not simulated"}
}

func (p peer) BeginClaim(ctx context.Context, id string, req api.DirBegin) (api.DirAnswer, error) {
	return peerCall(ctx, p, "directory begin "+id, func(ctx context.Context, nd *node) (api.DirAnswer, error) {
		return nd.home.BeginClaim(ctx, id, wire(req))
	})
}

func (p peer) LookupDirectory(ctx context.Context, id string) (api.DirAnswer, error) {
	return peerCall(ctx, p, "directory lookup "+id, func(ctx context.Context, nd *node) (api.DirAnswer, error) {
		return nd.home.LookupDirectory(ctx, id)
	})
}

func (p peer) UpdateDirectory(ctx context.Context, u api.DirUpdate) error {
	_, err := peerCall(ctx, p, fmt.Sprintf("directory update %+v", u), func(ctx context.Context, nd *node) (struct{}, error) {
		return struct{}{}, nd.home.UpdateDirectory(ctx, wire(u))
	})
	return err
}

// seeded is a source of random numbers for one process, from the
// schedule's seed: the roles' choices replay with it.
func seeded(seed, stream uint64) func() uint64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, stream))
	return func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Uint64()
	}
}

// catalog is the default catalog of GPU models, parsed once.
var catalog = sync.OnceValue(inventory.DefaultCatalog)
