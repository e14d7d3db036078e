package host

import (
	"context"
	"time"
)

// Driver moves (a bind to vfio-pci, a return to the idle driver) belong to
// the agent, not to whoever asked for them. A client that gives up, a peer
// whose request times out, or the agent's own shutdown cancels the
// request's context half-way through a group's sysfs writes; a move cut
// short there leaves the group between drivers, and its failure would fence
// a healthy GPU. So every move runs detached from the caller's
// cancellation, under the agent's own deadline for the whole group, and
// only a failure of the move itself (a write the kernel refused, or one
// that did not return within bind_timeout) fences the GPU.

// writesPerDevice is the most sysfs writes one device's move takes
// (driver_override, unbind, drivers_probe, bind).
const writesPerDevice = 4

// moveContext returns the context a move of the GPU at addr runs under:
// ctx's values (the caller, for the logs) without its cancellation or
// deadline, bounded by moveBudget instead.
func (h *Host) moveContext(ctx context.Context, addr string) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), h.moveBudget(addr))
}

// moveBudget is the agent's deadline for one move of the GPU at addr's
// IOMMU group: every member may take writesPerDevice writes, each bounded
// by bind_timeout, and a failed move rolls back as many again. The binder's
// per-write deadline ends a hung write long before this one; the budget
// only bounds the wait for the group's lock behind another move.
func (h *Host) moveBudget(addr string) time.Duration {
	members := 1
	h.pass.mu.RLock()
	if n := len(h.pass.members[addr]); n > members {
		members = n
	}
	h.pass.mu.RUnlock()
	return 2 * writesPerDevice * time.Duration(members) * time.Duration(h.cfg.BindTimeout)
}
