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
	changed := 0
	for _, c := range claims {
		for _, addr := range c.GPUs {
			held[addr] = c.ID
			if _, ok := a.gpu(addr); !ok {
				a.log.Error("reconcile: a claim holds a GPU this server no longer has; release the claim or bring the card back",
					"claim", c.ID, "pci_address", addr)
				continue
			}
			unlock := a.locks.lock(addr)
			res, err := a.binder.Bind(ctx, addr)
			unlock()
			if err != nil {
				a.fence(addr, fmt.Sprintf("reconcile: claimed by %s but bind to vfio-pci failed: %v", c.ID, err))
				continue
			}
			changed += len(res.Changes)
			logChanges(a, "reconcile: claim "+c.ID, res)
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
	for _, addr := range free {
		if a.health(addr) != "" {
			continue
		}
		unlock := a.locks.lock(addr)
		res, err := a.binder.Release(ctx, addr, a.policy)
		unlock()
		if err != nil {
			a.fence(addr, fmt.Sprintf("reconcile: idle driver %s: %v", a.policy, err))
			continue
		}
		changed += len(res.Changes)
		logChanges(a, "reconcile: idle driver", res)
	}
	a.log.Info("reconciled", "claims", len(claims), "expired", len(expired), "driver_changes", changed, "idle_driver", string(a.policy))
	return nil
}
