package agent

import (
	"context"
	"fmt"
	"os"

	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/telemetry"
	"github.com/gpuherd/gpuherd/gossip"
	"github.com/gpuherd/gpuherd/metrics"
)

// newTelemetry builds a's watcher of NVML's readings (agent/telemetry);
// it reads nothing when NVML does not answer.
func newTelemetry(a *Agent) *telemetry.Watcher {
	d := telemetry.Deps{Host: a.host, Recorder: a.rec, Log: a.log}
	if a.nvml != nil {
		d.NVML = a.nvml
	}
	return telemetry.New(d)
}

// metricsSnapshot is what one scrape shows: built from the ledger, the
// inventory, the cached telemetry and the gossip view, never from the
// hardware directly.
func (a *Agent) metricsSnapshot() metrics.Snapshot {
	v := VersionInfo()
	snap := metrics.Snapshot{Build: metrics.BuildInfo{Version: v.Version, Revision: v.Commit, GoVersion: v.Go}}
	tele := a.tele.Last()
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
		if c.Named() { // a commit awaiting its name counts as reserved
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
