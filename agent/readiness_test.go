package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/internal/testdisk"
)

// runAgent runs a until the test ends and returns once it serves.
func runAgent(t *testing.T, a *Agent) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, func() { close(ready) }) }()
	<-ready
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// Readiness turns 503 while the ledger refuses writes, and back once a
// write succeeds again.
func TestReadinessFollowsLedgerWrites(t *testing.T) {
	dir := t.TempDir()
	disk := testdisk.Mount(t, 1<<20)
	cfg := testConfig(t, dir)
	cfg.DataDir = filepath.Join(disk, "data")
	a := startAgent(t, cfg, machine(t, "dgx-h100", dir), nil)
	defer a.Close()
	runAgent(t, a)
	if err := a.readiness(); err != nil {
		t.Fatalf("ready before the disk fills: %v", err)
	}
	filler := testdisk.Fill(t, disk)
	ctx := context.Background()
	failed, _ := claimUntilDiskFull(t, a, map[string]string{"k": strings.Repeat("v", 200)})
	if err := a.readiness(); err == nil || !strings.Contains(err.Error(), "ledger unwritable") {
		t.Errorf("readiness on a full disk: %v", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Claim(ctx, failed+"-again", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.readiness(); err != nil {
		t.Errorf("readiness once the ledger writes again: %v", err)
	}
}

// An agent whose seeds never answer serves its own GPUs but is not ready:
// its view of the cluster may lack servers that hold claims.
func TestReadinessWaitsForGossipJoin(t *testing.T) {
	tc := newTestCluster(t)
	// An address no member of the in-memory network has: its members are
	// numbered 127.0.0.1:1, :2, … and the first one is this agent itself,
	// a seed Join skips (it then counts as joined at once).
	a := tc.startWith("lonely", "l40s-4", func(c *Config) { c.Join = []string{"127.0.0.1:65000"} })
	if err := a.readiness(); err == nil || !strings.Contains(err.Error(), "gossip not joined") {
		t.Errorf("readiness with no seed answering: %v", err)
	}
	b := tc.startWith("seed", "l40s-4", func(c *Config) { c.Join = nil })
	// The agent with a real seed joins and becomes ready.
	c := tc.startWith("joiner", "l40s-4", func(c *Config) { c.Join = []string{b.cluster.g.LocalAddr()} })
	waitFor(t, "joiner ready", 10*time.Second, func() bool { return c.readiness() == nil })
}
