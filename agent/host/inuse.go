package host

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/vfio"
)

// A GPU in use is never moved. A VM's QEMU holds its GPUs' VFIO groups
// (/dev/vfio/N) open from start to stop; the agent finds those processes
// in /proc (vfio.ScanOpeners) and:
//   - refuses to release a claim whose GPUs are open (409 in_use) unless
//     the release is forced;
//   - never returns an open GPU to the idle driver: it stays "returning",
//     offered to nobody, until the group is closed (checkReturning);
//   - at start, adopts the GPUs of a VM that runs without a claim
//     (adoptRunningVMs), so they are never offered to anyone else.

const (
	// ReturnCheckInterval is how often GPUs kept back while open are
	// looked at again: one /proc scan, only while there are any.
	ReturnCheckInterval = time.Second
	// returnWarnEvery is how often a GPU still held open after its release
	// is logged again.
	returnWarnEvery = 5 * time.Minute
)

// vmUse is what the agent knows of the VMs using its GPUs.
type vmUse struct {
	proc vfio.ProcFS

	mu        sync.Mutex
	returning map[string]*returning // by PCI address
}

// returning is a free GPU kept back from the idle driver while a process
// holds its VFIO group open.
type returning struct {
	since  time.Time
	why    string
	by     vfio.Opener // zero when /proc could not be read
	warned time.Time
}

// ProcFor picks where the agent looks for VFIO users: the simulated
// machine's own /proc when it runs on one (the host's processes are not
// the simulation's), none on another injected sysfs (a test's: the host's
// processes are not its either), the configured proc root otherwise.
func ProcFor(fs vfio.FS, root string, injected bool) vfio.ProcFS {
	if k, ok := fs.(interface{ Proc() vfio.ProcFS }); ok {
		return k.Proc()
	}
	if injected {
		return noProcs{}
	}
	return vfio.NewOSProc(root)
}

// noProcs is a /proc without processes.
type noProcs struct{}

func (noProcs) ReadDir(string) ([]string, error) { return nil, nil }
func (noProcs) Readlink(string) (string, error)  { return "", os.ErrNotExist }
func (noProcs) ReadFile(string) ([]byte, error)  { return nil, os.ErrNotExist }

// openGroups returns the processes holding each VFIO group open. With an
// error, what it found (nil when /proc could not be read at all): the
// callers then act as if every other group were open.
func (h *Host) openGroups() (map[int][]vfio.Opener, error) {
	open, err := vfio.ScanOpeners(h.use.proc)
	if err != nil {
		return open, fmt.Errorf("finding the VMs that use GPUs (proc_root %s): %w", h.cfg.ProcRoot, err)
	}
	return open, nil
}

// userOf returns the process holding the GPU at addr's group open.
func (h *Host) userOf(addr string, open map[int][]vfio.Opener) (vfio.Opener, bool) {
	g, ok := h.GPU(addr)
	if !ok || g.IOMMUGroup < 0 || len(open[g.IOMMUGroup]) == 0 {
		return vfio.Opener{}, false
	}
	return open[g.IOMMUGroup][0], true
}

// refuseInUse is the answer to a release of claim id while a VM holds any
// of its GPUs open, or nil. A /proc that cannot be read refuses too: the
// agent cannot tell, and --force is the operator's way past it.
func (h *Host) RefuseInUse(id string, gpus []string) error {
	used, err := h.UsedBy(gpus)
	if err != nil {
		return &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s: cannot tell whether a VM uses its GPUs: %v; retry, or release with --force", id, err)}
	}
	if len(used) == 0 {
		return nil
	}
	h.counters.ReleaseRefusedInUse()
	h.log.Warn("release refused: a VM uses the claim's GPUs", "claim", id, "in_use", strings.Join(used, "; "))
	return &api.Error{Code: api.CodeInUse,
		Message: fmt.Sprintf("claim %s: %s; stop the VM first, or release with --force", id, strings.Join(used, "; "))}
}

// usedBy describes, for people, each GPU of gpus a process holds open.
// An incomplete scan is an error only when it found none of them open.
func (h *Host) UsedBy(gpus []string) ([]string, error) {
	open, err := h.openGroups()
	var used []string
	for _, addr := range gpus {
		if o, ok := h.userOf(addr, open); ok {
			used = append(used, fmt.Sprintf("GPU %s is in use by %s", addr, o))
		}
	}
	if len(used) == 0 && err != nil {
		return nil, err
	}
	return used, nil
}

// GroupScan scans /proc once, on first use: toIdleLocked needs it only
// when there is a GPU to return.
type GroupScan struct {
	h    *Host
	done bool
	open map[int][]vfio.Opener
	err  error
}

func (s *GroupScan) get() (map[int][]vfio.Opener, error) {
	if !s.done {
		s.open, s.err = s.h.openGroups()
		s.done = true
	}
	return s.open, s.err
}

// keepWhileOpen reports whether the free GPU at addr must not go to the
// idle driver yet: a process holds its group open (or /proc could not be
// read). It is then kept back as returning, offered to no claim, and
// checkReturning returns it once the group is closed. The caller holds
// the GPU's device lock.
func (h *Host) keepWhileOpen(addr, why string, scan *GroupScan) bool {
	open, err := scan.get()
	by, ok := h.userOf(addr, open)
	if !ok && err == nil {
		return false
	}
	h.use.mu.Lock()
	if h.use.returning == nil {
		h.use.returning = map[string]*returning{}
	}
	old, was := h.use.returning[addr]
	now := h.clk.Now()
	r := &returning{since: now, why: why, by: by, warned: now}
	if was {
		r.since, r.warned = old.since, old.warned
	}
	h.use.returning[addr] = r
	h.use.mu.Unlock()
	if !ok {
		h.log.Error("GPU kept from the idle driver: cannot tell whether a VM still uses it", "pci_address", addr, "why", why, "err", err)
	} else if !was {
		h.log.Warn("GPU kept from the idle driver while a VM holds its VFIO group open; it returns once the VM lets go",
			"pci_address", addr, "why", why, "pid", by.PID, "comm", by.Comm, "domain", by.Domain)
	}
	if !was {
		if err := h.PushInventory(); err != nil {
			h.log.Error("keeping GPU back", "pci_address", addr, "err", err)
		}
	}
	return true
}

// isReturning reports whether the GPU at addr is kept back while open.
func (u *vmUse) isReturning(addr string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	_, ok := u.returning[addr]
	return ok
}

func (u *vmUse) returningAddrs() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for addr := range u.returning {
		out = append(out, addr)
	}
	slices.Sort(out)
	return out
}

// CheckReturning returns to the idle driver every GPU kept back whose VFIO
// group is closed now; those still open stay, logged again every
// returnWarnEvery.
func (h *Host) CheckReturning(ctx context.Context) {
	addrs := h.use.returningAddrs()
	if len(addrs) == 0 {
		return
	}
	open, err := h.openGroups()
	if err != nil {
		// A partial picture cannot say a group is closed.
		h.log.Error("GPUs kept from the idle driver: cannot tell whether VMs still use them", "gpus", addrs, "err", err)
		return
	}
	returned := false
	for _, addr := range addrs {
		if o, ok := h.userOf(addr, open); ok {
			h.use.mu.Lock()
			r := h.use.returning[addr]
			warn := r != nil && h.clk.Now().Sub(r.warned) >= returnWarnEvery
			if r != nil {
				r.by = o
				if warn {
					r.warned = h.clk.Now()
				}
			}
			h.use.mu.Unlock()
			if warn {
				h.log.Warn("GPU still held open after its release; stop the VM to return it", "pci_address", addr,
					"pid", o.PID, "comm", o.Comm, "domain", o.Domain, "since", r.since)
			}
			continue
		}
		unlock := h.locks.Lock(addr)
		h.use.mu.Lock()
		r := h.use.returning[addr]
		delete(h.use.returning, addr)
		h.use.mu.Unlock()
		why := "VFIO group closed"
		if r != nil {
			why = r.why + ", after its VFIO group was closed"
		}
		h.ToIdleLocked(ctx, why, []string{addr}, "")
		if err := h.PushInventory(); err != nil { // offered again at once
			h.log.Error("returning GPUs", "err", err)
		}
		unlock()
		if !h.use.isReturning(addr) {
			h.log.Info("GPU returned: its VFIO group was closed", "pci_address", addr)
		}
		returned = true
	}
	if returned {
		h.changed()
	}
}

// annotateUse adds to a status what the ledger cannot say: which process
// holds each GPU open, and the GPUs kept back while open. An error says
// that /proc could not be read in full: who holds the GPUs is then not
// known for every one.
func (h *Host) AnnotateUse(gpus []api.GPU) error {
	open, err := h.openGroups()
	if err != nil {
		h.log.Warn("status: cannot tell which VMs use GPUs", "err", err)
	}
	for i := range gpus {
		g := &gpus[i]
		if o, ok := h.userOf(g.PCIAddress, open); ok {
			g.InUseBy = &api.InUse{PID: o.PID, Comm: o.Comm, Domain: o.Domain}
		}
		h.use.mu.Lock()
		r := h.use.returning[g.PCIAddress]
		h.use.mu.Unlock()
		if r != nil && g.State == api.StateUnhealthy && h.Health(g.PCIAddress) == "" {
			g.State = api.StateReturning
			g.Health = ""
		}
	}
	return err
}

// adoptedID names the claim adopted for the VM o on node: the domain when
// QEMU's command line names it, otherwise the PID. The node keeps it
// unique on the platform; bytes a claim ID may not hold become '-'.
func adoptedID(node string, o vfio.Opener) string {
	who := "pid" + strconv.Itoa(o.PID)
	if o.Domain != "" {
		who = o.Domain
	}
	b := []byte("adopted-" + node + "-" + who)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	if len(b) > ledger.MaxIDLen {
		b = b[:ledger.MaxIDLen]
	}
	return string(b)
}

// adoptRunningVMs, at start, takes the GPUs that a running VM holds open
// while no claim does (a VM started before gpuherd, or outside it) into a
// committed claim per VM, adopted-<node>-<domain or pid>, so that they are
// never offered to anyone else nor moved. Each is logged and counted: the
// operator names it in the platform, or releases it (--force while the VM
// runs) when the VM is not meant to keep its GPUs.
func (h *Host) adoptRunningVMs() {
	open, err := h.openGroups()
	if err != nil {
		h.log.Error("reconcile: cannot tell which VMs use GPUs; free GPUs stay on their drivers until it can", "err", err)
	}
	if len(open) == 0 {
		return
	}
	now := h.clk.Now()
	held := map[string]bool{}
	for _, c := range h.ledger.List() {
		if c.Live(now) {
			for _, g := range c.GPUs {
				held[g] = true
			}
		}
	}
	h.mu.RLock()
	order := slices.Clone(h.order)
	h.mu.RUnlock()
	type vm struct {
		by   vfio.Opener
		gpus []string
	}
	var vms []*vm
	byPID := map[int]*vm{}
	for _, addr := range order {
		o, ok := h.userOf(addr, open)
		if !ok || held[addr] {
			continue
		}
		v := byPID[o.PID]
		if v == nil {
			v = &vm{by: o}
			byPID[o.PID] = v
			vms = append(vms, v)
		}
		v.gpus = append(v.gpus, addr)
	}
	for _, v := range vms {
		id := adoptedID(h.cfg.NodeName, v.by)
		for n := 2; ; n++ {
			if _, err := h.ledger.Get(id); err != nil {
				break
			}
			id = fmt.Sprintf("%s-%d", adoptedID(h.cfg.NodeName, v.by), n)
		}
		c, err := h.ledger.Adopt(id, v.gpus, nil, now)
		if err != nil {
			h.log.Error("reconcile: a running VM holds GPUs no claim holds, and adopting them failed; they are not offered while it runs",
				"gpus", v.gpus, "pid", v.by.PID, "domain", v.by.Domain, "err", err)
			continue
		}
		h.counters.ClaimAdopted()
		h.log.Warn("reconcile: adopted the GPUs of a running VM as a claim; keep it under this ID, or release it once the VM is stopped",
			"claim", c.ID, "gpus", c.GPUs, "pid", v.by.PID, "comm", v.by.Comm, "domain", v.by.Domain)
	}
}

// KeepBack marks the free GPU at addr as kept back while open, as a release
// that finds its VFIO group open does, without scanning /proc. Tests open
// the window between a release in the ledger and that mark with it.
func (h *Host) KeepBack(addr, why string) {
	h.use.mu.Lock()
	defer h.use.mu.Unlock()
	if h.use.returning == nil {
		h.use.returning = map[string]*returning{}
	}
	now := h.clk.Now()
	h.use.returning[addr] = &returning{since: now, why: why, warned: now}
}

// SetProc replaces the /proc that VFIO users are found in; tests make it
// unreadable with it. Nothing may scan /proc at the same time.
func (h *Host) SetProc(p vfio.ProcFS) { h.use.proc = p }
