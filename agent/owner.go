package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
)

// The owner side of the protocol: what this server decides about its own
// GPUs, for itself or for a coordinator elsewhere. Every call is idempotent
// by claim ID.

var _ api.Owner = (*Agent)(nil)

// Reserve takes the GPUs of req on this server under a lease and binds them
// to vfio-pci; the coordinator then commits, or lets the lease run out. A GPU
// that fails to bind is fenced off and the reservation retried on the others.
func (a *Agent) Reserve(ctx context.Context, id string, rr api.ReserveRequest) (api.Claim, error) {
	req := ledger.Request{Labels: rr.Labels}
	for _, it := range rr.Items {
		req.Items = append(req.Items, ledger.Item{Model: it.Model, Count: it.Count})
	}
	for attempt := 1; ; attempt++ {
		c, err := a.reserveAndBind(ctx, id, req, rr.Coordinator)
		if err != nil {
			var bf *bindFailure
			if errors.As(err, &bf) && attempt < bindAttempts {
				a.log.Warn("retrying reservation on other GPUs", "claim", id, "attempt", attempt, "err", err)
				continue
			}
			a.rec.Reservation(ReservationFailed)
			return api.Claim{}, a.apiError(err)
		}
		a.rec.Reservation(ReservationReserved)
		return a.claimView(c), nil
	}
}

// reserveAndBind reserves in the ledger, then binds each GPU, keeping the
// lease ahead of the binding. A GPU that fails is fenced, the reservation
// dropped and its other GPUs returned to the idle driver.
func (a *Agent) reserveAndBind(ctx context.Context, id string, req ledger.Request, coordinator string) (ledger.Claim, error) {
	lease := time.Duration(a.cfg.ReservationLease)
	c, err := a.ledger.Reserve(id, req, coordinator, a.now(), lease)
	if err != nil {
		return ledger.Claim{}, err
	}
	fresh := c.State == ledger.StateReserved
	unlock := a.locks.lock(c.GPUs...)
	defer unlock()
	extended := a.now()
	for _, addr := range c.GPUs {
		// Binding can take seconds per card: before each card, renew the
		// lease once a quarter of it has gone, so every bind starts with at
		// least three quarters left. Fast binds (cards already on vfio-pci)
		// renew nothing.
		if fresh && a.now().Sub(extended) > lease/4 {
			if _, err := a.ledger.Extend(id, a.now(), lease); err != nil {
				return ledger.Claim{}, err
			}
			extended = a.now()
		}
		if err := a.bind(ctx, "claim "+id, addr); err != nil {
			if fresh {
				if _, rerr := a.ledger.Release(id, a.now()); rerr != nil && !errors.Is(rerr, ledger.ErrNotFound) {
					a.log.Error("dropping reservation after bind failure", "claim", id, "err", rerr)
				}
				a.toIdleLocked(ctx, "reservation "+id+" dropped", c.GPUs, addr)
			}
			return ledger.Claim{}, &bindFailure{claim: id, addr: addr, err: err}
		}
	}
	// Still under the device locks: a commit that takes them next knows
	// this reservation's GPUs are on vfio-pci.
	a.bound.Store(id, c.CreatedAt)
	return c, nil
}

// bind moves one GPU's group to vfio-pci, fencing the GPU when it fails.
// The caller holds the GPU's device lock.
func (a *Agent) bind(ctx context.Context, why, addr string) error {
	start := time.Now()
	res, err := a.binder.Bind(ctx, addr)
	a.rec.VFIOOperation(VFIOBind, time.Since(start), err)
	if err != nil {
		a.fence(addr, fmt.Sprintf("bind to vfio-pci failed (%s): %v", why, err))
		return err
	}
	logChanges(a, why, res)
	return nil
}

// Commit makes a reservation a claim that survives crashes of this agent.
// It waits for a bind of the claim's GPUs still in progress (a retry through
// another coordinator can commit a reservation whose first coordinator is
// still binding) and makes sure every GPU is on vfio-pci before committing:
// a committed claim's GPUs are always ready for its VM. When this agent's
// own reservation bound them (all of them, under the device locks it takes
// here too), there is nothing left to check.
func (a *Agent) Commit(ctx context.Context, id string) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, a.apiError(err)
	}
	pending, err := a.ledger.Get(id)
	if err != nil {
		return api.Claim{}, a.apiError(err)
	}
	unlock := a.locks.lock(pending.GPUs...)
	defer unlock()
	defer a.bound.Delete(id)
	if pending.State == ledger.StateReserved && pending.Live(a.now()) && !a.boundBy(id, pending) {
		for _, addr := range pending.GPUs {
			if err := a.bind(ctx, "commit "+id, addr); err != nil {
				return api.Claim{}, a.apiError(&bindFailure{claim: id, addr: addr, err: err})
			}
		}
	}
	c, err := a.ledger.Commit(id, a.now())
	if err != nil {
		if errors.Is(err, ledger.ErrLeaseExpired) {
			a.rec.Reservation(ReservationExpired)
			a.log.Warn("reservation expired before commit", "claim", id)
		}
		return api.Claim{}, a.apiError(err)
	}
	a.rec.Reservation(ReservationCommitted)
	a.log.Info("claimed", "claim", id, "gpus", c.GPUs, "coordinator", c.Coordinator)
	a.dirNote(id, api.DirOpHeld)
	a.changed()
	return a.claimView(c), nil
}

// boundBy reports whether reserveAndBind finished binding the GPUs of the
// reservation pending (this very one, not an earlier one under the same ID)
// in this process. The caller holds the GPUs' device locks.
func (a *Agent) boundBy(id string, pending ledger.Claim) bool {
	v, ok := a.bound.Load(id)
	return ok && v.(time.Time).Equal(pending.CreatedAt)
}

// Abort drops a claim of this server, committed or reserved, and returns its
// GPUs to the idle driver.
func (a *Agent) Abort(ctx context.Context, id string) (api.Claim, error) {
	return a.abort(ctx, id, false)
}

// AbortReservation drops a reservation of this server and returns its GPUs
// to the idle driver; a claim committed under the ID stays (409 conflict).
func (a *Agent) AbortReservation(ctx context.Context, id string) (api.Claim, error) {
	return a.abort(ctx, id, true)
}

func (a *Agent) abort(ctx context.Context, id string, reservationOnly bool) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, a.apiError(err)
	}
	a.bound.Delete(id)
	var (
		c   ledger.Claim
		err error
	)
	if reservationOnly {
		c, err = a.ledger.AbortReservation(id, a.now())
	} else {
		c, err = a.ledger.Release(id, a.now())
	}
	if err != nil {
		return api.Claim{}, a.apiError(err)
	}
	if c.State == ledger.StateReserved {
		a.rec.Reservation(ReservationAborted)
	} else {
		a.rec.Reservation(ReservationReleased)
		a.dirNote(id, api.DirOpGone)
	}
	a.log.Info("released", "claim", id, "gpus", c.GPUs)
	unlock := a.locks.lock(c.GPUs...)
	a.toIdleLocked(ctx, "release "+id, c.GPUs, "")
	unlock()
	a.changed()
	return a.claimView(c), nil
}

// Lookup returns one claim of this server.
func (a *Agent) Lookup(_ context.Context, id string) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, a.apiError(err)
	}
	c, err := a.ledger.Get(id)
	if err == nil && !c.Live(a.now()) {
		err = fmt.Errorf("claim %s: reservation expired: %w", id, ledger.ErrNotFound)
	}
	if err != nil {
		return api.Claim{}, a.apiError(err)
	}
	return a.claimView(c), nil
}

// List returns the live claims of this server.
func (a *Agent) List(context.Context) ([]api.Claim, error) {
	cs := a.ledger.List()
	out := make([]api.Claim, 0, len(cs))
	now := a.now()
	for _, c := range cs {
		if c.Live(now) {
			out = append(out, a.claimView(c))
		}
	}
	return out, nil
}

// ResizeInPlace changes a committed claim of this server in place: new GPUs are
// bound to vfio-pci, dropped ones return to the idle driver. The GPUs the
// claim gains are bound before the ledger hands them over, so a GPU the
// ledger calls claimed is on vfio-pci from that moment, as for a new claim.
func (a *Agent) ResizeInPlace(ctx context.Context, id string, items []api.Item) (api.Claim, error) {
	req := ledger.Request{}
	for _, it := range items {
		req.Items = append(req.Items, ledger.Item{Model: it.Model, Count: it.Count})
	}
	before, err := a.ledger.Get(id)
	if err != nil {
		return api.Claim{}, a.apiError(err)
	}
	// Every device lock: a reservation taken between the plan and the
	// resize can make the ledger pick other GPUs than planned, and those
	// must be bindable here without taking locks out of order. Resizes
	// are rare; binds of other claims on this server wait for this one.
	a.mu.RLock()
	all := append(slices.Clone(a.order), before.GPUs...)
	a.mu.RUnlock()
	unlock := a.locks.lock(all...)
	defer unlock()
	plan, err := a.ledger.PlanResize(id, req, a.now())
	if err != nil {
		return api.Claim{}, a.apiError(err)
	}
	var bound []string
	for _, addr := range plan.GPUs {
		if slices.Contains(before.GPUs, addr) {
			continue
		}
		if err := a.bind(ctx, "resize "+id, addr); err != nil {
			a.toIdleLocked(ctx, "resize "+id+" failed", bound, "")
			return api.Claim{}, a.apiError(&bindFailure{claim: id, addr: addr, err: err})
		}
		bound = append(bound, addr)
	}
	c, err := a.ledger.Resize(id, req, a.now())
	if err != nil {
		a.toIdleLocked(ctx, "resize "+id+" failed", bound, "")
		return api.Claim{}, a.apiError(err)
	}
	for _, addr := range c.GPUs {
		if slices.Contains(before.GPUs, addr) || slices.Contains(bound, addr) {
			continue
		}
		// Picked instead of a planned GPU that a reservation took
		// meanwhile: already in the claim, so bound after the fact.
		if err := a.bind(ctx, "resize "+id, addr); err != nil {
			// The claim holds a GPU that is not on vfio-pci: say so; the
			// VM start would fail on it and the operator sees it fenced.
			return api.Claim{}, a.apiError(&bindFailure{claim: id, addr: addr, err: err})
		}
	}
	a.toIdleLocked(ctx, "resize "+id, append(before.GPUs, bound...), "")
	a.log.Info("resized", "claim", id, "from", before.GPUs, "to", c.GPUs)
	a.changed()
	return a.claimView(c), nil
}
