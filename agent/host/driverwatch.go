package host

import (
	"context"
	"slices"

	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/vfio"
)

// The agent reconciles drivers with the ledger at start, and afterwards
// keeps watching: something else can rebind a GPU behind it — libvirt's
// managed='yes' hands a GPU back to nvidia when its VM stops, an operator
// runs a driver script. CheckDrivers is the check; it runs every
// driver_check_interval for every GPU (the backstop) and, through the PCI
// watch (watch.go, checkDriversOnEvents), for the GPUs whose IOMMU group a
// kernel uevent touches as soon as one arrives.

// CheckDrivers compares the driver of each GPU at addrs (every GPU when
// addrs is empty) with what the ledger expects, by the rule reconcile uses
// at start: a GPU of a committed claim is on vfio-pci; a free GPU is on
// vfio-pci or where the idle policy leaves it. A GPU found elsewhere is
// logged, counted (gpuherd_driver_changes_unexpected_total) and put back:
// bound to vfio-pci for its claim, or returned to the idle driver (which
// waits while a VM holds it open); a GPU that cannot be put back is
// fenced. Reserved, fenced and returning GPUs are skipped: they are in
// someone's hands. It returns how many GPUs it found off their driver.
func (h *Host) CheckDrivers(ctx context.Context, addrs []string) int {
	h.mu.RLock()
	if len(addrs) == 0 {
		addrs = slices.Clone(h.order)
	} else {
		addrs = slices.DeleteFunc(slices.Clone(addrs), func(addr string) bool { _, ok := h.gpus[addr]; return !ok })
	}
	h.mu.RUnlock()
	found := 0
	for _, addr := range addrs {
		if ctx.Err() != nil {
			break
		}
		if h.checkDriver(ctx, addr) {
			found++
		}
	}
	if found > 0 {
		h.changed()
	}
	return found
}

// checkDriver checks one GPU under its device lock, so that no bind or
// release of the agent's own is half-way while it looks.
func (h *Host) checkDriver(ctx context.Context, addr string) bool {
	if h.Health(addr) != "" || h.use.isReturning(addr) {
		return false
	}
	unlock := h.locks.Lock(addr)
	defer unlock()
	var st *ledger.GPUState
	for _, s := range h.ledger.GPUStates(h.clk.Now()) {
		if s.GPU.Address == addr {
			st = &s
			break
		}
	}
	if st == nil || st.Status == ledger.GPUReserved || st.Status == ledger.GPUUnhealthy || st.Status == ledger.GPUUnusable {
		return false // unusable: left on its driver on purpose (passthrough.go)
	}
	d, err := h.pci.Device(addr)
	if err != nil {
		return false // gone: CheckHealth fences it
	}
	switch {
	case st.ClaimID != "" && d.Driver != vfio.DriverVFIO:
		h.log.Warn("GPU of a claim rebound behind the ledger; binding it back to vfio-pci",
			"pci_address", addr, "claim", st.ClaimID, "driver", OrNone(d.Driver))
		h.counters.DriverChangeUnexpected(addr, d.Driver)
		_ = h.Bind(ctx, "driver check: claim "+st.ClaimID, addr) // a failure fences the GPU
		return true
	case st.ClaimID == "" && d.Driver != vfio.DriverVFIO && !h.policy.Accepts(d.Driver):
		h.log.Warn("free GPU rebound behind the ledger; returning it to the idle driver",
			"pci_address", addr, "driver", OrNone(d.Driver), "idle_driver", string(h.policy))
		h.counters.DriverChangeUnexpected(addr, d.Driver)
		h.ToIdleLocked(ctx, "driver check", []string{addr}, "")
		return true
	}
	return false
}
