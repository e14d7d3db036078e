package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/gossip"
	"github.com/gpuherd/gpuherd/metrics"
)

// telemetryInterval is how often NVML is read for the metrics: a scrape
// only copies the last reading, so it stays cheap however often it comes.
const telemetryInterval = 10 * time.Second

// ignoredXIDs are the XIDs caused by the application, not the card (the
// same list NVIDIA's device plugin ignores by default): counted, not fenced.
var ignoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// telemetry caches NVML's last reading per GPU.
type telemetry struct {
	mu   sync.RWMutex
	last map[string]inventory.Telemetry
}

func (a *Agent) refreshTelemetry() {
	if a.nvml == nil {
		return
	}
	t, err := a.nvml.Telemetry()
	if err != nil {
		a.log.Debug("NVML telemetry", "err", err)
		return
	}
	a.tele.mu.Lock()
	a.tele.last = t
	a.tele.mu.Unlock()
}

// watchXID counts XID errors and fences a card that reports one that is
// the card's fault. It returns when NVML cannot deliver events.
func (a *Agent) watchXID(ctx context.Context) {
	if a.nvml == nil {
		return
	}
	err := a.nvml.WatchXID(ctx, func(addr string, xid uint64) {
		g, _ := a.host.GPU(addr)
		a.rec.XID(addr, g.Model, xid)
		if slices.Contains(ignoredXIDs, xid) {
			a.log.Warn("XID error (application-caused, card kept)", "pci_address", addr, "xid", xid)
			return
		}
		a.host.Fence(addr, fmt.Sprintf("XID %d reported by the driver", xid))
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		a.log.Info("XID errors are not watched", "reason", err)
	}
}

// metricsSnapshot is what one scrape shows: built from the ledger, the
// inventory, the cached telemetry and the gossip view, never from the
// hardware directly.
func (a *Agent) metricsSnapshot() metrics.Snapshot {
	v := VersionInfo()
	snap := metrics.Snapshot{Build: metrics.BuildInfo{Version: v.Version, Revision: v.Commit, GoVersion: v.Go}}
	a.tele.mu.RLock()
	tele := a.tele.last
	a.tele.mu.RUnlock()
	for _, s := range a.status.States() {
		g, _ := a.host.GPU(s.GPU.Address)
		mg := metrics.GPU{
			PCIAddress: s.GPU.Address,
			Model:      s.GPU.Model,
			DeviceID:   fmt.Sprintf("%04x", g.DeviceID),
			UUID:       g.UUID,
			IOMMUGroup: g.IOMMUGroup,
			NUMANode:   g.NUMANode,
			Driver:     g.Driver, // the inventory's, when the device cannot be read
			State:      string(s.Status),
			Healthy:    s.Status != ledger.GPUUnhealthy,
		}
		if s.Read {
			mg.Driver = s.Driver
		}
		if a.host.IsReturning(s.GPU.Address) && a.host.Health(s.GPU.Address) == "" {
			mg.State, mg.Healthy = metrics.StateReturning, true // kept back, not sick
		}
		if v, ok := a.host.Verdict(s.GPU.Address); ok && !v.Ready() {
			mg.UnusableReason = v.Code()
			for _, p := range v.Blocking {
				if p.Device != nil {
					mg.BlockingDevice = p.Device.PCIAddress
					break
				}
			}
		}
		if t, ok := tele[s.GPU.Address]; ok && mg.Driver == "nvidia" {
			mt := metrics.Telemetry(t)
			mg.Telemetry = &mt
		}
		snap.GPUs = append(snap.GPUs, mg)
	}
	for m, t := range a.ledger.Totals(a.clk.Now()) {
		snap.Models = append(snap.Models, metrics.ModelCapacity{Model: m, Total: t.Total, Free: t.Free, Healthy: t.Healthy, Unusable: t.Unusable})
	}
	for _, c := range a.ledger.List() {
		if !c.Live(a.clk.Now()) {
			continue
		}
		if c.State == ledger.StateCommitted {
			snap.Ledger.Committed++
		} else {
			snap.Ledger.Reserved++
		}
	}
	if fi, err := os.Stat(a.cfg.LedgerPath()); err == nil {
		snap.Ledger.FileBytes = fi.Size()
	}
	if c := a.cluster; c != nil {
		av, _ := a.Availability(context.Background())
		for _, m := range av.Models {
			snap.Cluster = append(snap.Cluster, metrics.ClusterModelCapacity{
				ModelCapacity:      metrics.ModelCapacity{Model: m.Model, Total: m.Total, Free: m.Free, Healthy: m.Healthy, Unusable: m.Unusable},
				MaxFreeOnOneServer: m.MaxFreeOnOneServer,
			})
		}
		snap.Members = map[string]int{}
		for _, m := range c.g.Members() {
			snap.Members[m.State]++
		}
		// Dead members outlive Members' remember period (gossip/dead.go).
		if n := c.g.DeadMembers(); n > 0 {
			snap.Members[gossip.StateDead] = n
		}
		score := c.g.HealthScore()
		snap.GossipHealthScore = &score
	}
	return snap
}

// Healthy is nil while the agent can serve: its ledger answers. The
// watchdog stops pinging systemd when it is not.
func (a *Agent) Healthy() error {
	if _, err := os.Stat(a.cfg.LedgerPath()); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	return nil
}
