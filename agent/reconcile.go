package agent

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
func (a *Agent) reconcile(ctx context.Context) error {
	for _, c := range a.ledger.DroppedAtOpen() {
		a.log.Warn("reconcile: dropped a reservation an older gpuherd left in the ledger file", "claim", c.ID, "coordinator", c.Coordinator,
			"gpus", c.GPUs, "lease_ran_out", !c.Live(a.clk.Now()))
	}
	a.adoptRunningVMs()
	claims := a.ledger.List()
	held := map[string]string{}
	for _, c := range claims {
		for _, addr := range c.GPUs {
			held[addr] = c.ID
			if _, ok := a.gpu(addr); !ok {
				a.log.Error("reconcile: a claim holds a GPU this server no longer has; release the claim or bring the card back",
					"claim", c.ID, "pci_address", addr)
				continue
			}
			unlock := a.locks.Lock(addr)
			_ = a.bind(ctx, "reconcile: claim "+c.ID, addr) // a failure fences the GPU; the claim stays
			unlock()
		}
	}
	a.mu.RLock()
	var free []string
	for _, addr := range a.order {
		if _, ok := held[addr]; !ok {
			free = append(free, addr)
		}
	}
	a.mu.RUnlock()
	unlock := a.locks.Lock(free...)
	a.toIdleLocked(ctx, "reconcile: idle driver", free, "")
	unlock()
	a.log.Info("reconciled", "claims", len(claims), "free", len(free), "idle_driver", string(a.policy))
	return nil
}
