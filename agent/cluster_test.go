package agent

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/claim"
	"github.com/gpuherd/gpuherd/agent/claimtest"
	"github.com/gpuherd/gpuherd/agent/pki"
	"github.com/gpuherd/gpuherd/gossip/gossiptest"
)

// fastGossip shortens memberlist's timers so that a loopback cluster
// converges in a fraction of a second. Probe rounds of 200 ms: with 100 ms
// ones, two packages' tests under -race on 2 cores missed acks often
// enough that a member was held suspect while a claim needed it.
func fastGossip(c *memberlist.Config) {
	c.ProbeInterval = 200 * time.Millisecond
	c.ProbeTimeout = 100 * time.Millisecond
	c.GossipInterval = 20 * time.Millisecond
	c.PushPullInterval = time.Second
	c.SuspicionMult = 2
}

// loadedGossip is fastGossip with probes that a loaded machine answers in
// time, for agents on real sockets. A probe with no ack makes the prober
// hold the member suspect, and a coordinator places nothing on a suspect:
// with 100 ms rounds, a 2-core machine running every package's tests under
// -race (make test) missed acks often enough that a claim which only fit
// there was answered "not available", and real sockets stall longer than
// in-memory packets. Capacity still spreads every 20 ms.
func loadedGossip(c *memberlist.Config) {
	fastGossip(c)
	c.ProbeInterval = 500 * time.Millisecond
	c.ProbeTimeout = 250 * time.Millisecond
	c.SuspicionMult = 3
}

type testCluster struct {
	t      testing.TB
	dir    string
	agents map[string]*Agent
	cancel map[string]context.CancelFunc
	done   map[string]chan error
	seed   string
	// adjust, when set, changes every agent's configuration.
	adjust func(*Config)
	// opts are added to every agent's options.
	opts []Option
	// peers and gossip carry the peer API and gossip in memory; both nil
	// in a socket cluster (mutual TLS and memberlist on loopback).
	peers  *claimtest.Network
	gossip *gossiptest.Network
	// clock, when set before the agents start, is every agent's clock: a
	// test moves it forward to run out leases without waiting for them.
	clock *offsetClock
	// tune, when set, replaces fastGossip as every agent's memberlist tuning.
	tune func(*memberlist.Config)
	// names is the name registry every agent shares (set by default; a
	// test of the registry-less path sets it nil before starting agents).
	names *testNames
	// logFor, when set, gives an agent its logger instead of a silent one.
	logFor func(name string) *slog.Logger
}

// newTestCluster starts an empty cluster whose agents talk in memory: the
// peer API through claimtest, gossip through gossiptest. Everything else
// (ledgers on disk, the fake kernel, the agent's code) is as in production.
func newTestCluster(t testing.TB) *testCluster {
	tc := newCluster(t)
	tc.peers, tc.gossip = &claimtest.Network{}, &gossiptest.Network{}
	return tc
}

// newSocketCluster starts an empty cluster whose agents talk as in
// production: mutual TLS and memberlist on loopback sockets. These are the
// integration tests: -short skips them (make test-short).
func newSocketCluster(t testing.TB) *testCluster {
	if testing.Short() {
		t.Skip("starts real agents with TLS and gossip on loopback: make test-integration or make test runs it")
	}
	tc := newCluster(t)
	// Real sockets, real registry: each agent runs its own, founded by
	// itself as in production.
	tc.names = nil
	tc.tune = loadedGossip
	return tc
}

func newCluster(t testing.TB) *testCluster {
	// Cluster tests spend most of their time waiting (gossip rounds,
	// leases), not computing: they run alongside each other.
	if p, ok := t.(interface{ Parallel() }); ok {
		p.Parallel()
	}
	dir := t.TempDir()
	if err := pki.CreateCA(filepath.Join(dir, "ca"), "test CA", 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	tc := &testCluster{t: t, dir: dir, agents: map[string]*Agent{}, cancel: map[string]context.CancelFunc{}, done: map[string]chan error{}}
	tc.names = newTestNames(t)
	t.Cleanup(func() {
		for name := range tc.agents {
			tc.stop(name)
		}
	})
	return tc
}

// start runs an agent named name on a simulated profile, joined to the
// first agent started.
func (tc *testCluster) start(name, profile string) *Agent {
	tc.t.Helper()
	return tc.startWith(name, profile, nil)
}

// startWith is start with the configuration adjusted by adjust.
func (tc *testCluster) startWith(name, profile string, adjust func(*Config)) *Agent {
	t := tc.t
	t.Helper()
	caDir, certDir := filepath.Join(tc.dir, "ca"), filepath.Join(tc.dir, "certs")
	if _, err := os.Stat(filepath.Join(certDir, name+".crt")); err != nil { // not a restart
		if err := pki.IssueCert(caDir, certDir, name, []string{"127.0.0.1"}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	cfg := DefaultConfig()
	cfg.NodeName = name
	cfg.DataDir = filepath.Join(tc.dir, name)
	cfg.Socket = filepath.Join(tc.dir, name+".sock")
	cfg.Simulate = profile
	cfg.IdleDriver = "nvidia"
	cfg.GossipAddr = "127.0.0.1:0"
	cfg.AdvertiseAddr = "127.0.0.1"
	cfg.PeerAddr = "127.0.0.1:0"
	cfg.InsecureGossip = true
	cfg.TLSCA = filepath.Join(caDir, "ca.crt")
	cfg.TLSCert = filepath.Join(certDir, name+".crt")
	cfg.TLSKey = filepath.Join(certDir, name+".key")
	if tc.seed != "" {
		cfg.Join = []string{tc.seed}
	}
	if tc.adjust != nil {
		tc.adjust(&cfg)
	}
	if adjust != nil {
		adjust(&cfg)
	}
	tune := fastGossip
	if tc.tune != nil {
		tune = tc.tune
	}
	opts := []Option{WithGossipTune(tune)}
	if tc.peers != nil {
		tr := tc.gossip.NewTransport()
		opts = []Option{WithPeerNetwork(tc.peers), WithGossipTune(func(c *memberlist.Config) {
			tune(c)
			c.Transport = tr
		})}
	}
	if tc.names != nil {
		opts = append(opts, WithNames(tc.names.as(name)))
	}
	if tc.clock != nil {
		opts = append(opts, WithClock(tc.clock.Now))
	}
	log := quietLog()
	if os.Getenv("GPUHERD_TEST_LOG") != "" {
		// Every agent's warnings and errors on stderr, with the test and
		// node: for a run that hangs or fails under load.
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("test", t.Name(), "node", name)
	}
	if tc.logFor != nil {
		log = tc.logFor(name)
	}
	a, err := New(context.Background(), cfg, log, append(opts, tc.opts...)...)
	if err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	if tc.seed == "" {
		tc.seed = a.cluster.g.LocalAddr()
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, func() { close(ready) }) }()
	<-ready
	tc.agents[name], tc.cancel[name], tc.done[name] = a, cancel, done
	return a
}

func (tc *testCluster) stop(name string) {
	if tc.cancel[name] == nil {
		return
	}
	tc.cancel[name]()
	<-tc.done[name]
	tc.agents[name].Close()
	delete(tc.cancel, name)
}

// converge waits until every agent sees every other alive with the summary
// cond accepts; gossip is eventually consistent, so this polls under a
// deadline.
func (tc *testCluster) converge(what string, cond func(a *Agent) bool) time.Duration {
	tc.t.Helper()
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	for {
		ok := true
		for _, a := range tc.agents {
			if !cond(a) {
				ok = false
				break
			}
		}
		if ok {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			tc.t.Fatalf("cluster did not converge on %s within 10s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// offsetClock is real time plus an offset that a test moves forward: the
// agents' leases and deadlines (all read from their clock) jump ahead,
// while everything that waits on a timer (sweeps, gossip rounds) keeps
// running as before. A clock stopped by hand would stall those.
type offsetClock struct{ offset atomic.Int64 }

func (c *offsetClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

// Advance moves the clock forward by d.
func (c *offsetClock) Advance(d time.Duration) { c.offset.Add(int64(d)) }

// registryUp waits until every agent that runs its own name registry (a
// socket cluster, where the registry founds itself as in production) knows
// a leader. A claim sent before that waits up to the registry's hold time
// for one and then answers a retryable 503: right for a client, a flake
// for a test that claims at once on a loaded machine.
func (tc *testCluster) registryUp() {
	tc.t.Helper()
	start := time.Now()
	for {
		var waiting []string
		for name, a := range tc.agents {
			if a.registry != nil && a.registry.Names().Status().Leader == "" {
				waiting = append(waiting, name)
			}
		}
		if len(waiting) == 0 {
			return
		}
		if time.Since(start) > 30*time.Second {
			slices.Sort(waiting)
			tc.t.Fatalf("no name registry leader known to %v within 30s", waiting)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// bothLookups runs a cluster test three times: with the name registry
// deciding claim IDs (the cluster's path), and without one: with the claim
// directory vouching at once (directory_settle 0, the fast path), and with
// homes that never vouch within the test (every lookup asks every server,
// the slow path).
func bothLookups(t *testing.T, test func(t *testing.T, tc *testCluster)) {
	t.Parallel()
	for _, mode := range []struct {
		name   string
		settle time.Duration
		names  bool
	}{{"registry", 0, true}, {"directory", 0, false}, {"every-server", time.Hour, false}} {
		t.Run(mode.name, func(t *testing.T) {
			tc := newTestCluster(t)
			if !mode.names {
				tc.names = nil
			}
			tc.adjust = func(c *Config) { c.DirectorySettle = Duration(min(mode.settle, 10*time.Minute)) }
			test(t, tc)
		})
	}
}

// cutPeerAPI points from's client for peer at a port where nothing
// listens (gossip still sees peer alive); the returned function restores it.
func cutPeerAPI(t *testing.T, from *Agent, peer string) (reconnect func()) {
	t.Helper()
	_ = from.targets() // builds from's client for every peer
	c := from.cluster
	c.mu.Lock()
	defer c.mu.Unlock()
	saved := maps.Clone(c.clients)
	cut := false
	for key := range c.clients {
		if key.name == peer {
			c.clients[key] = api.NewPeerClient("127.0.0.1:1", nil, time.Second)
			cut = true
		}
	}
	if !cut {
		t.Fatalf("%s has no client for %s", from.cfg.NodeName, peer)
	}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.clients = saved
	}
}

func freeOf(a *Agent, model string) int {
	av, _ := a.Availability(context.Background())
	for _, m := range av.Models {
		if m.Model == model {
			return m.Free
		}
	}
	return -1
}

func TestIntegrationClaimLandsWhereItFits(t *testing.T) {
	tc := newSocketCluster(t)
	a := tc.start("a", "dgx-h100")
	b := tc.start("b", "l40s-4")
	c := tc.start("c", "a100-pcie-4")
	ctx := context.Background()
	tc.converge("membership", func(x *Agent) bool {
		return freeOf(x, "NVIDIA L40S") == 4 && freeOf(x, "NVIDIA H100 80GB") == 8 && freeOf(x, "NVIDIA A100 80GB") == 4
	})
	tc.registryUp()

	// Through a, an L40S request can only land on b.
	cl, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if cl.Node != "b" || len(cl.GPUs) != 2 {
		t.Fatalf("claim through a = %+v, want 2 GPUs on b", cl)
	}
	for _, g := range cl.GPUs {
		if d := driverOf(t, b.sim.Kernel, g.PCIAddress); d != "vfio-pci" {
			t.Errorf("b's %s on %q after a remote claim", g.PCIAddress, d)
		}
	}
	took := tc.converge("L40S free 2 everywhere", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 2 })
	t.Logf("capacity change seen by every agent after %v", took)

	// Get and release through c, which owns nothing of it.
	got, err := c.Get(ctx, "vm-1")
	if err != nil || got.Node != "b" {
		t.Fatalf("get through c: %+v, %v", got, err)
	}
	if _, err := c.Release(ctx, "vm-1"); err != nil {
		t.Fatal(err)
	}
	tc.converge("L40S free 4 again", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 4 })

	// No single server holds 9 H100: not available, with alternatives.
	_, err = c.Claim(ctx, "vm-big", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 9}}})
	e := apiErr(t, err)
	if e.Code != api.CodeNotAvailable || e.Message != "The following GPUs are not available: 9x NVIDIA H100 80GB" {
		t.Fatalf("9 H100: %+v", e)
	}
	if !slices.ContainsFunc(e.Alternatives, func(alt api.Alternative) bool {
		return len(alt.GPUs) == 1 && alt.GPUs[0] == api.Item{Model: "NVIDIA H100 80GB", Count: 8}
	}) {
		t.Errorf("alternatives %+v do not offer 8x H100 on one server", e.Alternatives)
	}
	// Each model fits somewhere, never together: both are named.
	_, err = a.Claim(ctx, "vm-mix", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}, {Model: "L40S", Count: 1}}})
	if e := apiErr(t, err); e.Code != api.CodeNotAvailable || len(e.Missing) != 2 {
		t.Errorf("H100+L40S on one server: %+v", e)
	}
}

func TestIntegrationRacersForTheLastGPUs(t *testing.T) {
	tc := newSocketCluster(t)
	agents := []*Agent{tc.start("a", "l40s-4"), tc.start("b", "rtx6000pro-2"), tc.start("c", "a100-pcie-4")}
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 4 })
	tc.registryUp()
	ctx := context.Background()
	const claimers = 12
	var (
		wg               sync.WaitGroup
		mu               sync.Mutex
		granted, refused int
		owners           = map[string]string{}
	)
	for i := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("vm-%d", i)
			cl, err := agents[i%len(agents)].Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if e := apiErr(t, err); e.Code != api.CodeNotAvailable {
					t.Errorf("%s: %v", id, err)
				}
				refused++
				return
			}
			granted++
			for _, g := range cl.GPUs {
				key := cl.Node + "/" + g.PCIAddress
				if prev, dup := owners[key]; dup {
					t.Errorf("GPU %s given to %s and %s", key, prev, id)
				}
				owners[key] = id
			}
		}()
	}
	wg.Wait()
	if granted != 4 || refused != claimers-4 {
		t.Errorf("granted %d, refused %d; want 4 and %d", granted, refused, claimers-4)
	}
	all, _ := agents[2].Claims(ctx)
	if len(all) != 4 {
		t.Errorf("cluster-wide claims list has %d claims, want 4", len(all))
	}
	t.Logf("%d claimers through 3 coordinators: %d granted, %d not available, 0 GPUs shared", claimers, granted, refused)
}

func TestIntegrationResizeInPlaceThenMove(t *testing.T) {
	tc := newSocketCluster(t)
	a := tc.start("a", "a100-pcie-4")
	tc.start("b", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 4 && freeOf(x, "NVIDIA A100 80GB") == 4 })
	tc.registryUp()
	ctx := context.Background()
	if _, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "A100 80GB", Count: 1}}}); err != nil {
		t.Fatal(err)
	}
	grown, err := a.Resize(ctx, "vm-1", api.ResizeRequest{GPUs: []api.Item{{Model: "A100 80GB", Count: 3}}})
	if err != nil || grown.Node != "a" || len(grown.GPUs) != 3 {
		t.Fatalf("grow in place: %+v, %v", grown, err)
	}
	moved, err := a.Resize(ctx, "vm-1", api.ResizeRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}})
	if err != nil || moved.Node != "b" || len(moved.GPUs) != 2 || moved.State != api.StateClaimed {
		t.Fatalf("move to b: %+v, %v", moved, err)
	}
	if n := freeOf(a, "NVIDIA A100 80GB"); n != 4 {
		t.Errorf("after the move a has %d A100 free, want 4", n)
	}
	if _, err := a.Lookup(ctx, "vm-1"); !api.IsCode(err, api.CodeNotFound) {
		t.Errorf("the old server still holds vm-1: %v", err)
	}
}

func TestIntegrationNodeGroups(t *testing.T) {
	tc := newSocketCluster(t)
	a := tc.start("a", "l40s-4")
	tc.start("b", "a100-pcie-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 4 && freeOf(x, "NVIDIA A100 80GB") == 4 })
	tc.registryUp()
	ctx := context.Background()

	// Three nodes of 2 L40S need 6; the platform has 4: nothing is kept.
	// A registry just founded may still change leaders (it grows as the
	// second agent joins): a retryable 503 is retried, as clients do.
	err := retryUnavailable(func() error {
		_, err := a.CreateGroup(ctx, "gpu-pool", api.GroupRequest{Nodes: 3, GPUs: []api.Item{{Model: "L40S", Count: 2}}})
		return err
	})
	if e := apiErr(t, err); e.Code != api.CodeNotAvailable {
		t.Fatalf("oversized group: %+v", e)
	}
	if n := freeOf(a, "NVIDIA L40S"); n != 4 {
		t.Fatalf("a failed group kept GPUs: %d L40S free", n)
	}
	g, err := a.CreateGroup(ctx, "gpu-pool", api.GroupRequest{Nodes: 2, GPUs: []api.Item{{Model: "L40S", Count: 2}}})
	if err != nil || len(g.Claims) != 2 {
		t.Fatalf("group of 2: %+v, %v", g, err)
	}
	// Resize every node to one A100: the nodes move to b.
	g, err = a.ResizeGroup(ctx, "gpu-pool", api.ResizeRequest{GPUs: []api.Item{{Model: "A100 80GB", Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range g.Claims {
		if c.Node != "b" || len(c.GPUs) != 1 {
			t.Errorf("after resize node claim %+v, want 1 GPU on b", c)
		}
	}
	if _, err := a.ResizeGroup(ctx, "gpu-pool", api.ResizeRequest{}); apiErr(t, err).Code != api.CodeInvalid {
		t.Errorf("resize to no GPUs: %v, want refused", err)
	}
	// A group created without GPUs never gets one.
	if _, err := a.CreateGroup(ctx, "cpu-pool", api.GroupRequest{Nodes: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ResizeGroup(ctx, "cpu-pool", api.ResizeRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}}); apiErr(t, err).Code != api.CodeConflict {
		t.Errorf("GPUs for a group created without: %v, want refused", err)
	}
	if _, err := a.DeleteGroupClaims(ctx, "gpu-pool"); err != nil {
		t.Fatal(err)
	}
	tc.converge("everything free again", func(x *Agent) bool { return freeOf(x, "NVIDIA A100 80GB") == 4 })
}

// TestIntegrationReleaseWhileOwnerUnreachable: a release through another agent
// while the claim's owner does not answer must not say "not found" (the
// caller would believe the GPUs free); it is a retryable 503 naming the
// server, and the release goes through once the owner answers again.
func TestIntegrationReleaseWhileOwnerUnreachable(t *testing.T) {
	tc := newSocketCluster(t)
	a := tc.start("a", "dgx-h100")
	tc.start("b", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 4 })
	tc.registryUp()
	ctx := context.Background()
	if _, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}}); err != nil {
		t.Fatal(err)
	}
	reconnect := cutPeerAPI(t, a, "b")

	_, err := a.Release(ctx, "vm-1")
	if e := apiErr(t, err); e.Code != api.CodeUnavailable || !strings.Contains(e.Message, "b did not answer") {
		t.Fatalf("release with the owner unreachable: %+v; want 503 naming b", e)
	}
	reconnect()
	if _, err := a.Release(ctx, "vm-1"); err != nil {
		t.Fatalf("release once b answers again: %v", err)
	}
}

// A view that says "full" where the owner has room: before answering "not
// available" the coordinator reads the capacity of the servers that could
// hold the request, and places the claim.
func TestClusterStaleFullViewIsRechecked(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start("a", "a100-pcie-4")
	b := tc.start("b", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 4 })
	ctx := context.Background()
	if _, err := a.Claim(ctx, "vm-all", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 4}}}); err != nil {
		t.Fatal(err)
	}
	tc.converge("b full", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 0 })
	// b frees its GPUs in its ledger without telling gossip.
	if _, err := b.ledger.Release("vm-all", b.clk.Now()); err != nil {
		t.Fatal(err)
	}
	if free := freeOf(a, "NVIDIA L40S"); free != 0 {
		t.Fatalf("a's view: %d L40S free, want the stale 0", free)
	}
	got, err := a.Claim(ctx, "vm-2", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}})
	if err != nil || got.Node != "b" {
		t.Fatalf("claim with a stale full view: %+v, %v; want it on b", got, err)
	}
	// Really full: still "not available", naming what is missing.
	_, err = a.Claim(ctx, "vm-3", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 3}}})
	if e := apiErr(t, err); e.Code != api.CodeNotAvailable || e.Message != "The following GPUs are not available: 3x NVIDIA L40S" {
		t.Fatalf("3 L40S with 2 free: %+v", e)
	}
}

// A coordinator that sees half or more of a model's GPUs taken reads the
// capacity of the servers nearest the request before asking them: a claim
// skips a server that gossip still shows with room, without a refused
// reservation there.
func TestClusterBusyCoordinatorProbes(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start("a", "a100-pcie-4")
	b := tc.start("b", "l40s-4")
	c := tc.start("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 8 })
	ctx := context.Background()
	if _, err := c.Claim(ctx, "vm-pre", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 3}}, PreferNode: "c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Claim(ctx, "vm-pre-b", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}, PreferNode: "b"}); err != nil {
		t.Fatal(err)
	}
	tc.converge("half the L40S taken", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 4 })
	// c's last L40S goes without gossip saying so: a still sees it free,
	// and best fit puts c (1 free) before b (3 free).
	if _, err := c.Reserve(ctx, "ghost", api.ReserveRequest{Items: []api.Item{{Model: "NVIDIA L40S", Count: 1}}, Coordinator: "ghost"}); err != nil {
		t.Fatal(err)
	}
	var reservesOnC, capacityReadsOfC atomic.Int64
	proxy := newFaultProxy(t, tc, a, c, 0, func(r *http.Request) fault {
		switch {
		case isReserve(r):
			reservesOnC.Add(1)
		case strings.HasSuffix(r.URL.Path, "/capacity"):
			capacityReadsOfC.Add(1)
		}
		return passThrough
	})
	defer proxy.close()

	if got, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}}); err != nil || got.Node != "b" {
		t.Fatalf("claim: %+v, %v; want it on b", got, err)
	}
	if n := capacityReadsOfC.Load(); n == 0 {
		t.Error("the busy coordinator read no capacity of c before choosing")
	}
	if n := reservesOnC.Load(); n != 0 {
		t.Errorf("the busy coordinator asked c %d times although c's capacity read says full", n)
	}
}

// closePeerAPI stops a's peer API, in memory or on its socket; a stays in
// gossip.
func closePeerAPI(a *Agent) {
	if a.cluster.unserve != nil {
		a.cluster.unserve()
		return
	}
	_ = a.cluster.server.Close()
}

// targetName is t's node name, by which home.Of chooses an ID's home.
func targetName(t claim.Target) string { return t.Name() }

// targetNamed is the target named name among targets.
func targetNamed(targets []claim.Target, name string) (claim.Target, bool) {
	return claim.Named(targets, name)
}

// holdersSeenBy names the servers, of the view of a, whose owner holds a copy
// of claim id.
func holdersSeenBy(a *Agent, id string) []string {
	var on []string
	for _, t := range a.targets() {
		ctx, cancel := context.WithTimeout(context.Background(), api.LookupTimeout)
		if _, err := t.Owner().Lookup(ctx, id); err == nil {
			on = append(on, t.Name())
		}
		cancel()
	}
	return on
}
