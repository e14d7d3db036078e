package owner

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// The commit written while the name is held (docs/protocol.md, "The
// commit is written while the hold is answered"). A new claim needs two durable
// writes: the registry's hold of its ID on this server, and the ledger's
// commit. Neither needs the other's result to be written, so the owner
// writes both at once and answers once both are durable: the ledger's
// commit, written while the hold is on its way, awaits its name
// (ledger.CommitAwaitingName) until the hold's answer settles it
// (ledger.SettleName, no fdatasync of its own) or a refusal unwinds it.
// A claim is answered committed only once settled, so the client sees no
// difference; what a crash between the two writes leaves, a commit
// awaiting its name, is settled from the registry (settleAwaiting): kept
// when the registry holds the ID here for its request, undone otherwise.

// commitWhileHolding commits reservation pending, whose ID has no name on
// this server yet, while the ID's hold (the early one, or one sent now)
// is answered. The caller holds the ID's commit lock and the GPUs' device
// locks; callerGone was not checked yet.
func (o *Owner) commitWhileHolding(ctx context.Context, pending ledger.Claim, recall bool, early *earlyHold) (ledger.Claim, error) {
	id := pending.ID
	if !usesEarly(pending, early) {
		if err := o.callerGone(ctx, id); err != nil {
			return ledger.Claim{}, err
		}
	}
	type written struct {
		c   ledger.Claim
		err error
	}
	write := make(chan written, 1)
	lapse := &deadlineLapse{done: make(chan struct{})}
	answered, done := o.beside()
	go func() {
		c, ahead, err := o.ledger.CommitAwaitingNameAhead(id, pending.CreatedAt, o.clk.Now())
		if err == nil {
			err = o.durableBeside(ahead, answered)
		}
		if err == nil {
			o.armLapse(ctx, lapse, pending)
		}
		write <- written{c, err}
	}()
	// The hold is awaited on this goroutine, as the answer's critical
	// path: the write is nearly always done by then.
	rec, herr := o.awaitHold(ctx, pending, recall, early)
	done()
	w := <-write
	if w.err != nil {
		// The ledger refused the commit (the lease ran out, the
		// reservation was replaced, the disk failed): as a commit after
		// the hold that fails.
		if herr != nil {
			return ledger.Claim{}, o.holdRefused(ctx, pending, herr)
		}
		pending.NameToken = rec.Token
		return ledger.Claim{}, o.commitFailed(ctx, pending, true, names.Record{}, w.err)
	}
	if lapse.taken() {
		// The reservation's deadline came first: the commit was taken
		// back, and the hold's answer only decides what to let go.
		lapsed := fmt.Errorf("claim %q: %w at %s, before the name registry answered the hold of its ID; its GPUs are free again: reserve anew",
			id, ledger.ErrLeaseExpired, pending.ExpiresAt.Format(time.RFC3339Nano))
		if herr != nil {
			return ledger.Claim{}, o.commitFailed(ctx, pending, false, names.Record{}, lapsed)
		}
		pending.NameToken = rec.Token
		return ledger.Claim{}, o.commitFailed(ctx, pending, true, names.Record{}, lapsed)
	}
	if herr != nil {
		// Written, but not held here: the reservation it was comes back
		// (for the coordinator's retried commit, when the registry did
		// not answer), or goes with the refusal (holdRefused).
		if removed, err := o.takeBack(ctx, pending, pending.ExpiresAt, "reservation "+id+" expired"); err != nil {
			// Still awaiting its name, and held by nobody: the
			// anti-entropy pass undoes it (settleAwaiting).
			o.log.Error("taking back a commit whose claim ID the registry did not hold", "claim", id, "err", err, "hold_err", herr)
		} else if removed {
			o.rec.Reservation(events.ReservationExpired)
		}
		return ledger.Claim{}, o.holdRefused(ctx, pending, herr)
	}
	c, err := o.ledger.SettleName(id, pending.CreatedAt, rec.Token)
	if err != nil {
		// The commit is durable and the name held here: the claim
		// stands, settled by the next look at it (a retried commit, the
		// anti-entropy pass). Until then it is not answered as a claim.
		o.log.Error("recording the name token of a claim committed while its name was held", "claim", id, "token", rec.Token, "err", err)
		return ledger.Claim{}, &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s: committed on %s, but its name token could not be recorded: %v; retry", id, o.cfg.NodeName, err)}
	}
	return c, nil
}

// takeBack takes back commit c, awaiting its name
// (ledger.UnwindAwaiting): to the reservation it was while until is ahead,
// removed otherwise, when its GPUs go to the idle driver (for reason). It
// reports whether c was removed. The caller holds the GPUs' device locks.
func (o *Owner) takeBack(ctx context.Context, c ledger.Claim, until time.Time, reason string) (removed bool, err error) {
	now := o.clk.Now()
	if _, err := o.ledger.UnwindAwaiting(c.ID, c.CreatedAt, until, now); err != nil {
		return false, err
	}
	if until.After(now) {
		return false, nil
	}
	o.host.ToIdleLocked(context.WithoutCancel(ctx), reason, c.GPUs, "")
	o.changed()
	return true, nil
}

// deadlineLapse is the reservation's deadline for a commit awaiting its
// name: a commit is decided by then, as the reservation it was would have
// been. A hold still unanswered at the deadline does not keep the GPUs:
// the commit is taken back and its GPUs go to the idle driver, as the
// sweep drops a reservation whose lease ran out; once the hold answers, a
// name it took here is let go, and the commit fails with the lease
// expired. The timer runs beside the hold's wait, so that the wait stays
// on the committing goroutine.
type deadlineLapse struct {
	// state: 0 while the hold is awaited; 1 once its answer came first;
	// 2 once the deadline did.
	state atomic.Int32
	timer clock.Timer
	done  chan struct{} // closed once the deadline's work is done
	gone  bool          // the commit was taken back (read after done)
}

// armLapse starts the deadline of the written commit of pending. The
// caller holds the ID's commit lock and the GPUs' device locks until the
// hold's answer, and so for as long as the timer's function can run.
func (o *Owner) armLapse(ctx context.Context, l *deadlineLapse, pending ledger.Claim) {
	l.timer = o.clk.AfterFunc(pending.ExpiresAt.Sub(o.clk.Now()), func() {
		if !l.state.CompareAndSwap(0, 2) {
			return
		}
		defer close(l.done)
		id := pending.ID
		if _, err := o.takeBack(ctx, pending, time.Time{}, "reservation "+id+" expired"); err != nil {
			// Still written: the hold's answer decides it after all.
			o.log.Error("taking back a commit whose lease ran out before the name registry answered", "claim", id, "err", err)
			return
		}
		o.log.Warn("reservation expired while the name registry held its ID: commit taken back, GPUs freed", "claim", id, "gpus", pending.GPUs)
		l.gone = true
	})
}

// taken reports, once the hold has answered, whether the deadline came
// first and took the commit back; it waits for that work to end.
func (l *deadlineLapse) taken() bool {
	if l.state.CompareAndSwap(0, 1) {
		l.timer.Stop()
		return false
	}
	<-l.done
	return l.gone
}

// settleAwaiting decides claim c, committed ahead of its name by a commit
// that did not finish (the agent was killed between the two writes, or a
// write after them failed), from the registry: the claim stands, with the
// registry's token, when the registry holds its ID on this server for its
// request; otherwise the hold never took effect here, nobody was told of
// the claim, and it is removed and its GPUs returned to the idle driver.
// A registry that does not answer, or a name still being placed, leaves
// it awaiting (an error). The caller holds the ID's commit lock and the
// GPUs' device locks.
func (o *Owner) settleAwaiting(ctx context.Context, c ledger.Claim) (ledger.Claim, error) {
	id := c.ID
	lctx, cancel := context.WithTimeout(ctx, api.NameTimeout)
	r, err := o.names().Lookup(lctx, names.Claim(id), names.Linearizable)
	cancel()
	here := err == nil && r.State == names.StateHeld && r.Owner == o.cfg.NodeName && r.Request == digestOf(c)
	switch {
	case here && r.Move == nil:
		settled, err := o.ledger.SetNameToken(id, r.Token)
		if err != nil {
			return c, o.apiError(err)
		}
		o.counters.ClaimAwaitingDecided(true)
		o.log.Info("claim committed ahead of its name settled: the registry holds its ID here", "claim", id, "token", r.Token, "gpus", c.GPUs)
		return settled, nil
	case errors.Is(err, names.ErrNotFound), err == nil && r.State == names.StateHeld && !here:
		if _, err := o.takeBack(ctx, c, time.Time{}, "claim "+id+" never held its name"); err != nil {
			return c, o.apiError(err)
		}
		holder := "nowhere"
		if err == nil {
			holder = r.Owner
		}
		o.log.Warn("claim committed ahead of its name undone: the registry does not hold its ID here; GPUs freed",
			"claim", id, "gpus", c.GPUs, "name_held", holder)
		o.counters.ClaimAwaitingDecided(false)
		o.rec.Reservation(events.ReservationAborted)
		return ledger.Claim{}, &api.Error{Code: api.CodeNotFound,
			Message: fmt.Sprintf("claim %s: its commit on %s was written ahead of its name, which the registry does not hold here; dropped", id, o.cfg.NodeName)}
	case err != nil:
		return c, &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s: committed on %s ahead of its name, which the registry could not confirm: %v; retry", id, o.cfg.NodeName, err)}
	default:
		return c, &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s: committed on %s ahead of its name, which the registry has %s on %s; retry", id, o.cfg.NodeName, r.State, r.Owner)}
	}
}

// What a pass did with a claim committed ahead of its name.
type awaitingOutcome int

const (
	awaitingGone      awaitingOutcome = iota // decided by the commit in flight
	awaitingSettled                          // kept: its name is held here
	awaitingUndone                           // removed: it is not
	awaitingUndecided                        // the registry did not say
)

// settleAwaitingInPass is settleAwaiting for the anti-entropy pass, which
// holds no lock: it takes the ID's commit lock (a commit in flight
// finishes first) and the GPUs' device locks.
func (o *Owner) settleAwaitingInPass(ctx context.Context, id string) awaitingOutcome {
	defer o.commitLocks.Lock(id)()
	c, err := o.ledger.Get(id)
	if err != nil || !c.AwaitingName {
		return awaitingGone
	}
	defer o.host.LockGPUs(c.GPUs...)()
	after, err := o.settleAwaiting(ctx, c)
	switch {
	case err == nil:
		return awaitingSettled
	case api.IsCode(err, api.CodeNotFound) && after.ID == "":
		return awaitingUndone
	}
	o.log.Warn("anti-entropy: a claim committed ahead of its name is not decided yet", "claim", id, "err", err)
	return awaitingUndecided
}
