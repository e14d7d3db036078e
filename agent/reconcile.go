package agent

import (
	"context"
	"fmt"
)

// reconcile makes the machine agree with the ledger, as after a crash or a
// reboot: expired reservations are dropped, every GPU of a live claim is on
// vfio-pci, and free GPUs follow the idle policy. Every change is logged.
func (a *Agent) reconcile(ctx context.Context) error {
	expired, err := a.ledger.Expire(a.now())
	if err != nil {
		return fmt.Errorf("reconcile: expiring reservations: %w", err)
	}
	for _, c := range expired {
		a.log.Warn("reconcile: dropped reservation whose lease ran out", "claim", c.ID, "coordinator", c.Coordinator, "gpus", c.GPUs)
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
	a.log.Info("reconciled", "claims", len(claims), "expired", len(expired), "free", len(free), "idle_driver", string(a.policy))
	return nil
}
