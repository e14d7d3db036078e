package host

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

// BindFailure is a GPU of a claim that could not be bound (or was kept
// back) while a reservation bound its GPUs.
type BindFailure struct {
	Claim, Addr string
	Err         error
}

// ErrKeptBack: a GPU released while a VM still holds its VFIO group open
// is kept back from new claims until the VM lets go.
var ErrKeptBack = errors.New("a VM still holds its VFIO group open after its release; it is offered again once the VM lets go")

func (b *BindFailure) Error() string {
	if errors.Is(b.Err, ErrKeptBack) {
		return fmt.Sprintf("claim %s: GPU %s was not taken: %v", b.Claim, b.Addr, b.Err)
	}
	if errors.Is(b.Err, vfio.ErrGroupNotViable) {
		return fmt.Sprintf("claim %s: GPU %s could not be bound to vfio-pci: its IOMMU group changed and cannot be passed through now (the GPU is unusable; nothing of its group was written): %v", b.Claim, b.Addr, b.Err)
	}
	return fmt.Sprintf("claim %s: GPU %s could not be bound to vfio-pci and was fenced off: %v", b.Claim, b.Addr, b.Err)
}

func (b *BindFailure) Unwrap() error { return b.Err }

// bind moves one GPU's group to vfio-pci, fencing the GPU when it fails.
// The caller holds the GPU's device lock.
func (h *Host) Bind(ctx context.Context, why, addr string) error {
	start := h.clk.Now()
	mctx, cancel := h.moveContext(ctx, addr) // moves.go: no client cancels a move
	res, err := h.binder.Bind(mctx, addr)
	cancel()
	h.rec.VFIOOperation(events.VFIOBind, clock.Since(h.clk, start), err)
	if errors.Is(err, vfio.ErrGroupNotViable) {
		// Refused before any write: the group changed since it was
		// looked at. Unusable, not broken. (The device lock is held:
		// nothing may be moved from here.)
		h.NoteReadiness(why, []string{addr})
		return err
	}
	if err != nil {
		h.Fence(addr, fmt.Sprintf("bind to vfio-pci failed (%s): %v", why, err))
		return err
	}
	logChanges(h, why, res)
	return nil
}

// toIdleLocked returns the GPUs of addrs that no live claim holds to the
// idle driver, skipping skip. The caller holds their device locks, so a
// claim that takes one of them now binds it only after this returns. Failures
// fence the GPU; the release itself already happened in the ledger.
func (h *Host) ToIdleLocked(ctx context.Context, why string, addrs []string, skip string) {
	h.ToIdleScanned(ctx, why, addrs, skip, &GroupScan{h: h})
}

// toIdleScanned is toIdleLocked with the /proc scan of a releaseLocked.
func (h *Host) ToIdleScanned(ctx context.Context, why string, addrs []string, skip string, scan *GroupScan) {
	for _, addr := range h.unclaimed(addrs) {
		if addr == skip || h.Health(addr) != "" || h.Unusable(addr) != "" || h.keepWhileOpen(addr, why, scan) {
			continue // fenced, its group cannot be passed through, or a VM holds it: left where it is
		}
		start := h.clk.Now()
		mctx, cancel := h.moveContext(ctx, addr) // moves.go: no client cancels a move
		res, err := h.binder.Release(mctx, addr, h.policy)
		cancel()
		h.rec.VFIOOperation(events.VFIORelease, clock.Since(h.clk, start), err)
		if err != nil {
			h.Fence(addr, fmt.Sprintf("could not be put on the idle driver %s (%s): %v", h.policy, why, err))
			continue
		}
		logChanges(h, why, res)
	}
}

// unclaimed keeps the addresses that no live claim holds (a GPU freed by an
// expired reservation may already be in a new claim).
func (h *Host) unclaimed(addrs []string) []string {
	held := map[string]bool{}
	for _, s := range h.ledger.GPUStates(h.clk.Now()) {
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
func logChanges(h *Host, why string, res vfio.Result) {
	for _, ch := range res.Changes {
		h.log.Info("driver changed", "why", why, "pci_address", ch.Address, "from", OrNone(ch.From), "to", OrNone(ch.To))
	}
}

// OrNone names a driver for people: "(none)" when there is none.
func OrNone(s string) string {
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
func (h *Host) ReleaseLocked(id, why string, release func() (ledger.Claim, error)) (c ledger.Claim, scan *GroupScan, unlock func(), err error) {
	var held []string
	if cur, gerr := h.ledger.Get(id); gerr == nil {
		held = cur.GPUs
	}
	unlock = h.locks.Lock(held...)
	c, err = release()
	if err != nil {
		unlock()
		return ledger.Claim{}, nil, nil, err
	}
	if !isSubset(c.GPUs, held) {
		// Reserved again under the same ID between the read and the
		// release: lock what the release freed.
		unlock()
		unlock = h.locks.Lock(c.GPUs...)
	}
	scan = &GroupScan{h: h}
	for _, addr := range c.GPUs {
		if h.Health(addr) == "" && h.Unusable(addr) == "" {
			h.keepWhileOpen(addr, why, scan)
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
