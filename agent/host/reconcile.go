package host

import "context"

// reconcile makes the machine agree with the ledger, as after a crash or a
// reboot: every GPU of a committed claim is on vfio-pci, and free GPUs
// follow the idle policy. Every change is logged.
//
// No reservation survives a restart, expired or not, and the ledger sees to
// it: reservations live in its memory only, and Open removes any that a
// file written by an older gpuherd still holds. That is by design: a lease
// was given on the clock of the previous run (a clock stepped back since
// would stretch it), and its coordinator has already seen this agent fail —
// a commit now finds nothing and the coordinator moves on, so nothing is
// lost. The GPUs such a reservation held are free here and go to the idle
// driver like any other free GPU.
func (h *Host) Reconcile(ctx context.Context) error {
	for _, c := range h.ledger.DroppedAtOpen() {
		h.log.Warn("reconcile: dropped a reservation an older gpuherd left in the ledger file", "claim", c.ID, "coordinator", c.Coordinator,
			"gpus", c.GPUs, "lease_ran_out", !c.Live(h.clk.Now()))
	}
	h.adoptRunningVMs()
	claims := h.ledger.List()
	held := map[string]string{}
	for _, c := range claims {
		for _, addr := range c.GPUs {
			held[addr] = c.ID
			if _, ok := h.GPU(addr); !ok {
				h.log.Error("reconcile: a claim holds a GPU this server no longer has; release the claim or bring the card back",
					"claim", c.ID, "pci_address", addr)
				continue
			}
			unlock := h.locks.Lock(addr)
			_ = h.Bind(ctx, "reconcile: claim "+c.ID, addr) // a failure fences the GPU; the claim stays
			unlock()
		}
	}
	h.mu.RLock()
	var free []string
	for _, addr := range h.order {
		if _, ok := held[addr]; !ok {
			free = append(free, addr)
		}
	}
	h.mu.RUnlock()
	unlock := h.locks.Lock(free...)
	h.ToIdleLocked(ctx, "reconcile: idle driver", free, "")
	unlock()
	h.log.Info("reconciled", "claims", len(claims), "free", len(free), "idle_driver", string(h.policy))
	return nil
}
