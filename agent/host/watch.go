package host

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/vfio"
)

// The PCI watch: one subscription to the kernel's PCI uevents per agent,
// shared by everything that must follow the machine without a restart.
// Readiness is its first handler; others register with OnPCIChange.

// PCIHandler is told about PCI changes on this server. events is a batch
// in the kernel's order, deduplicated by nothing; an empty batch means
// events were lost (or the configuration was reloaded) and the handler
// must re-read whatever it follows. Handlers run one at a time on the
// watch goroutine, after readiness has been updated for the batch; they
// must not block for long (no sysfs write deadlines longer than a bind).
type PCIHandler func(ctx context.Context, events []vfio.PCIEvent)

// pciWatch is the agent's PCI event source and its handlers.
type pciWatch struct {
	mu       sync.Mutex
	handlers []PCIHandler
	// resync asks the watch goroutine to act as if events were lost
	// (SIGHUP); one slot, so reloads in a burst coalesce.
	resync chan struct{}
}

// OnPCIChange registers h to run on every batch of PCI events (and with an
// empty batch after a reload or lost events). Register before Run; a
// handler added later sees the batches from then on.
func (h *Host) OnPCIChange(fn PCIHandler) {
	h.watch.mu.Lock()
	h.watch.handlers = append(h.watch.handlers, fn)
	h.watch.mu.Unlock()
}

// Resync makes the watch re-read every GPU's IOMMU group and call every
// handler with an empty batch, as after lost events; a reload calls it.
func (h *Host) Resync() {
	select {
	case h.watch.resync <- struct{}{}:
	default:
	}
}

// batchWindow is how long the watch collects further events after the
// first before acting: a rebind is an unbind and a bind microseconds
// apart, a card's functions move together.
const batchWindow = 20 * time.Millisecond

// openPCIEvents subscribes to the PCI uevents; nil when there is no
// source (no netlink): groups are then re-read on reload only.
func (h *Host) OpenPCIEvents(ctx context.Context) <-chan vfio.PCIEvent {
	if h.events == nil {
		return nil
	}
	ch, err := h.events.WatchPCI(ctx)
	if err != nil {
		h.log.Warn("PCI uevents not watched: IOMMU groups are re-read on `systemctl reload gpuherd` only", "err", err)
		return nil
	}
	return ch
}

// watchPCI applies the PCI uevents of events, and resync requests, until
// ctx ends.
func (h *Host) WatchPCI(ctx context.Context, events <-chan vfio.PCIEvent) {
	for {
		var batch []vfio.PCIEvent
		resync := false
		select {
		case <-ctx.Done():
			return
		case <-h.watch.resync:
			resync = true
		case ev, ok := <-events:
			if !ok {
				if ctx.Err() == nil {
					h.log.Error("PCI uevents stopped: IOMMU groups are re-read on `systemctl reload gpuherd` only")
				}
				events = nil
				continue
			}
			batch = append(batch, ev)
			timer := h.clk.NewTimer(batchWindow)
		collect:
			for {
				select {
				case ev, ok := <-events:
					if !ok {
						break collect
					}
					batch = append(batch, ev)
				case <-timer.C():
					break collect
				case <-ctx.Done():
					timer.Stop()
					return
				}
			}
			timer.Stop()
		}
		h.handlePCI(ctx, batch, resync)
	}
}

// handlePCI applies one batch: readiness first, then the registered
// handlers.
func (h *Host) handlePCI(ctx context.Context, batch []vfio.PCIEvent, resync bool) {
	var addrs []string
	for _, ev := range batch {
		if ev.Action == vfio.UeventResync {
			resync = true
			continue
		}
		addrs = append(addrs, ev.Address)
	}
	why := "PCI change"
	gpus := h.gpusTouchedBy(slices.Compact(slices.Sorted(slices.Values(addrs))))
	if resync {
		why, gpus = "re-read of every IOMMU group", h.Addresses()
		batch = nil
	}
	if len(gpus) > 0 {
		h.log.Debug("PCI change: re-reading IOMMU groups", "events", len(batch), "gpus", gpus)
		h.refreshReadiness(ctx, why, gpus)
	}
	h.watch.mu.Lock()
	hs := slices.Clone(h.watch.handlers)
	h.watch.mu.Unlock()
	for _, fn := range hs {
		fn(ctx, batch)
	}
}

// checkDriversOnEvents runs the driver check (driverwatch.go) for the GPUs
// whose IOMMU group a batch touched, and for every GPU after lost events or
// a reload, so that a GPU rebound behind the ledger is put back at once
// rather than at the next driver_check_interval. The agent's own binds
// cause events too: the check takes each GPU's device lock, so it looks
// only after such a move is done, and then finds nothing to do.
func (h *Host) CheckDriversOnEvents(ctx context.Context, events []vfio.PCIEvent) {
	if len(events) == 0 {
		h.CheckDrivers(ctx, nil)
		return
	}
	var addrs []string
	for _, ev := range events {
		if ev.Address != "" {
			addrs = append(addrs, ev.Address)
		}
	}
	if gpus := h.gpusTouchedBy(addrs); len(gpus) > 0 {
		h.CheckDrivers(ctx, gpus)
	}
}
