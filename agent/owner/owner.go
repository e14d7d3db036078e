package owner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
)

// The owner side of the protocol: what this server decides about its own
// GPUs, for itself or for a coordinator elsewhere. Every call is idempotent
// by claim ID.

// owner is this server's authority over its own GPUs (docs/protocol.md,
// "Roles"): the ledger-side check-and-take, commit, release, resize and
// capacity, for itself or for a coordinator elsewhere. It shares the
// agent's wiring (ledger, hardware, log, recorder).
// bindAttempts bounds how often a claim is retried on other GPUs after a
// GPU failed to bind. Each failure fences one GPU, so retries end anyway;
// the bound keeps a server whose every card misbehaves from taking minutes.
const bindAttempts = 8

// Reserve takes the GPUs of req on this server under a lease and binds them
// to vfio-pci; the coordinator then commits, or lets the lease run out. A GPU
// that fails to bind is fenced off and the reservation retried on the others.
func (o *Owner) Reserve(ctx context.Context, id string, rr api.ReserveRequest) (api.Claim, error) {
	req := ledger.Request{Items: slices.Clone(rr.Items), Labels: rr.Labels, NameToken: rr.Token, Devices: rr.Devices}
	if err := o.host.CheckFabric(id, req.Items); err != nil {
		o.rec.Reservation("failed")
		return api.Claim{}, err
	}
	// The ID's hold overlaps the reservation and its binds (ownernames.go).
	early := o.holdEarly(ctx, id, rr, req)
	defer o.settleEarly(ctx, early)
	if err := o.awaitHoldBeforeMoves(id, early); err != nil {
		return api.Claim{}, err
	}
	var refused *host.NotReadyFailure
	for attempt := 1; ; attempt++ {
		c, err := o.reserveAndBind(ctx, id, req, rr.Coordinator)
		if err != nil {
			var (
				bf *host.BindFailure
				nr *host.NotReadyFailure
			)
			if errors.As(err, &nr) {
				refused = nr
			}
			if (errors.As(err, &bf) || nr != nil) && attempt < bindAttempts {
				o.log.Warn("retrying reservation on other GPUs", "claim", id, "attempt", attempt, "err", err)
				continue
			}
			if ctx.Err() != nil {
				o.rec.Reservation(events.ReservationAbandoned) // callerGone
			} else {
				o.rec.Reservation(events.ReservationFailed)
			}
			return api.Claim{}, o.refusedError(err, refused)
		}
		o.rec.Reservation(events.ReservationReserved)
		if rr.Commit {
			return o.commitAtOnce(ctx, id, c, rr.Recall, early)
		}
		return o.ClaimView(c), nil
	}
}

// commitAtOnce commits reservation c in the call that made it
// (ReserveRequest.Commit). A commit that could not be decided now (the
// registry did not answer, a server fault) answers the reservation, which
// the coordinator commits again; a refusal is the answer, its reservation
// dropped. recall as in api.ReserveRequest; early, when not nil, is the
// ID's hold already under way, whose commit lock the caller holds.
func (o *Owner) commitAtOnce(ctx context.Context, id string, c ledger.Claim, recall bool, early *earlyHold) (api.Claim, error) {
	committed, err := o.commit(ctx, id, recall, early)
	var e *api.Error
	if err != nil && c.State == ledger.StateReserved && (!errors.As(err, &e) || e.ServerFault()) {
		o.log.Debug("reservation kept for the coordinator's commit", "claim", id, "err", err)
		return o.ClaimView(c), nil
	}
	return committed, err
}

// reserveAndBind reserves in the ledger, then binds each GPU, keeping the
// lease ahead of the binding. A GPU that fails is fenced, the reservation
// dropped and its other GPUs returned to the idle driver.
func (o *Owner) reserveAndBind(ctx context.Context, id string, req ledger.Request, coordinator string) (ledger.Claim, error) {
	if err := o.callerGone(ctx, id); err != nil {
		return ledger.Claim{}, err
	}
	lease := time.Duration(o.cfg.ReservationLease)
	prev, perr := o.ledger.Get(id)
	c, err := o.ledger.Reserve(id, req, coordinator, o.clk.Now(), lease)
	if err != nil {
		return ledger.Claim{}, err
	}
	fresh := c.State == ledger.StateReserved
	orphaned := replacedGPUs(prev, perr == nil, c)
	unlock := o.host.LockGPUs(append(slices.Clone(c.GPUs), orphaned...)...)
	defer unlock()
	if len(orphaned) > 0 {
		o.log.Warn("replaced the reservation of a placement that lost the claim ID", "claim", id,
			"old_coordinator", prev.Coordinator, "old_token", prev.NameToken, "token", c.NameToken, "old_gpus", prev.GPUs)
		o.host.ToIdleLocked(ctx, "reservation "+id+" replaced by a newer claim of the ID", orphaned, "")
	}
	// The claim may have gone between ledger.Reserve and the device locks:
	// a retry of the same claim through another coordinator adopts the
	// reservation, and the first coordinator's abort can drop it and return
	// its GPUs to the idle driver before this call gets the locks. Binding
	// them now would leave free GPUs on vfio-pci.
	if cur, err := o.ledger.Get(id); err != nil {
		return ledger.Claim{}, err
	} else if !cur.CreatedAt.Equal(c.CreatedAt) {
		return ledger.Claim{}, fmt.Errorf("claim %s: the reservation was replaced while waiting for its GPUs: %w", id, ledger.ErrNotFound)
	}
	if fresh {
		// A release frees its GPUs in the ledger before it can see that a
		// VM still holds one open and keep it back (under this lock): a
		// reservation made in between must not hand that GPU to a second
		// VM, whose QEMU would find its group busy.
		for _, addr := range c.GPUs {
			if o.host.IsReturning(addr) {
				if _, rerr := o.ledger.Release(id, o.clk.Now()); rerr != nil && !errors.Is(rerr, ledger.ErrNotFound) {
					o.log.Error("dropping reservation of a GPU kept back", "claim", id, "err", rerr)
				}
				return ledger.Claim{}, &host.BindFailure{Claim: id, Addr: addr, Err: host.ErrKeptBack}
			}
		}
		// Look before touching: every group this claim would bind is
		// checked before any binding changes.
		if err := o.host.LookBeforeBind(id, c.GPUs); err != nil {
			if _, rerr := o.ledger.Release(id, o.clk.Now()); rerr != nil && !errors.Is(rerr, ledger.ErrNotFound) {
				o.log.Error("dropping reservation refused before binding", "claim", id, "err", rerr)
			}
			return ledger.Claim{}, err
		}
	}
	extended := o.clk.Now()
	for _, addr := range c.GPUs {
		// Binding can take seconds per card: before each card, renew the
		// lease once a quarter of it has gone, so every bind starts with at
		// least three quarters left. Fast binds (cards already on vfio-pci)
		// renew nothing.
		if fresh && o.clk.Now().Sub(extended) > lease/4 {
			if _, err := o.ledger.Extend(id, o.clk.Now(), lease); err != nil {
				return ledger.Claim{}, err
			}
			extended = o.clk.Now()
		}
		if err := o.host.Bind(ctx, "claim "+id, addr); err != nil {
			if fresh {
				if _, rerr := o.ledger.Release(id, o.clk.Now()); rerr != nil && !errors.Is(rerr, ledger.ErrNotFound) {
					o.log.Error("dropping reservation after bind failure", "claim", id, "err", rerr)
				}
				o.host.ToIdleLocked(ctx, "reservation "+id+" dropped", c.GPUs, addr)
			}
			return ledger.Claim{}, &host.BindFailure{Claim: id, Addr: addr, Err: err}
		}
	}
	// Still under the device locks: a commit that takes them next knows
	// this reservation's GPUs are on vfio-pci.
	o.bound.Store(id, c.CreatedAt)
	return c, nil
}

// Commit makes a reservation a claim that survives crashes of this agent.
// It waits for a bind of the claim's GPUs still in progress (a retry through
// another coordinator can commit a reservation whose first coordinator is
// still binding) and makes sure every GPU is on vfio-pci before committing:
// a committed claim's GPUs are always ready for its VM. When this agent's
// own reservation bound them (all of them, under the device locks it takes
// here too), there is nothing left to check.
func (o *Owner) Commit(ctx context.Context, id string) (api.Claim, error) {
	return o.commit(ctx, id, false, nil)
}

// commit is Commit; recall and early as in commitAtOnce.
func (o *Owner) commit(ctx context.Context, id string, recall bool, early *earlyHold) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, o.apiError(err)
	}
	if early == nil {
		unlockID := o.commitLocks.Lock(id)
		defer unlockID()
	}
	pending, err := o.ledger.Get(id)
	if err != nil {
		return api.Claim{}, o.apiError(err)
	}
	if pending.State == ledger.StateCommitted && pending.NameToken != 0 && o.names() != nil {
		// Committed already (a retried commit, or a reserve and commit of
		// the same request): the answer is this claim only while the
		// registry holds its ID here.
		if err := o.heldHere(ctx, pending); err != nil {
			return api.Claim{}, err
		}
	}
	unlock := o.host.LockGPUs(pending.GPUs...)
	defer unlock()
	defer o.bound.Delete(id)
	// As in reserveAndBind: an abort or a sweep may have dropped the
	// reservation, and returned its GPUs to the idle driver, while this
	// call waited for the locks. Binding them then would leave free GPUs
	// on vfio-pci.
	if cur, err := o.ledger.Get(id); err != nil {
		return api.Claim{}, o.apiError(err)
	} else if !cur.CreatedAt.Equal(pending.CreatedAt) {
		return api.Claim{}, o.apiError(fmt.Errorf("claim %s: the reservation was replaced while waiting for its GPUs: %w", id, ledger.ErrNotFound))
	} else {
		pending = cur // a retry may have moved it to a newer name grant meanwhile
	}
	if pending.AwaitingName && o.names() != nil {
		// Committed ahead of its name by a commit that did not finish
		// (commitahead.go): the registry decides whether it stands.
		if pending, err = o.settleAwaiting(ctx, pending); err != nil {
			return api.Claim{}, err
		}
	}
	if pending.State == ledger.StateReserved && pending.Live(o.clk.Now()) && !o.boundBy(id, pending) {
		if err := o.host.LookBeforeBind(id, pending.GPUs); err != nil {
			return api.Claim{}, o.apiError(err)
		}
		for _, addr := range pending.GPUs {
			if err := o.host.Bind(ctx, "commit "+id, addr); err != nil {
				return api.Claim{}, o.apiError(&host.BindFailure{Claim: id, Addr: addr, Err: err})
			}
		}
	}
	// With a name registry, the claim ID must be held on this server
	// before the ledger commits it (ownernames.go): held in one write, or
	// confirmed under the token the reservation was made with.
	named := o.names() != nil && pending.State == ledger.StateReserved && pending.Live(o.clk.Now())
	var confirmed names.Record // the name confirmed under the reservation's token
	if named {
		if pending.NameToken != 0 {
			if confirmed, err = o.confirmName(ctx, pending); err != nil {
				return api.Claim{}, err
			}
		} else {
			// A new name: held and committed side by side.
			c, err := o.commitWhileHolding(ctx, pending, recall, early)
			if err != nil {
				return api.Claim{}, err
			}
			return o.committed(c), nil
		}
	}
	// Only the reservation checked above, whose name was just confirmed:
	// the ID may have been reserved again since (this one lapsed, or lost
	// its grant, and a reserve without an early hold, which takes no lock
	// of the ID before its ledger write, replaced it), and that one has no
	// name yet.
	c, err := o.ledger.CommitReservation(id, pending.CreatedAt, pending.NameToken, o.clk.Now())
	if err != nil {
		return api.Claim{}, o.commitFailed(ctx, pending, named, confirmed, err)
	}
	return o.committed(c), nil
}

// committed is the answer to a commit that wrote claim c.
func (o *Owner) committed(c ledger.Claim) api.Claim {
	o.rec.Reservation(events.ReservationCommitted)
	o.log.Info("claimed", "claim", c.ID, "gpus", c.GPUs, "coordinator", c.Coordinator)
	o.dirNote(c.ID, api.DirOpHeld)
	o.changed()
	return o.ClaimView(c)
}

// commitFailed is the answer to a commit of reservation pending that the
// ledger refused with err. When named (pending's name was held, its token
// set, or confirmed for the commit), the name goes with the failed
// commit, unless the ID was reserved again meanwhile (this reservation
// lapsed, a retry made another): that placement commits under the same
// hold.
func (o *Owner) commitFailed(ctx context.Context, pending ledger.Claim, named bool, confirmed names.Record, err error) error {
	if named && !o.reservedAgain(pending.ID, pending) {
		o.undoName(ctx, pending, confirmed)
	}
	if errors.Is(err, ledger.ErrLeaseExpired) {
		o.rec.Reservation(events.ReservationExpired)
		o.log.Warn("reservation expired before commit", "claim", pending.ID)
	}
	return o.apiError(err)
}

// reservedAgain reports whether the ledger holds id, reserved or
// committed, other than as the reservation pending.
func (o *Owner) reservedAgain(id string, pending ledger.Claim) bool {
	cur, err := o.ledger.Get(id)
	return err == nil && !cur.CreatedAt.Equal(pending.CreatedAt)
}

// boundBy reports whether reserveAndBind finished binding the GPUs of the
// reservation pending (this very one, not an earlier one under the same ID)
// in this process. The caller holds the GPUs' device locks.
func (o *Owner) boundBy(id string, pending ledger.Claim) bool {
	v, ok := o.bound.Load(id)
	return ok && v.(time.Time).Equal(pending.CreatedAt)
}

// Abort drops a claim of this server, committed or reserved, and returns its
// GPUs to the idle driver.
func (o *Owner) Abort(ctx context.Context, id string) (api.Claim, error) {
	return o.abort(ctx, id, false)
}

// AbortReservation drops a reservation of this server and returns its GPUs
// to the idle driver; a claim committed under the ID stays (409 conflict).
func (o *Owner) AbortReservation(ctx context.Context, id string) (api.Claim, error) {
	return o.abort(ctx, id, true)
}

func (o *Owner) abort(ctx context.Context, id string, reservationOnly bool) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, o.apiError(err)
	}
	o.bound.Delete(id)
	if !reservationOnly {
		if err := o.releasable(ctx, id); err != nil {
			return api.Claim{}, o.apiError(err)
		}
	}
	// From the ledger's release until the name is let go, no hold of the
	// ID here may run (releasedName): the registry would answer it with
	// the name being let go, and the new claim would be committed under
	// a name about to vanish.
	unlockID := o.commitLocks.Lock(id)
	why := "release " + id
	letGo, elsewhere := false, false
	var written ledger.Unsynced
	c, scan, unlock, err := o.host.ReleaseLocked(id, why, func() (c ledger.Claim, err error) {
		if reservationOnly {
			return o.ledger.AbortReservation(id, o.clk.Now())
		}
		c, written, err = o.ledger.ReleaseUnsynced(id, o.clk.Now(), time.Duration(o.cfg.RememberReleased))
		return c, err
	})
	if err != nil {
		unlockID()
		return api.Claim{}, o.apiError(err)
	}
	// The name is let go without the device locks: a registry write may
	// take a while, and GPUs a VM still holds are kept back already.
	unlock()
	if c.State == ledger.StateReserved {
		// Released in memory alone: nothing to make durable.
		o.rec.Reservation(events.ReservationAborted)
	} else {
		o.rec.Reservation(events.ReservationReleased)
		o.dirNote(id, api.DirOpGone)
		letGo, elsewhere, err = o.releaseNameWhileSynced(ctx, c, written)
	}
	unlockID()
	o.log.Info("released", "claim", id, "gpus", c.GPUs)
	unlock = o.host.LockGPUs(c.GPUs...)
	o.host.ToIdleScanned(ctx, why, c.GPUs, "", scan)
	unlock()
	o.changed()
	if err != nil {
		// The release is published, its GPUs back on the idle driver, but
		// its record is not known durable and the ledger takes no more
		// writes: not acknowledged. The caller retries once the agent is
		// restarted and has read back what its disk holds.
		return api.Claim{}, o.apiError(err)
	}
	view := o.ClaimView(c)
	view.NameReleased, view.NameElsewhere = letGo, elsewhere
	return view, nil
}

// Lookup returns one claim of this server.
func (o *Owner) Lookup(_ context.Context, id string) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, o.apiError(err)
	}
	c, err := o.ledger.Get(id)
	if err == nil && !c.Live(o.clk.Now()) {
		err = fmt.Errorf("claim %s: reservation expired: %w", id, ledger.ErrNotFound)
	}
	if err != nil {
		return api.Claim{}, o.apiError(err)
	}
	return o.ClaimView(c), nil
}

// List returns the live claims of this server.
func (o *Owner) List(context.Context) ([]api.Claim, error) {
	cs := o.ledger.List()
	out := make([]api.Claim, 0, len(cs))
	now := o.clk.Now()
	for _, c := range cs {
		if c.Live(now) {
			out = append(out, o.ClaimView(c))
		}
	}
	return out, nil
}

// ResizeInPlace changes a committed claim of this server in place: new GPUs are
// bound to vfio-pci, dropped ones return to the idle driver. The GPUs the
// claim gains are bound before the ledger hands them over, so a GPU the
// ledger calls claimed is on vfio-pci from that moment, as for a new claim.
func (o *Owner) ResizeInPlace(ctx context.Context, id string, items []api.Item) (api.Claim, error) {
	req := ledger.Request{Items: slices.Clone(items)}
	if err := o.host.CheckFabric(id, req.Items); err != nil {
		return api.Claim{}, err
	}
	before, err := o.ledger.Get(id)
	if err != nil {
		return api.Claim{}, o.apiError(err)
	}
	// Every device lock: a reservation taken between the plan and the
	// resize can make the ledger pick other GPUs than planned, and those
	// must be bindable here without taking locks out of order. Resizes
	// are rare; binds of other claims on this server wait for this one.
	all := append(o.host.Addresses(), before.GPUs...)
	unlock := o.host.LockGPUs(all...)
	defer unlock()
	plan, err := o.ledger.PlanResize(id, req, o.clk.Now())
	if err != nil {
		return api.Claim{}, o.apiError(err)
	}
	var adding []string
	for _, addr := range plan.GPUs {
		if !slices.Contains(before.GPUs, addr) {
			adding = append(adding, addr)
		}
	}
	if err := o.host.LookBeforeBind(id, adding); err != nil {
		return api.Claim{}, o.apiError(err)
	}
	var bound []string
	for _, addr := range plan.GPUs {
		if slices.Contains(before.GPUs, addr) {
			continue
		}
		if err := o.host.Bind(ctx, "resize "+id, addr); err != nil {
			o.host.ToIdleLocked(ctx, "resize "+id+" failed", bound, "")
			return api.Claim{}, o.apiError(&host.BindFailure{Claim: id, Addr: addr, Err: err})
		}
		bound = append(bound, addr)
	}
	c, err := o.ledger.Resize(id, req, o.clk.Now())
	if err != nil {
		o.host.ToIdleLocked(ctx, "resize "+id+" failed", bound, "")
		return api.Claim{}, o.apiError(err)
	}
	for _, addr := range c.GPUs {
		if slices.Contains(before.GPUs, addr) || slices.Contains(bound, addr) {
			continue
		}
		// Picked instead of a planned GPU that a reservation took
		// meanwhile: already in the claim, so bound after the fact.
		if err := o.host.Bind(ctx, "resize "+id, addr); err != nil {
			// The claim holds a GPU that is not on vfio-pci: say so; the
			// VM start would fail on it and the operator sees it fenced.
			return api.Claim{}, o.apiError(&host.BindFailure{Claim: id, Addr: addr, Err: err})
		}
	}
	o.host.ToIdleLocked(ctx, "resize "+id, append(before.GPUs, bound...), "")
	o.log.Info("resized", "claim", id, "from", before.GPUs, "to", c.GPUs)
	o.changed()
	return o.ClaimView(c), nil
}

// Capacity is this server's free GPUs per model now, from its ledger.
func (o *Owner) Capacity(context.Context) (api.Capacity, error) {
	free := map[string]int{}
	for m, t := range o.ledger.Totals(o.clk.Now()) {
		free[m] = t.Free
	}
	return api.Capacity{Free: free, Drained: o.drained()}, nil
}

// Sweep drops reservations whose lease ran out and returns their GPUs to
// the idle driver.
func (o *Owner) Sweep(ctx context.Context) {
	expired, err := o.ledger.Expire(o.clk.Now())
	if err != nil {
		o.log.Error("expiring reservations", "err", err)
		return
	}
	for _, c := range expired {
		o.bound.Delete(c.ID)
		o.rec.Reservation(events.ReservationExpired)
		o.log.Warn("reservation expired without commit; GPUs freed", "claim", c.ID, "coordinator", c.Coordinator, "gpus", c.GPUs)
		unlock := o.host.LockGPUs(c.GPUs...)
		o.host.ToIdleLocked(ctx, "reservation "+c.ID+" expired", c.GPUs, "")
		unlock()
	}
	if len(expired) > 0 {
		o.changed()
	}
}

// replacedGPUs returns the GPUs of prev, the live reservation under the ID
// before a Reserve that returned c, when c replaced it under a newer name
// token; nil otherwise. The caller returns them to the idle driver (those c
// took again stay bound: toIdleLocked skips held GPUs).
func replacedGPUs(prev ledger.Claim, found bool, c ledger.Claim) []string {
	if !found || prev.State != ledger.StateReserved || prev.CreatedAt.Equal(c.CreatedAt) ||
		c.NameToken == 0 || prev.NameToken >= c.NameToken {
		return nil
	}
	return slices.Clone(prev.GPUs)
}
