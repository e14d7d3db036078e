package host

import (
	"context"
	"slices"
	"sync"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/vfio"
)

// Readiness for passthrough, as the agent keeps it: the last verdict of
// vfio.Assess for each GPU, taken at start, on every PCI event that touches
// a GPU's IOMMU group (watch.go), on reload, and by every claim before it
// writes anything. A GPU whose verdict blocks is "unusable": never free,
// never reserved, never counted as capacity, and left on whatever driver it
// is on.

// passState holds the verdicts and what decides them.
type passState struct {
	// assess serializes assessments from reading the configuration to
	// storing the verdicts: a watch batch that read the allow list before a
	// reload must not store its verdict after the reload's.
	assess   sync.Mutex
	mu       sync.RWMutex
	cfg      vfio.ReadinessConfig
	verdicts map[string]vfio.Verdict // by GPU address
	members  map[string][]string     // GPU address → its group's members at the last look
}

// initReadiness takes the first verdict of every GPU, before reconcile
// moves anything, and hands the result to the ledger.
func (h *Host) InitReadiness(allow vfio.AllowList) error {
	h.pass.mu.Lock()
	h.pass.cfg = vfio.ReadinessConfig{Allow: allow, AllowUnsafeInterrupts: h.cfg.AllowUnsafeInterrupts}
	h.pass.verdicts = map[string]vfio.Verdict{}
	h.pass.members = map[string][]string{}
	h.pass.mu.Unlock()
	h.assessGPUs(h.Addresses(), "start")
	return h.PushInventory()
}

// verdict returns the last verdict about the GPU at addr.
func (h *Host) Verdict(addr string) (vfio.Verdict, bool) {
	h.pass.mu.RLock()
	defer h.pass.mu.RUnlock()
	v, ok := h.pass.verdicts[addr]
	return v, ok
}

// unusable reports why the GPU at addr cannot be passed through now, or "".
func (h *Host) Unusable(addr string) string {
	v, _ := h.Verdict(addr)
	return v.Reason()
}

// assessGPUs reads the verdict of each GPU of addrs and keeps it. It
// returns the GPUs whose verdict changed and, of those, the ones that are
// ready now. A GPU that cannot be read at all is left to the health check.
func (h *Host) assessGPUs(addrs []string, why string) (changed, nowReady []string) {
	h.pass.assess.Lock()
	defer h.pass.assess.Unlock()
	h.pass.mu.RLock()
	cfg := h.pass.cfg
	h.pass.mu.RUnlock()
	host := h.pci.ReadHostFacts()
	for _, addr := range addrs {
		v, err := h.pci.Readiness(addr, cfg, &host)
		if err != nil {
			h.log.Debug("readiness: GPU not readable", "pci_address", addr, "err", err)
			continue
		}
		var members []string
		if g, ok := h.GPU(addr); ok && g.IOMMUGroup >= 0 {
			if ms, err := h.pci.GroupMembers(g.IOMMUGroup); err == nil {
				for _, m := range ms {
					members = append(members, m.Address)
				}
			}
		}
		h.pass.mu.Lock()
		old, seen := h.pass.verdicts[addr]
		h.pass.verdicts[addr] = v
		if members != nil {
			// Kept when the group could not be read: a removal must
			// still find the GPU it concerns.
			h.pass.members[addr] = members
		}
		h.pass.mu.Unlock()
		if seen && old.Equal(v) {
			continue
		}
		h.logVerdict(addr, why, old, seen, v)
		if !seen || old.Ready() != v.Ready() {
			changed = append(changed, addr)
			if v.Ready() && seen {
				nowReady = append(nowReady, addr)
			}
		}
	}
	return changed, nowReady
}

// logVerdict tells the operator what changed about a GPU, in the terms of
// what happened: nothing is released or moved by a verdict.
func (h *Host) logVerdict(addr, why string, old vfio.Verdict, seen bool, v vfio.Verdict) {
	drv := ""
	if d, err := h.pci.Device(addr); err == nil {
		drv = d.Driver
	}
	for _, w := range v.Warnings {
		h.log.Warn("GPU passthrough warning", "pci_address", addr, "code", w.Code, "problem", w.Message, "fix", w.Fix)
	}
	switch {
	case !v.Ready():
		for _, p := range v.Blocking {
			args := []any{"pci_address", addr, "why_checked", why, "code", p.Code, "problem", p.Message, "fix", p.Fix,
				"driver", OrNone(drv), "changed", "nothing: the GPU stays on its driver and is not offered"}
			if p.Device != nil {
				args = append(args, "blocking_device", p.Device.String())
			}
			h.log.Warn("GPU unusable: it cannot be passed through to a VM", args...)
		}
	case seen && !old.Ready():
		h.log.Info("GPU can be passed through again; offered", "pci_address", addr, "why_checked", why)
	}
}

// refreshReadiness re-reads the verdict of addrs; GPUs that became unusable
// leave the offer at once (the ledger, then gossip), GPUs that became ready
// go to the idle driver and are offered.
func (h *Host) refreshReadiness(ctx context.Context, why string, addrs []string) {
	changed, nowReady := h.assessGPUs(addrs, why)
	if len(changed) == 0 {
		return
	}
	if err := h.PushInventory(); err != nil {
		h.log.Error("readiness: handing the inventory to the ledger", "err", err)
	}
	for _, addr := range nowReady {
		unlock := h.locks.Lock(addr)
		if h.Unusable(addr) == "" {
			h.ToIdleLocked(ctx, "ready for passthrough ("+why+")", []string{addr}, "")
		}
		unlock()
	}
	h.changed()
}

// noteReadiness re-reads the verdict of addrs and takes the GPUs that
// became unusable out of the offer, moving nothing: the caller may hold
// their device locks (refreshReadiness, which also moves GPUs that became
// ready to the idle driver, takes them).
func (h *Host) NoteReadiness(why string, addrs []string) {
	if changed, _ := h.assessGPUs(addrs, why); len(changed) > 0 {
		if err := h.PushInventory(); err != nil {
			h.log.Error("readiness: handing the inventory to the ledger", "err", err)
		}
		h.changed()
	}
}

// gpusTouchedBy returns the GPUs whose IOMMU group holds one of addrs, now
// or at the last look (a removed device is no longer in any group).
func (h *Host) gpusTouchedBy(addrs []string) []string {
	var out []string
	groups := map[int]bool{}
	for _, addr := range addrs {
		if d, err := h.pci.Device(addr); err == nil && d.IOMMUGroup >= 0 {
			groups[d.IOMMUGroup] = true
		}
	}
	h.pass.mu.RLock()
	last := make(map[string][]string, len(h.pass.members))
	for k, v := range h.pass.members {
		last[k] = v
	}
	h.pass.mu.RUnlock()
	for _, gpu := range h.Addresses() {
		g, _ := h.GPU(gpu)
		hit := g.IOMMUGroup >= 0 && groups[g.IOMMUGroup]
		for _, addr := range addrs {
			hit = hit || addr == gpu || slices.Contains(last[gpu], addr)
		}
		if hit {
			out = append(out, gpu)
		}
	}
	return out
}

// ReloadReadiness applies a new allow list and allow_unsafe_interrupts (a
// configuration reload) and re-reads every GPU's verdict.
func (h *Host) ReloadReadiness(ctx context.Context, allow vfio.AllowList, allowUnsafeInterrupts bool) {
	h.binder.SetAllowList(allow)
	h.pass.mu.Lock()
	h.pass.cfg = vfio.ReadinessConfig{Allow: allow, AllowUnsafeInterrupts: allowUnsafeInterrupts}
	h.pass.mu.Unlock()
	h.refreshReadiness(ctx, "configuration reloaded", h.Addresses())
	h.Resync() // the other PCI handlers re-read too
}

// whyNotOffered is why a GPU is unhealthy, else why it is unusable, else "".
func (h *Host) WhyNotOffered(addr string) string {
	if why := h.Health(addr); why != "" {
		return why
	}
	return h.Unusable(addr)
}

// readinessView is the last verdict in the API's terms.
func (h *Host) Readiness(addr string) *api.Readiness {
	v, ok := h.Verdict(addr)
	if !ok {
		return nil
	}
	return ReadinessView(v)
}

// ReadinessView turns a verdict into the API's form; `gpuherd inventory`
// prints the same.
func ReadinessView(v vfio.Verdict) *api.Readiness {
	conv := func(ps []vfio.Problem) []api.Problem {
		var out []api.Problem
		for _, p := range ps {
			ap := api.Problem{Code: p.Code, Message: p.Message, Fix: p.Fix}
			if d := p.Device; d != nil {
				ap.BlockingDevice = &api.PCIDevice{PCIAddress: d.PCIAddress, Vendor: d.Vendor, Device: d.Device, Class: d.Class, Driver: d.Driver}
			}
			out = append(out, ap)
		}
		return out
	}
	return &api.Readiness{Ready: v.Ready(), Blocking: conv(v.Blocking), Warnings: conv(v.Warnings)}
}
