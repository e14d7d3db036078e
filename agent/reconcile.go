package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpuherd/gpuherd/agent/ledger"
)

// reconcile makes the machine agree with the ledger, as after a crash or a
// reboot: reservations are dropped, every GPU of a committed claim is on
// vfio-pci, and free GPUs follow the idle policy. Every change is logged.
//
// No reservation survives a restart, expired or not: its lease was written
// on the clock of the previous run (a clock stepped back since would stretch
// it), and its coordinator has already seen this agent fail — a commit now
// finds nothing and the coordinator moves on, so nothing is lost.
func (a *Agent) reconcile(ctx context.Context) error {
	dropped := 0
	for _, c := range a.ledger.List() {
		if c.State != ledger.StateReserved {
			continue
		}
		if _, err := a.ledger.Release(c.ID, a.now()); err != nil && !errors.Is(err, ledger.ErrNotFound) {
			return fmt.Errorf("reconcile: dropping reservation %s: %w", c.ID, err)
		}
		dropped++
		a.log.Warn("reconcile: dropped a reservation left by the previous run", "claim", c.ID, "coordinator", c.Coordinator,
			"gpus", c.GPUs, "lease_ran_out", !c.Live(a.now()))
	}
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
			unlock := a.locks.lock(addr)
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
	unlock := a.locks.lock(free...)
	a.toIdleLocked(ctx, "reconcile: idle driver", free, "")
	unlock()
	a.log.Info("reconciled", "claims", len(claims), "reservations_dropped", dropped, "free", len(free), "idle_driver", string(a.policy))
	return nil
}
