package agent

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
)

// The claim directory (docs/protocol.md, "The claim directory"). Every claim
// ID has a home: the live member with the highest rendezvous hash of
// (member, ID). The home remembers, in memory, on which servers the claim is
// held and which coordinator is placing it now, so that a coordinator asks
// one server instead of all of them. It is a shortcut, never the truth (the
// owners' ledgers are): whenever the home cannot vouch for its answer — it
// started or the membership changed less than directory_settle ago, or its
// record is stale — the coordinator asks every server, as without it.

const (
	dirQueueLen     = 4096             // owner-side notifications waiting to be sent
	dirSendAttempts = 3                // tries of one notification batch per home
	dirResync       = time.Minute      // owners re-send where their claims are, at least this often
	dirForget       = 10 * time.Minute // a stale intent is forgotten after this
)

// dirEntry is what the home knows about one claim ID.
type dirEntry struct {
	owners      []string  // servers that reported the claim committed
	coordinator string    // the coordinator placing it, when owners is empty
	since       time.Time // when that coordinator began
}

// directory is this agent's part of the directory: the entries of the IDs
// homed here, and the notifications this agent, as an owner, owes the homes
// of its claims.
type directory struct {
	mu      sync.Mutex
	entries map[string]*dirEntry
	changed time.Time // the membership last changed, or this agent started
	members uint64    // digest of the membership it changed to (name and boot of every usable member)

	queue chan api.DirOp
	// undelivered holds the claim IDs whose notification a home did not
	// take; they are sent again, as the ledger has them then, every second.
	undeliveredMu sync.Mutex
	undelivered   map[string]bool
}

func newDirectory(now time.Time) *directory {
	return &directory{entries: map[string]*dirEntry{}, changed: now, queue: make(chan api.DirOp, dirQueueLen), undelivered: map[string]bool{}}
}

// rendezvous is the weight of node for claim id; the highest weight wins.
func rendezvous(node, id string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(node))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(id))
	// FNV's low bits mix poorly: finish with splitmix64's mixer.
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// homeOf is the home of claim id among targets (which are never empty:
// this agent is always one).
func homeOf(id string, targets []target) target {
	best, bestW := targets[0], rendezvous(targets[0].name, id)
	for _, t := range targets[1:] {
		if w := rendezvous(t.name, id); w > bestW || (w == bestW && t.name < best.name) {
			best, bestW = t, w
		}
	}
	return best
}

// isHome reports whether this agent is the home of id by its own view: the
// same choice as homeOf over targets, without building them.
func (a *Agent) isHome(id string) bool {
	me := a.cfg.NodeName
	best, bestW := me, rendezvous(me, id)
	for _, m := range a.cluster.g.Members() {
		if m.Self || !m.Usable() || m.Summary.PeerAddr == "" {
			continue // as clusterState.peers
		}
		if w := rendezvous(m.Name, id); w > bestW || (w == bestW && m.Name < best) {
			best, bestW = m.Name, w
		}
	}
	return best == me
}

// dirTrusted reports whether this agent may vouch, as a home, that an ID it
// has no entry for is held nowhere: it has joined the cluster, and neither
// its start nor the last membership change is less than directory_settle
// ago, which gives every owner the time to re-send its claims to their new
// homes.
func (a *Agent) dirTrusted(now time.Time) bool {
	if a.cluster == nil || !a.cluster.joined.Load() {
		return false
	}
	a.dir.mu.Lock()
	changed := a.dir.changed
	a.dir.mu.Unlock()
	return now.Sub(changed) >= time.Duration(a.cfg.DirectorySettle)
}

// pendingTTL is how long an intent counts as a placement in progress: a
// coordinator reserves within reserveTimeout and commits within a lease.
func (a *Agent) pendingTTL() time.Duration {
	return reserveTimeout + time.Duration(a.cfg.ReservationLease) + 5*time.Second
}

// answer is the home's answer from its entry for id; false when there is none.
func (d *directory) answer(id string, now time.Time, ttl time.Duration) (api.DirAnswer, bool) {
	e := d.entries[id]
	switch {
	case e == nil:
		return api.DirAnswer{}, false
	case len(e.owners) > 0:
		return api.DirAnswer{State: api.DirHeld, Owners: slices.Clone(e.owners)}, true
	case now.Sub(e.since) < ttl:
		return api.DirAnswer{State: api.DirPending, Coordinator: e.coordinator}, true
	}
	return api.DirAnswer{State: api.DirUnsure}, true
}

func validNode(field, name string) error {
	if name == "" || len(name) > ledger.MaxCoordinatorLen || strings.ContainsFunc(name, func(r rune) bool { return r < 0x21 || r == 0x7f }) {
		return api.Invalid(field, "node name %q: must be 1 to %d printable characters without spaces", truncateName(name), ledger.MaxCoordinatorLen)
	}
	return nil
}

func truncateName(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

var _ api.Directory = (*Agent)(nil)

// BeginClaim records that req.Coordinator is about to place claim id, and
// answers DirNew when this home vouches that the ID is held nowhere. When it
// cannot vouch, the intent is still recorded (the answer is DirUnsure), so
// that lookups see a placement in progress.
func (a *Agent) BeginClaim(_ context.Context, id string, req api.DirBegin) (api.DirAnswer, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.DirAnswer{}, a.apiError(err)
	}
	if err := validNode("coordinator", req.Coordinator); err != nil {
		return api.DirAnswer{}, err
	}
	now := a.now()
	vouch := a.dirTrusted(now) && a.isHome(id)
	d := a.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	ans, ok := d.answer(id, now, a.pendingTTL())
	if ok && ans.State != api.DirUnsure {
		return ans, nil
	}
	d.entries[id] = &dirEntry{coordinator: req.Coordinator, since: now}
	if ok || !vouch {
		return api.DirAnswer{State: api.DirUnsure}, nil
	}
	return api.DirAnswer{State: api.DirNew}, nil
}

// LookupDirectory answers where claim id is, as far as this home knows.
func (a *Agent) LookupDirectory(_ context.Context, id string) (api.DirAnswer, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.DirAnswer{}, a.apiError(err)
	}
	now := a.now()
	vouch := a.dirTrusted(now) && a.isHome(id)
	d := a.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	if ans, ok := d.answer(id, now, a.pendingTTL()); ok {
		return ans, nil
	}
	if vouch {
		return api.DirAnswer{State: api.DirAbsent}, nil
	}
	return api.DirAnswer{State: api.DirUnsure}, nil
}

// UpdateDirectory applies an owner's (or a coordinator's) notifications, in
// their order.
func (a *Agent) UpdateDirectory(_ context.Context, u api.DirUpdate) error {
	if err := validNode("from", u.From); err != nil {
		return err
	}
	if len(u.Ops) > api.MaxDirUpdateIDs {
		return api.Invalid("ops", "%d operations: at most %d", len(u.Ops), api.MaxDirUpdateIDs)
	}
	for i, op := range u.Ops {
		if err := ledger.ValidateID(op.ID); err != nil {
			return api.Invalid(fmt.Sprintf("ops[%d].id", i), "%v", err)
		}
		switch op.Op {
		case api.DirOpHeld, api.DirOpGone, api.DirOpAbandon:
		default:
			return api.Invalid(fmt.Sprintf("ops[%d].op", i), "%q: must be %s, %s or %s", truncateName(op.Op), api.DirOpHeld, api.DirOpGone, api.DirOpAbandon)
		}
	}
	now := a.now()
	d := a.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, op := range u.Ops {
		d.apply(u.From, op, now)
	}
	d.forget(now)
	return nil
}

func (d *directory) apply(from string, op api.DirOp, now time.Time) {
	e := d.entries[op.ID]
	switch op.Op {
	case api.DirOpHeld:
		if e == nil {
			e = &dirEntry{}
			d.entries[op.ID] = e
		}
		if !slices.Contains(e.owners, from) {
			e.owners = append(e.owners, from)
			slices.Sort(e.owners)
		}
		e.coordinator, e.since = "", now
	case api.DirOpGone:
		if e == nil {
			return
		}
		e.owners = slices.DeleteFunc(e.owners, func(o string) bool { return o == from })
		if len(e.owners) == 0 && e.coordinator == "" {
			delete(d.entries, op.ID)
		}
	case api.DirOpAbandon:
		if e != nil && len(e.owners) == 0 && e.coordinator == from {
			delete(d.entries, op.ID)
		}
	}
}

// forget drops intents that went stale long ago: the owners' periodic
// resync has re-sent whatever they became.
func (d *directory) forget(now time.Time) {
	if len(d.entries) < 1024 {
		return
	}
	for id, e := range d.entries {
		if len(e.owners) == 0 && now.Sub(e.since) > dirForget {
			delete(d.entries, id)
		}
	}
}

// dirNote queues a notification for the home of claim id: this agent, as
// its owner, committed it (DirOpHeld) or dropped it (DirOpGone).
func (a *Agent) dirNote(id, op string) {
	if a.cluster == nil {
		return
	}
	select {
	case a.dir.queue <- api.DirOp{ID: id, Op: op}:
	default:
		a.log.Warn("claim directory queue full; the periodic resync will catch up", "claim", id)
	}
}

// dirWorker sends the owner's notifications to the homes, in order; re-sends
// every claim of this server when the membership changes (homes move) and
// every dirResync; and tracks the membership for dirTrusted.
func (a *Agent) dirWorker(ctx context.Context) {
	sub, cancel := a.cluster.g.Subscribe()
	defer cancel()
	a.dirMembership()
	resync := time.NewTimer(jitter(dirResync))
	defer resync.Stop()
	retry := time.NewTicker(time.Second)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-retry.C:
			a.dirRetry(ctx)
		case op := <-a.dir.queue:
			batch := []api.DirOp{op}
		more:
			for len(batch) < api.MaxDirUpdateIDs {
				select {
				case op := <-a.dir.queue:
					batch = append(batch, op)
				default:
					break more
				}
			}
			a.dirSend(ctx, batch)
		case _, ok := <-sub:
			if !ok {
				return
			}
			if a.dirMembership() {
				a.dirResyncAll(ctx)
			}
		case <-resync.C:
			a.dirResyncAll(ctx)
			resync.Reset(jitter(dirResync))
		}
	}
}

// jitter spreads a period over ±25% so that servers do not resync in step.
func jitter(d time.Duration) time.Duration {
	return d*3/4 + rand.N(d/2)
}

// dirMembership notes a change of the usable members (a member that came,
// went, or restarted behind the same name) and reports whether there was one.
//
// It runs on every change of the view, capacity updates included, so it
// computes an order-independent digest instead of comparing sorted names.
func (a *Agent) dirMembership() bool {
	var set uint64
	for _, m := range a.cluster.g.Members() {
		if m.Usable() {
			set += rendezvous(m.Name, strconv.FormatUint(m.Summary.Boot, 16))
		}
	}
	d := a.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	if set == d.members {
		return false
	}
	d.members = set
	d.changed = a.now()
	return true
}

// dirResyncAll re-sends every claim this server holds to its home.
func (a *Agent) dirResyncAll(ctx context.Context) {
	var ops []api.DirOp
	for _, c := range a.ledger.List() {
		if c.State == ledger.StateCommitted {
			ops = append(ops, api.DirOp{ID: c.ID, Op: api.DirOpHeld})
		}
	}
	a.dirSend(ctx, ops)
}

// dirRetry sends again the notifications homes did not take, as the ledger
// has the claims now (a claim released meanwhile is sent as gone, one
// committed again as held), to their homes now.
func (a *Agent) dirRetry(ctx context.Context) {
	d := a.dir
	d.undeliveredMu.Lock()
	ids := d.undelivered
	d.undelivered = map[string]bool{}
	d.undeliveredMu.Unlock()
	if len(ids) == 0 {
		return
	}
	var ops []api.DirOp
	for id := range ids {
		op := api.DirOp{ID: id, Op: api.DirOpGone}
		if c, err := a.ledger.Get(id); err == nil && c.State == ledger.StateCommitted {
			op.Op = api.DirOpHeld
		}
		ops = append(ops, op)
	}
	a.dirSend(ctx, ops)
}

// dirSend delivers ops to their homes, in batches of at most
// api.MaxDirUpdateIDs per home, the homes in parallel. The IDs of a batch a
// home does not take go to dirRetry.
func (a *Agent) dirSend(ctx context.Context, ops []api.DirOp) {
	targets := a.targets()
	byHome := map[string][]api.DirOp{}
	homes := map[string]target{}
	for _, op := range ops {
		h := homeOf(op.ID, targets)
		byHome[h.name] = append(byHome[h.name], op)
		homes[h.name] = h
	}
	var wg sync.WaitGroup
	for name, ops := range byHome {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range slices.Chunk(ops, api.MaxDirUpdateIDs) {
				a.dirSendTo(ctx, homes[name], batch)
			}
		}()
	}
	wg.Wait()
}

// dirSendTo delivers one batch to one home, parking its IDs for dirRetry
// when the home does not take it.
func (a *Agent) dirSendTo(ctx context.Context, home target, ops []api.DirOp) {
	if a.dirDeliver(ctx, home, api.DirUpdate{From: a.cfg.NodeName, Ops: ops}) {
		return
	}
	d := a.dir
	d.undeliveredMu.Lock()
	defer d.undeliveredMu.Unlock()
	for _, op := range ops {
		if len(d.undelivered) < dirQueueLen {
			d.undelivered[op.ID] = true
		}
	}
}

// dirDeliver sends u to home, with a few quick retries; false when the home
// did not take it.
func (a *Agent) dirDeliver(ctx context.Context, home target, u api.DirUpdate) bool {
	d, ok := home.owner.(api.Directory)
	if !ok {
		return true
	}
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		sctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		err := d.UpdateDirectory(sctx, u)
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if attempt == dirSendAttempts {
			a.log.Info("claim directory: a home did not take our notifications; retrying every second", "home", home.name, "claims", len(u.Ops), "err", err)
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait *= 4
	}
}

// newBoot is a random, non-zero identity of this agent's run.
func newBoot() uint64 { return rand.Uint64() | 1 }
