package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/internal/clock"
	"github.com/gpuherd/gpuherd/vfio"
)

// The hardware side of claims: binding a claim's GPUs to vfio-pci and
// returning free GPUs to the idle driver.

type bindFailure struct {
	claim, addr string
	err         error
}

// errKeptBack: a GPU released while a VM still holds its VFIO group open
// is kept back from new claims until the VM lets go.
var errKeptBack = errors.New("a VM still holds its VFIO group open after its release; it is offered again once the VM lets go")

func (b *bindFailure) Error() string {
	if errors.Is(b.err, errKeptBack) {
		return fmt.Sprintf("claim %s: GPU %s was not taken: %v", b.claim, b.addr, b.err)
	}
	if errors.Is(b.err, vfio.ErrGroupNotViable) {
		return fmt.Sprintf("claim %s: GPU %s could not be bound to vfio-pci: its IOMMU group changed and cannot be passed through now (the GPU is unusable; nothing of its group was written): %v", b.claim, b.addr, b.err)
	}
	return fmt.Sprintf("claim %s: GPU %s could not be bound to vfio-pci and was fenced off: %v", b.claim, b.addr, b.err)
}

func (b *bindFailure) Unwrap() error { return b.err }

// bind moves one GPU's group to vfio-pci, fencing the GPU when it fails.
// The caller holds the GPU's device lock.
func (a *Agent) bind(ctx context.Context, why, addr string) error {
	start := a.clk.Now()
	mctx, cancel := a.moveContext(ctx, addr) // moves.go: no client cancels a move
	res, err := a.binder.Bind(mctx, addr)
	cancel()
	a.rec.VFIOOperation(events.VFIOBind, clock.Since(a.clk, start), err)
	if errors.Is(err, vfio.ErrGroupNotViable) {
		// Refused before any write: the group changed since it was
		// looked at. Unusable, not broken. (The device lock is held:
		// nothing may be moved from here.)
		a.noteReadiness(why, []string{addr})
		return err
	}
	if err != nil {
		a.fence(addr, fmt.Sprintf("bind to vfio-pci failed (%s): %v", why, err))
		return err
	}
	logChanges(a, why, res)
	return nil
}

// toIdleLocked returns the GPUs of addrs that no live claim holds to the
// idle driver, skipping skip. The caller holds their device locks, so a
// claim that takes one of them now binds it only after this returns. Failures
// fence the GPU; the release itself already happened in the ledger.
func (a *Agent) toIdleLocked(ctx context.Context, why string, addrs []string, skip string) {
	a.toIdleScanned(ctx, why, addrs, skip, &groupScan{a: a})
}

// toIdleScanned is toIdleLocked with the /proc scan of a releaseLocked.
func (a *Agent) toIdleScanned(ctx context.Context, why string, addrs []string, skip string, scan *groupScan) {
	for _, addr := range a.unclaimed(addrs) {
		if addr == skip || a.health(addr) != "" || a.unusable(addr) != "" || a.keepWhileOpen(addr, why, scan) {
			continue // fenced, its group cannot be passed through, or a VM holds it: left where it is
		}
		start := a.clk.Now()
		mctx, cancel := a.moveContext(ctx, addr) // moves.go: no client cancels a move
		res, err := a.binder.Release(mctx, addr, a.policy)
		cancel()
		a.rec.VFIOOperation(events.VFIORelease, clock.Since(a.clk, start), err)
		if err != nil {
			a.fence(addr, fmt.Sprintf("could not be put on the idle driver %s (%s): %v", a.policy, why, err))
			continue
		}
		logChanges(a, why, res)
	}
}

// unclaimed keeps the addresses that no live claim holds (a GPU freed by an
// expired reservation may already be in a new claim).
func (a *Agent) unclaimed(addrs []string) []string {
	held := map[string]bool{}
	for _, s := range a.ledger.GPUStates(a.clk.Now()) {
		if s.ClaimID != "" {
			held[s.GPU.Address] = true
		}
	}
	var out []string
	for _, addr := range addrs {
		if !held[addr] {
			out = append(out, addr)
		}
	}
	return out
}

// logChanges logs every driver change of a bind or release: the operator's
// record of what gpuherd did to the machine, and why.
func logChanges(a *Agent, why string, res vfio.Result) {
	for _, ch := range res.Changes {
		a.log.Info("driver changed", "why", why, "pci_address", ch.Address, "from", orNone(ch.From), "to", orNone(ch.To))
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// releaseLocked frees a claim's GPUs in the ledger (release, a ledger call
// on the claim id) under their device locks and, before those locks go,
// keeps back every one of them whose VFIO group a process still holds
// open. A reservation can take a GPU in the ledger the moment it is free,
// but binds it only under its device lock, and then finds it kept back
// (owner.reserveAndBind): a second VM never gets a group a first one still
// holds. Keeping back here, and not only in toIdleLocked, matters because
// toIdleLocked leaves alone a GPU a claim holds, and by then a reservation
// may hold it. The caller returns the GPUs to the idle driver with
// toIdleScanned and scan (under the locks, or under new ones), then calls
// unlock; unlock is nil with an error.
func (a *Agent) releaseLocked(id, why string, release func() (ledger.Claim, error)) (c ledger.Claim, scan *groupScan, unlock func(), err error) {
	var held []string
	if cur, gerr := a.ledger.Get(id); gerr == nil {
		held = cur.GPUs
	}
	unlock = a.locks.Lock(held...)
	c, err = release()
	if err != nil {
		unlock()
		return ledger.Claim{}, nil, nil, err
	}
	if !isSubset(c.GPUs, held) {
		// Reserved again under the same ID between the read and the
		// release: lock what the release freed.
		unlock()
		unlock = a.locks.Lock(c.GPUs...)
	}
	scan = &groupScan{a: a}
	for _, addr := range c.GPUs {
		if a.health(addr) == "" && a.unusable(addr) == "" {
			a.keepWhileOpen(addr, why, scan)
		}
	}
	return c, scan, unlock, nil
}

func isSubset(sub, of []string) bool {
	for _, s := range sub {
		if !slices.Contains(of, s) {
			return false
		}
	}
	return true
}
