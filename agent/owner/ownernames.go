package owner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/vfio"
)

// The owner's side of the name registry (docs/names.md, "Fencing"): a
// reservation is a claim only once the registry holds its claim ID on
// this server (awaitHold, the claim path's one registry write, while the
// ledger's commit is written: commitahead.go), or, for a reservation made
// under a token (a resize's move), confirmed the token; and a released
// claim lets its name go once the ledger has let its GPUs go.

// usesEarly reports whether the commit of pending takes the early hold's
// answer: the hold was sent for the same request.
func usesEarly(pending ledger.Claim, early *earlyHold) bool {
	return early != nil && early.digest == digestOf(pending)
}

// awaitHold returns the registry's answer to the hold of pending's claim
// ID on this server: the early hold's when it was sent for this request,
// otherwise one sent now (the caller checked callerGone first).
func (o *Owner) awaitHold(ctx context.Context, pending ledger.Claim, recall bool, early *earlyHold) (names.Record, error) {
	if usesEarly(pending, early) {
		early.used = true
		return early.wait()
	}
	// Not cancelled with the request once sent: a hold that took effect
	// must be followed by the ledger commit it allows.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), api.NameTimeout)
	defer cancel()
	return timedName(o, func() (names.Record, error) {
		return o.names().Hold(cctx, names.Claim(pending.ID), pending.Coordinator, o.cfg.NodeName, digestOf(pending), recall)
	})
}

// holdRefused is the answer to a hold of pending's claim ID that failed
// with err: a refusal (the ID held on another server or under another
// request, being placed the two-step way, or lost) drops the reservation
// and names who has the ID; an unavailable registry keeps it, for the
// coordinator's retried commit. The caller holds the reservation's device
// locks.
func (o *Owner) holdRefused(ctx context.Context, pending ledger.Claim, err error) error {
	if r := (*names.RefusedError)(nil); errors.As(err, &r) {
		o.dropUnconfirmed(ctx, pending, err)
	}
	return o.holdError(pending.ID, err)
}

// callerGone is the answer to a caller that stopped waiting (its request's
// context ended: a coordinator that timed out, hung up or was killed), before
// this server writes anything on its behalf: no reservation, no name hold.
// A request can wait here behind another of the same ID — the claim's
// release holds its commit lock — and once that release is answered, the
// client may already count the ID free: a reservation and hold made for a
// caller long gone would bring the claim back after its acknowledged
// release, with nobody to use or release it. A caller still waiting is
// served; one that retries is a new request.
func (o *Owner) callerGone(ctx context.Context, id string) error {
	if ctx.Err() == nil {
		return nil
	}
	// At debug: a coordinator's timeout or restart is routine, but a run
	// whose claims came and went oddly is read against these lines.
	o.log.Debug("request for a claim not served: its caller stopped waiting", "claim", id, "cause", context.Cause(ctx))
	return &api.Error{Code: api.CodeUnavailable,
		Message: fmt.Sprintf("claim %s: nothing reserved or committed on %s: the caller stopped waiting (%v); retry", id, o.cfg.NodeName, context.Cause(ctx))}
}

// holdError is this owner's answer for a claim whose ID the registry did
// not hold here: unavailable (the reservation, if any, is kept for the
// coordinator's retried commit), or refused, naming who has the ID.
func (o *Owner) holdError(id string, err error) error {
	if names.IsUnavailable(err) {
		return &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s: not committed on %s, the name registry could not hold its ID: %v", id, o.cfg.NodeName, err)}
	}
	var r *names.RefusedError
	if !errors.As(err, &r) {
		return fmt.Errorf("claim %s: holding its name: %w", id, err)
	}
	if r.Code == names.CodeRecalled && r.Record != nil {
		return &api.Error{Code: api.CodeGoBack, Node: r.Record.Owner,
			Message: fmt.Sprintf("claim %s last ran on %s; not committed on %s: without any_node it goes back there", id, r.Record.Owner, o.cfg.NodeName)}
	}
	if r.Code == names.CodeLimit {
		return &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s: not committed on %s: %v; retry later", id, o.cfg.NodeName, err)}
	}
	holder, state := o.cfg.NodeName, "held"
	if r.Record != nil {
		holder = r.Record.Owner
		if r.Record.State == names.StatePending {
			holder, state = r.Record.Caller, "being placed"
		}
	}
	return &api.Error{Code: api.CodeConflict,
		Message: fmt.Sprintf("claim %s is %s on %s; not committed on %s", id, state, holder, o.cfg.NodeName)}
}

// digestOf is requestDigest of what a reservation holds.
func digestOf(c ledger.Claim) string {
	return RequestDigest(api.ReserveRequest{Items: c.Items, Labels: c.Labels})
}

// confirmName asks the registry to make this server the holder of the
// reservation pending's claim ID, under its token (a reservation made
// under a token: a resize's move, or a coordinator of an older version). The caller holds the
// reservation's device locks. A refusal (the grant ended: stale, expired;
// the ID held on another server) drops the reservation, so nothing is
// committed under a grant that no longer holds; an unavailable registry
// keeps it, for the coordinator's retried commit.
func (o *Owner) confirmName(ctx context.Context, pending ledger.Claim) (names.Record, error) {
	id := pending.ID
	if err := o.callerGone(ctx, id); err != nil {
		return names.Record{}, err
	}
	// Not cancelled with the request once sent: a confirmation that took
	// effect must be followed by the ledger commit it allows.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), api.NameTimeout)
	rec, err := o.names().Confirm(cctx, names.Claim(id), pending.NameToken, o.cfg.NodeName, nil)
	cancel()
	if err == nil {
		return rec, nil
	}
	if names.IsUnavailable(err) {
		return names.Record{}, &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s: not committed on %s, its name could not be confirmed: %v", id, o.cfg.NodeName, err)}
	}
	var r *names.RefusedError
	if !errors.As(err, &r) {
		return names.Record{}, fmt.Errorf("claim %s: confirming its name: %w", id, err)
	}
	o.dropUnconfirmed(ctx, pending, err)
	switch r.Code {
	case names.CodeStale, names.CodeExpired, names.CodeNotFound:
		return names.Record{}, &api.Error{Code: api.CodeLeaseExpired,
			Message: fmt.Sprintf("claim %s: not committed on %s: the name grant it was reserved under (token %d) ended first (%v); acquire the name again", id, o.cfg.NodeName, pending.NameToken, err)}
	case names.CodeConflict:
		holder := "another server"
		if r.Record != nil && r.Record.Owner != "" {
			holder = r.Record.Owner
		}
		return names.Record{}, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("claim %s is held on %s; not committed on %s", id, holder, o.cfg.NodeName)}
	}
	return names.Record{}, &api.Error{Code: api.CodeConflict,
		Message: fmt.Sprintf("claim %s: not committed on %s: %v", id, o.cfg.NodeName, err)}
}

// undoName lets go the name of reservation pending, held on this server
// for a commit that then failed in the ledger (its lease ran out, or a
// sweep dropped it, while the registry answered). confirmed is the record
// the registry answered a confirm with (zero when the name was held in
// one write). A name that came here by a move (a resize's) is not
// released: the server it came from held it until the confirm, and its
// copy is the claim; the name is handed back to it. Any other is released.
func (o *Owner) undoName(ctx context.Context, pending ledger.Claim, confirmed names.Record) {
	if confirmed.MovedFrom == "" || confirmed.MovedFrom == o.cfg.NodeName || confirmed.Owner != o.cfg.NodeName {
		o.releaseName(ctx, pending)
		return
	}
	if _, ok := o.names().(NameMover); !ok {
		o.releaseName(ctx, pending)
		return
	}
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), api.NameTimeout)
	defer cancel()
	if !o.handBack(hctx, confirmed) {
		o.log.Warn("a moved claim's commit failed after its name was confirmed here; the name stays here for the anti-entropy pass, which hands it back", "claim", pending.ID, "moved_from", confirmed.MovedFrom, "token", confirmed.Token)
	}
}

// heldHere checks that the registry holds claim c's ID on this server under
// the token c was committed with. A committed copy it does not hold there
// (one a move left behind, or one whose name was let go) is no claim to
// answer with: the anti-entropy pass releases it.
func (o *Owner) heldHere(ctx context.Context, c ledger.Claim) error {
	lctx, cancel := context.WithTimeout(ctx, api.NameTimeout)
	rec, err := o.names().Lookup(lctx, names.Claim(c.ID), names.Linearizable)
	cancel()
	if names.IsUnavailable(err) {
		return &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s is committed on %s, but the name registry could not say that it still holds it there: %v", c.ID, o.cfg.NodeName, err)}
	}
	held := err == nil && rec.State == names.StateHeld
	if held && rec.Owner == o.cfg.NodeName && rec.Token == c.NameToken {
		return nil
	}
	if held && rec.Move != nil && rec.Move.To == o.cfg.NodeName && o.confirmMoveHere(ctx, c, rec) {
		// The name was moving here (handed back by the server it had
		// moved to, which holds no copy): this copy takes it, as the
		// anti-entropy pass would.
		return nil
	}
	where := "nowhere"
	if held {
		where = fmt.Sprintf("on %s under token %d", rec.Owner, rec.Token)
	}
	return &api.Error{Code: api.CodeConflict,
		Message: fmt.Sprintf("claim %s: the copy on %s (token %d) is not the claim: the name registry holds the ID %s; the copy is released by the anti-entropy pass", c.ID, o.cfg.NodeName, c.NameToken, where)}
}

// dropUnconfirmed drops a reservation whose claim ID the registry refused
// to confirm and returns its GPUs to the idle driver. The caller holds the
// reservation's device locks.
func (o *Owner) dropUnconfirmed(ctx context.Context, pending ledger.Claim, why error) {
	c, err := o.ledger.AbortReservation(pending.ID, o.clk.Now())
	if err != nil {
		if !errors.Is(err, ledger.ErrNotFound) {
			o.log.Error("dropping a reservation whose name was not confirmed", "claim", pending.ID, "err", err)
		}
		return
	}
	o.rec.Reservation(events.ReservationAborted)
	o.log.Info("reservation dropped: the name registry did not confirm its claim ID", "claim", pending.ID, "token", pending.NameToken, "gpus", c.GPUs, "why", why)
	o.host.ToIdleLocked(context.WithoutCancel(ctx), "reservation "+pending.ID+" not confirmed", c.GPUs, "")
	o.changed()
}

// releaseName lets claim c's name go after a commit that failed once its
// name was held, with the token it was held under, as its holder. A
// registry that cannot be reached leaves the name held on this server
// until the owner's pass over names held without a claim
// (pendingNameRelease) lets it go.
func (o *Owner) releaseName(ctx context.Context, c ledger.Claim) {
	if o.names() == nil || c.NameToken == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), api.NameTimeout)
	_, err := o.names().Release(rctx, names.Claim(c.ID), c.NameToken, o.cfg.NodeName)
	cancel()
	o.noteNameRelease(c, err) // not found or stale: free already, or granted again since
}

// releasedName lets the name of claim c go after its ledger released it
// (a release; the GPUs are free whatever happens here). As releaseName,
// and more: a name held on this server under a newer token than the claim
// was committed under (a failed resize's undo moved it back here, and
// this server's pass had not recorded the token yet) is this claim's too,
// unless the ledger holds the ID again: it goes with the claim, instead of
// staying here without one. The caller holds the ID's commit lock since
// before the ledger released the claim: a hold of the ID here meanwhile
// would be answered with the very name this lets go. It reports whether
// the registry let the name go from here (then no copy elsewhere holds
// it), and whether it refused because it holds the ID on another server
// (then the copy released here was not the one it names).
func (o *Owner) releasedName(ctx context.Context, c ledger.Claim) (letGo, elsewhere bool) {
	if o.names() == nil || c.NameToken == 0 {
		return false, false
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), api.NameTimeout)
	defer cancel()
	// Where it ran is remembered with the release: a claim of the ID
	// without any_node comes back here (owner.awaitHold with recall).
	_, err := timedName(o, func() (names.Record, error) {
		return o.names().ReleaseRemembering(rctx, names.Claim(c.ID), c.NameToken, o.cfg.NodeName, time.Duration(o.cfg.RememberReleased))
	})
	var r *names.RefusedError
	if !errors.Is(err, names.ErrStale) || !errors.As(err, &r) || r.Record == nil ||
		r.Record.State != names.StateHeld || r.Record.Owner != o.cfg.NodeName || r.Record.Move != nil || r.Record.Token < c.NameToken {
		o.noteNameRelease(c, err)
		// r is set whenever the refusal is stale (the checks above ran).
		elsewhere = errors.Is(err, names.ErrStale) && r != nil && r.Record != nil && r.Record.Owner != o.cfg.NodeName
		return err == nil, elsewhere
	}
	if _, gerr := o.ledger.Get(c.ID); gerr == nil {
		return false, false // claimed here again: the name is that claim's
	}
	_, err = o.names().Release(rctx, names.Claim(c.ID), r.Record.Token, o.cfg.NodeName)
	if err == nil {
		o.log.Info("claim name let go under the newer token it was moved back here with", "claim", c.ID, "token", r.Record.Token, "committed_token", c.NameToken)
	}
	o.noteNameRelease(ledger.Claim{ID: c.ID, NameToken: r.Record.Token}, err)
	return err == nil, false
}

// releaseNameWhileSynced lets the name of claim c go (releasedName) while
// the ledger's release of c, written, is made durable: the two writes go
// to different disks and neither needs the other's result, as a claim's
// commit and its hold (docs/protocol.md, "Release"); the fdatasync waits
// a little for another writer's first (durableBeside). The release is
// answered once both are done. A crash between them leaves either the
// name held with no claim here, which the anti-entropy pass lets go, or,
// only if the machine lost its page cache, a claim whose name is gone: a
// leftover, which the pass releases.
func (o *Owner) releaseNameWhileSynced(ctx context.Context, c ledger.Claim, written ledger.Unsynced) (letGo, elsewhere bool, err error) {
	if o.names() == nil || c.NameToken == 0 {
		return false, false, written.Durable()
	}
	synced := make(chan error, 1)
	answered, done := o.beside()
	go func() { synced <- o.durableBeside(written, answered) }()
	letGo, elsewhere = o.releasedName(ctx, c)
	done()
	return letGo, elsewhere, <-synced
}

// noteNameRelease logs what became of a name release.
func (o *Owner) noteNameRelease(c ledger.Claim, err error) {
	switch {
	case err == nil:
	case errors.Is(err, names.ErrNotFound), errors.Is(err, names.ErrStale):
		o.log.Debug("claim name already let go", "claim", c.ID, "token", c.NameToken, "err", err)
	default:
		o.pendingNameRelease(c, err)
	}
}

// pendingNameRelease is where a name this server could not let go is left:
// logged for now, for the owner's background pass over names held on this
// server without a claim in its ledger, which releases them.
func (o *Owner) pendingNameRelease(c ledger.Claim, err error) {
	o.log.Warn("claim released, but its name is still held in the name registry; left for the owner's background pass over names without a claim",
		"claim", c.ID, "token", c.NameToken, "err", err)
}

// earlyHold is a claim ID's hold sent while its GPUs are still being
// reserved and bound (owner.holdEarly): the registry's write overlaps the
// owner's own work instead of following it. The ID's commit lock is held
// from before the hold to after the commit, so the anti-entropy pass
// (which takes it before freeing a name held here with no claim) never
// sees the name before its claim.
type earlyHold struct {
	digest string
	done   chan struct{}
	rec    names.Record
	err    error
	used   bool // the commit took its answer
	unlock func()
}

func (h *earlyHold) wait() (names.Record, error) {
	<-h.done
	return h.rec, h.err
}

// holdEarly starts the hold of a combined reserve-and-commit
// (ReserveRequest.Commit) placed without a token, when this server has no
// live claim or reservation under the ID (a lapsed reservation is replaced
// by this one) and, by its ledger, room for the request: the reservation
// will most likely stand, so holding now costs nothing extra. The ID's
// commit lock is then held over the reservation too, so a commit of the
// lapsed reservation waiting for it finds the new one made, not in the
// making. Otherwise, nil: the commit holds after the reservation, and a
// server without room writes nothing to the registry.
func (o *Owner) holdEarly(ctx context.Context, id string, rr api.ReserveRequest, req ledger.Request) *earlyHold {
	if o.names() == nil || !rr.Commit || rr.Token != 0 {
		return nil
	}
	free := o.ledger.Free(o.clk.Now())
	for _, it := range req.Items {
		if free[it.Model] -= it.Count; free[it.Model] < 0 {
			return nil
		}
	}
	unlock := o.commitLocks.Lock(id)
	if c, err := o.ledger.Get(id); ctx.Err() != nil || !errors.Is(err, ledger.ErrNotFound) && (err != nil || c.Live(o.clk.Now())) {
		// A coordinator that stopped waiting while this call waited for
		// the lock gets no hold (callerGone).
		unlock()
		return nil
	}
	h := &earlyHold{digest: RequestDigest(rr), done: make(chan struct{}), unlock: unlock}
	// The hold's request goes out before the reservation's own work: a
	// new goroutine otherwise waits for this one to block, and on a busy
	// machine the reservation and its binds ran first, the hold only after
	// them (0.3 ms of a claim's 3 in the 50-agent bench). Waiting for it
	// to start lets it run now, until its request is sent; this one is
	// next.
	started := make(chan struct{})
	go func() {
		defer close(h.done)
		close(started)
		// Not cancelled with the request, as in awaitHold.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), api.NameTimeout)
		defer cancel()
		h.rec, h.err = timedName(o, func() (names.Record, error) {
			return o.names().Hold(cctx, names.Claim(id), rr.Coordinator, o.cfg.NodeName, h.digest, rr.Recall)
		})
	}()
	<-started
	return h
}

// awaitHoldBeforeMoves waits for the early hold h, when there is one and
// binding this server's free GPUs moves their drivers (an idle driver
// other than vfio-pci), and returns the owner's answer when the registry
// refused it: a claim whose ID is held elsewhere (a retry placed through
// another agent) then reserves nothing and moves no driver. With vfio-pci
// as the idle driver, binding changes nothing, so the hold overlaps the
// reservation.
func (o *Owner) awaitHoldBeforeMoves(id string, h *earlyHold) error {
	if h == nil || o.cfg.IdlePolicy == vfio.IdleVFIO {
		return nil
	}
	if _, err := h.wait(); err != nil && !names.IsUnavailable(err) {
		return o.holdError(id, err)
	}
	return nil
}

// settleEarly ends an early hold once its Reserve is done, and lets the
// commit lock go: a hold the commit did not take (the reservation failed)
// is let go when this server holds no claim of the ID, so a refused
// reservation leaves no name behind.
func (o *Owner) settleEarly(ctx context.Context, h *earlyHold) {
	if h == nil {
		return
	}
	defer h.unlock()
	if h.used {
		return
	}
	rec, err := h.wait()
	if err != nil || rec.Owner != o.cfg.NodeName {
		return
	}
	if c, gerr := o.ledger.Get(rec.Name); gerr == nil && c.Live(o.clk.Now()) {
		return // a claim of the ID is here: the name is its
	}
	o.releaseName(ctx, ledger.Claim{ID: rec.Name, NameToken: rec.Token})
}

// RequestDigest is the registry's digest of a request: its items (counts
// by model, in model order) and labels, so every agent computes the same
// one for the same request, whatever order the caller listed them in, and
// the owner computes it again from its reservation (digestOf).
func RequestDigest(rr api.ReserveRequest) string {
	counts := map[string]int{}
	for _, it := range rr.Items {
		counts[it.Model] += it.Count
	}
	h := sha256.New()
	for _, m := range slices.Sorted(maps.Keys(counts)) {
		fmt.Fprintf(h, "item %q %d\n", m, counts[m])
	}
	for _, k := range slices.Sorted(maps.Keys(rr.Labels)) {
		fmt.Fprintf(h, "label %q %q\n", k, rr.Labels[k])
	}
	// Only pinned requests name devices, so every other digest is the
	// one it always was.
	for _, d := range rr.Devices {
		fmt.Fprintf(h, "device %q\n", d)
	}
	return "v1:" + hex.EncodeToString(h.Sum(nil))[:32]
}
