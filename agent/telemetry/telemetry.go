// Package telemetry is what NVML tells the agent while it runs: each GPU's
// telemetry, read on a timer so that a scrape only copies the last
// reading, and the XID errors the driver reports, counted and, when the
// card is at fault, fencing it. It is built from named dependencies
// (Deps), never from the agent.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/inventory"
)

// Interval is how often NVML is read for the metrics: a scrape only copies
// the last reading, so it stays cheap however often it comes.
const Interval = 10 * time.Second

// ignoredXIDs are the XIDs caused by the application, not the card (the
// same list NVIDIA's device plugin ignores by default): counted, not fenced.
var ignoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// NVML is what the watcher reads of NVML (*inventory.NVMLSource).
type NVML interface {
	Telemetry() (map[string]inventory.Telemetry, error)
	// WatchXID reports every XID error until ctx ends, or returns when
	// NVML cannot deliver events.
	WatchXID(ctx context.Context, report func(addr string, xid uint64)) error
}

// Host is this server's GPUs as an XID touches them (*host.Host).
type Host interface {
	GPU(addr string) (inventory.GPU, bool)
	// Fence takes a GPU out of every offer.
	Fence(addr, reason string)
}

// Deps is what a Watcher uses, by name.
type Deps struct {
	// NVML is nil when NVML does not answer: nothing is read then.
	NVML     NVML
	Host     Host
	Recorder events.Recorder
	Log      *slog.Logger
}

// Watcher keeps NVML's last reading per GPU and watches XID errors.
type Watcher struct {
	nvml NVML
	host Host
	rec  events.Recorder
	log  *slog.Logger

	mu   sync.RWMutex
	last map[string]inventory.Telemetry
}

// New builds a Watcher over d.
func New(d Deps) *Watcher {
	return &Watcher{nvml: d.NVML, host: d.Host, rec: d.Recorder, log: d.Log}
}

// Refresh reads NVML's telemetry again.
func (w *Watcher) Refresh() {
	if w.nvml == nil {
		return
	}
	t, err := w.nvml.Telemetry()
	if err != nil {
		w.log.Debug("NVML telemetry", "err", err)
		return
	}
	w.mu.Lock()
	w.last = t
	w.mu.Unlock()
}

// Last is the last reading, by PCI address; nil before the first.
func (w *Watcher) Last() map[string]inventory.Telemetry {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.last
}

// WatchXID counts XID errors and fences a card that reports one that is
// the card's fault. It returns when NVML cannot deliver events.
func (w *Watcher) WatchXID(ctx context.Context) {
	if w.nvml == nil {
		return
	}
	err := w.nvml.WatchXID(ctx, func(addr string, xid uint64) {
		g, _ := w.host.GPU(addr)
		w.rec.XID(addr, g.Model, xid)
		if slices.Contains(ignoredXIDs, xid) {
			w.log.Warn("XID error (application-caused, card kept)", "pci_address", addr, "xid", xid)
			return
		}
		w.host.Fence(addr, fmt.Sprintf("XID %d reported by the driver", xid))
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		w.log.Info("XID errors are not watched", "reason", err)
	}
}
