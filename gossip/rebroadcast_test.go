package gossip

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/gpuherd/gpuherd/gossip/gossiptest"
)

// missedChangeCluster starts three members on an in-memory network with
// no probes, no periodic full-state exchange (pushPull, or an hour) and no
// catch-up exchange, so that nothing but the mechanism under test can
// repair a view; then n02 misses n01's change to revision 2: everything
// sent to n02 is dropped while n01 advertises it and for window after
// (memberlist's retransmissions, and the other member's re-gossip, are over
// long before), then the network heals. It returns the nodes and the
// moment of the heal.
func missedChangeCluster(t *testing.T, again []time.Duration, pushPull, window time.Duration) ([]*testNode, time.Time) {
	t.Helper()
	net := &gossiptest.Network{}
	tweak := func(c *Config) {
		c.Rebroadcast = again
		c.catchUp = catchUpTimings{quiet: time.Hour, most: time.Hour, gap: time.Hour}
		tr := net.NewTransport()
		c.Tune = func(mc *memberlist.Config) {
			fastTimings(mc)
			mc.Transport = tr
			mc.ProbeInterval = time.Hour
			mc.PushPullInterval = pushPull
		}
	}
	nodes := startCluster(t, 3, tweak)
	awaitView(t, nodes, "all three members", seesAll(nodes))
	cut := nodes[2].LocalAddr()
	net.Block(nodes[0].LocalAddr(), cut)
	net.Block(nodes[1].LocalAddr(), cut)
	nodes[1].set(summaryFor("n01", 2))
	if err := nodes[1].Publish(); err != nil {
		t.Fatal(err)
	}
	awaitView(t, nodes[:1], "n01's revision 2", seesRevision("n01", 2))
	time.Sleep(window) // the fault's length: a short partition of n02
	net.Heal()
	if m, _ := member(nodes[2].Members(), "n01"); m.Summary.Revision != 1 {
		t.Fatalf("n02 sees n01 at revision %d at the heal; the test needs it to have missed revision 2", m.Summary.Revision)
	}
	return nodes, time.Now()
}

// TestRebroadcastReachesAMemberThatMissedAChange: a member cut off while a
// capacity change was broadcast gets it from the summary's re-broadcast,
// seconds later, rather than from the next full-state exchange (30 s on a
// LAN).
func TestRebroadcastReachesAMemberThatMissedAChange(t *testing.T) {
	nodes, healed := missedChangeCluster(t, []time.Duration{time.Second, 3 * time.Second}, time.Hour, 500*time.Millisecond)
	awaitViewWithin(t, 10*time.Second, nodes[2:], "n01's revision 2 after the heal", seesRevision("n01", 2))
	t.Logf("n02 caught up %v after the heal (first re-broadcast 1 s after the change)", time.Since(healed).Round(10*time.Millisecond))
	// Due 1 s after the change whatever else happened.
	for deadline := time.Now().Add(5 * time.Second); nodes[1].pub.repeats.Load() < 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("n01 never repeated its summary")
		}
	}
}

// TestRefreshFetchesAStaleMembersSummary: with no re-broadcast, Refresh
// (what a coordinator runs when an owner refused what its view said fits)
// brings the member's current summary in one exchange.
func TestRefreshFetchesAStaleMembersSummary(t *testing.T) {
	nodes, healed := missedChangeCluster(t, []time.Duration{}, time.Hour, 100*time.Millisecond)
	if !nodes[2].Refresh("n01") {
		t.Fatal("Refresh started no exchange")
	}
	if nodes[2].Refresh("n01") {
		t.Error("a second Refresh within refreshGap started another exchange")
	}
	awaitViewWithin(t, 5*time.Second, nodes[2:], "n01's revision 2 after a refresh", seesRevision("n01", 2))
	t.Logf("n02 caught up %v after the heal, by a refresh", time.Since(healed).Round(time.Millisecond))
	if nodes[2].Refresh("nobody") {
		t.Error("Refresh of a member the view does not list started an exchange")
	}
}

// TestMissedChangeConvergence measures how long a member that missed a
// change waits for it: GOSSIP_MEASURE_PUSHPULL=30s compares the periodic
// exchange alone with the re-broadcast (BENCHMARKS-style figures; skipped
// unless set).
func TestMissedChangeConvergence(t *testing.T) {
	pp, err := time.ParseDuration(os.Getenv("GOSSIP_MEASURE_PUSHPULL"))
	if err != nil {
		t.Skip("set GOSSIP_MEASURE_PUSHPULL (e.g. 30s) to measure")
	}
	runs, _ := strconv.Atoi(os.Getenv("GOSSIP_MEASURE_RUNS"))
	for _, tt := range []struct {
		name  string
		again []time.Duration
	}{{"push/pull only", []time.Duration{}}, {"re-broadcast", DefaultRebroadcast}} {
		for range max(runs, 1) {
			nodes, healed := missedChangeCluster(t, tt.again, pp, 500*time.Millisecond)
			awaitViewWithin(t, 3*pp, nodes[2:], "n01's revision 2", seesRevision("n01", 2))
			t.Logf("%s: caught up %v after the heal", tt.name, time.Since(healed).Round(10*time.Millisecond))
		}
	}
}
