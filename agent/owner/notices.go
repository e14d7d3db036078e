package owner

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/home"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// An owner keeps the homes of its claim IDs up to date (docs/protocol.md,
// "The claim directory"): a notice after every commit and release, in
// order, and all of its claims again when the membership changes.

const (
	dirQueueLen     = 4096        // owner-side notifications waiting to be sent
	dirSendAttempts = 3           // tries of one notification batch per home
	dirResync       = time.Minute // owners re-send where their claims are, at least this often
)

// dirNotices are the notifications this agent, as an owner, owes the homes
// of its claims.
type dirNotices struct {
	queue chan api.DirOp
	// undelivered holds the claim IDs whose notification a home did not
	// take; they are sent again, as the ledger has them then, every second.
	undeliveredMu sync.Mutex
	undelivered   map[string]bool
}

func newDirNotices() *dirNotices {
	return &dirNotices{queue: make(chan api.DirOp, dirQueueLen), undelivered: map[string]bool{}}
}

// dirNote queues a notification for the home of claim id: this agent, as
// its owner, committed it (DirOpHeld) or dropped it (DirOpGone).
func (o *Owner) dirNote(id, op string) {
	if o.cluster() == nil {
		return
	}
	select {
	case o.notices.queue <- api.DirOp{ID: id, Op: op}:
	default:
		o.log.Warn("claim directory queue full; the periodic resync will catch up", "claim", id)
	}
}

// RunNotices sends the owner's notifications to the homes, in order; re-sends
// every claim of this server when the membership changes (homes move) and
// every dirResync; and tells this agent's home of the membership changes,
// for when it may vouch.
func (o *Owner) RunNotices(ctx context.Context) {
	c := o.cluster()
	if c == nil {
		return
	}
	sub, cancel := c.Subscribe()
	defer cancel()
	o.dirMembership()
	resync := o.clk.NewTimer(o.spread(dirResync))
	defer resync.Stop()
	retry := o.clk.NewTicker(time.Second)
	defer retry.Stop()
	for {
		switch ev, op := o.nextNoticeEvent(ctx, sub, retry, resync); ev {
		case evStop:
			return
		case evNotice:
			o.dirSend(ctx, o.gatherNotices(ctx, op))
		case evMembership:
			if o.dirMembership() {
				o.dirResyncAll(ctx)
			}
		case evRetry:
			o.dirRetry(ctx)
		case evResync:
			o.dirResyncAll(ctx)
			resync.Reset(o.spread(dirResync))
		}
	}
}

// The events of the notice loop, in the order it takes them when several
// are ready.
const (
	evStop = iota
	evNotice
	evMembership
	evRetry
	evResync
)

// nextNoticeEvent waits for the notice loop's next event. What is ready is
// taken in a fixed order (notices, membership, retries, resync), not at the
// random pick of a select among ready cases, so that the deterministic
// simulation replays it; evStop when ctx ends or the membership closes.
func (o *Owner) nextNoticeEvent(ctx context.Context, sub <-chan struct{}, retry clock.Ticker, resync clock.Timer) (int, api.DirOp) {
	membership := func(ok bool) int {
		if !ok {
			return evStop
		}
		return evMembership
	}
	if ctx.Err() != nil {
		return evStop, api.DirOp{}
	}
	select {
	case op := <-o.notices.queue:
		return evNotice, op
	default:
	}
	select {
	case _, ok := <-sub:
		return membership(ok), api.DirOp{}
	default:
	}
	select {
	case <-retry.C():
		return evRetry, api.DirOp{}
	default:
	}
	select {
	case <-resync.C():
		return evResync, api.DirOp{}
	default:
	}
	select {
	case <-ctx.Done():
		return evStop, api.DirOp{}
	case op := <-o.notices.queue:
		return evNotice, op
	case _, ok := <-sub:
		return membership(ok), api.DirOp{}
	case <-retry.C():
		return evRetry, api.DirOp{}
	case <-resync.C():
		return evResync, api.DirOp{}
	}
}

// noticeGather is how long the first notice of a batch waits for others:
// the notices of one step (a release and its name) go in one batch, and
// which batch a notice joins does not depend on how goroutines ran.
const noticeGather = time.Millisecond

// gatherNotices is a batch: first, and the notices queued within
// noticeGather of it, up to api.MaxDirUpdateIDs.
func (o *Owner) gatherNotices(ctx context.Context, first api.DirOp) []api.DirOp {
	batch := []api.DirOp{first}
	t := o.clk.NewTimer(noticeGather)
	defer t.Stop()
	for len(batch) < api.MaxDirUpdateIDs {
		select {
		case op := <-o.notices.queue:
			batch = append(batch, op)
		case <-t.C():
			return batch
		case <-ctx.Done():
			return batch
		}
	}
	return batch
}

// spread spreads a period over ±25% so that servers do not resync in step.
func (o *Owner) spread(d time.Duration) time.Duration { return o.jitter(d*3/4, d*5/4) }

// dirMembership tells this agent's home the usable members now, and reports
// whether they changed (a member came, went, or restarted behind the same
// name): then the homes of some IDs moved.
func (o *Owner) dirMembership() bool {
	c := o.cluster()
	if c == nil {
		return false
	}
	return o.home.NoteMembership(c.Usable())
}

// dirResyncAll re-sends every claim this server holds to its home.
func (o *Owner) dirResyncAll(ctx context.Context) {
	var ops []api.DirOp
	for _, c := range o.ledger.List() {
		if c.Named() {
			ops = append(ops, api.DirOp{ID: c.ID, Op: api.DirOpHeld})
		}
	}
	o.dirSend(ctx, ops)
	// Apart: a home older than `at` refuses the batch that carries it.
	o.dirSend(ctx, o.rememberedOps())
}

// dirRetry sends again the notifications homes did not take, as the ledger
// has the claims now (a claim released meanwhile is sent as gone, one
// committed again as held), to their homes now.
func (o *Owner) dirRetry(ctx context.Context) {
	d := o.notices
	d.undeliveredMu.Lock()
	ids := d.undelivered
	d.undelivered = map[string]bool{}
	d.undeliveredMu.Unlock()
	if len(ids) == 0 {
		return
	}
	var ops []api.DirOp
	for _, id := range slices.Sorted(maps.Keys(ids)) { // in a stable order: logs and the simulation replay
		op := api.DirOp{ID: id, Op: api.DirOpGone}
		if c, err := o.ledger.Get(id); err == nil && c.Named() {
			op.Op = api.DirOpHeld
		}
		ops = append(ops, op)
	}
	o.dirSend(ctx, ops)
}

// dirSend delivers ops to their homes, in batches of at most
// api.MaxDirUpdateIDs per home, the homes in parallel. The IDs of a batch a
// home does not take go to dirRetry.
func (o *Owner) dirSend(ctx context.Context, ops []api.DirOp) {
	peers := o.peers()
	byHome := map[string][]api.DirOp{}
	homes := map[string]Peer{}
	for _, op := range ops {
		h := home.Of(op.ID, peers, func(p Peer) string { return p.Name })
		byHome[h.Name] = append(byHome[h.Name], op)
		homes[h.Name] = h
	}
	var wg sync.WaitGroup
	for name, ops := range byHome {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range slices.Chunk(ops, api.MaxDirUpdateIDs) {
				o.dirSendTo(ctx, homes[name], batch)
			}
		}()
	}
	wg.Wait()
}

// dirSendTo delivers one batch to one home, parking its IDs for dirRetry
// when the home does not take it.
func (o *Owner) dirSendTo(ctx context.Context, to Peer, ops []api.DirOp) {
	if o.dirDeliver(ctx, to, api.DirUpdate{From: o.cfg.NodeName, Ops: ops}) {
		return
	}
	d := o.notices
	d.undeliveredMu.Lock()
	defer d.undeliveredMu.Unlock()
	for _, op := range ops {
		if len(d.undelivered) < dirQueueLen {
			d.undelivered[op.ID] = true
		}
	}
}

// dirDeliver sends u to the home to, with a few quick retries; false when
// the home did not take it.
func (o *Owner) dirDeliver(ctx context.Context, to Peer, u api.DirUpdate) bool {
	d, ok := to.Owner.(api.Directory)
	if !ok {
		return true
	}
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		sctx, cancel := context.WithTimeout(ctx, api.LookupTimeout)
		err := d.UpdateDirectory(sctx, u)
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if attempt == dirSendAttempts {
			o.log.Info("claim directory: a home did not take our notifications; retrying every second", "home", to.Name, "claims", len(u.Ops), "err", err)
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-clock.After(o.clk, wait):
		}
		wait *= 4
	}
}

// NoticeOwed reports whether a notice about claim id waits to be sent
// again because its home did not take it.
func (o *Owner) NoticeOwed(id string) bool {
	o.notices.undeliveredMu.Lock()
	defer o.notices.undeliveredMu.Unlock()
	return o.notices.undelivered[id]
}
