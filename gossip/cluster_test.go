package gossip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/goleak"
)

// Every test shuts its clusters down; nothing they started may outlive them.
func TestMain(m *testing.M) {
	// memberlist's Shutdown does not wait for a probe already in flight: it
	// ends by itself when its ack timer fires. That is memberlist's, not a
	// leak of ours; every goroutine this package starts must still be gone.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}

// waitLimit bounds every wait for the cluster to converge; waits end as soon
// as the awaited view appears, so this is only reached when something is broken.
const waitLimit = 15 * time.Second

// testNode is a Cluster on loopback with a summary the test can change.
type testNode struct {
	*Cluster
	name string
	sum  atomic.Pointer[Summary]
}

func (n *testNode) set(s Summary) { n.sum.Store(&s) }

func testLogger() *slog.Logger {
	if os.Getenv("GOSSIP_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// fastTimings shortens memberlist's LAN timings so failure detection and
// gossip happen in tens of milliseconds on loopback.
func fastTimings(mc *memberlist.Config) {
	mc.ProbeInterval = 100 * time.Millisecond
	mc.ProbeTimeout = 50 * time.Millisecond
	mc.GossipInterval = 20 * time.Millisecond
	mc.PushPullInterval = time.Second
	mc.GossipToTheDeadTime = time.Second
	mc.TCPTimeout = time.Second
}

func summaryFor(name string, rev uint64) Summary {
	return Summary{
		AgentVersion: "test",
		PeerAddr:     name + ".test:7443",
		Revision:     rev,
		Models:       []ModelCapacity{{Model: "NVIDIA L40S", Total: 8, Free: 8, Healthy: 8}},
	}
}

func startNode(t *testing.T, name string, tweak func(*Config)) *testNode {
	t.Helper()
	n, err := newNode(t, name, tweak)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	return n
}

func newNode(t *testing.T, name string, tweak func(*Config)) (*testNode, error) {
	n := &testNode{name: name}
	n.set(summaryFor(name, 1))
	cfg := Config{
		NodeName:          name,
		BindAddr:          "127.0.0.1",
		Insecure:          true,
		JoinRetryInterval: 20 * time.Millisecond,
		Log:               testLogger(),
		Tune:              fastTimings,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	c, err := New(cfg, func() Summary { return *n.sum.Load() })
	if err != nil {
		return nil, err
	}
	n.Cluster = c
	t.Cleanup(func() {
		if err := c.Shutdown(); err != nil {
			t.Errorf("shutdown %s: %v", name, err)
		}
	})
	return n, nil
}

func joining(seed *testNode) func(*Config) {
	return func(c *Config) { c.Join = []string{seed.LocalAddr()} }
}

func join(t *testing.T, n *testNode) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := n.Join(ctx); err != nil {
		t.Fatalf("%s: %v", n.name, err)
	}
}

// startCluster starts count nodes; all but the first join the first.
func startCluster(t *testing.T, count int, tweak func(*Config)) []*testNode {
	t.Helper()
	nodes := []*testNode{startNode(t, "n00", tweak)}
	for i := 1; i < count; i++ {
		n := startNode(t, fmt.Sprintf("n%02d", i), func(c *Config) {
			if tweak != nil {
				tweak(c)
			}
			joining(nodes[0])(c)
		})
		join(t, n)
		nodes = append(nodes, n)
	}
	return nodes
}

func member(ms []Member, name string) (Member, bool) {
	for _, m := range ms {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

// awaitView waits, on each node in turn, until cond holds for its view; it
// wakes on the node's change notifications, never on a timer of its own.
func awaitView(t *testing.T, nodes []*testNode, what string, cond func(self *testNode, ms []Member) bool) {
	t.Helper()
	awaitViewWithin(t, waitLimit, nodes, what, cond)
}

// awaitViewWithin is awaitView with a limit of the caller's.
func awaitViewWithin(t *testing.T, limit time.Duration, nodes []*testNode, what string, cond func(self *testNode, ms []Member) bool) {
	t.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for _, n := range nodes {
		ch, cancel := n.Subscribe()
		for !cond(n, n.Members()) {
			select {
			case <-ch:
			case <-deadline.C:
				cancel()
				t.Fatalf("%s: %s not seen within %v; view: %+v", n.name, what, limit, n.Members())
			}
		}
		cancel()
	}
}

// seesAll reports whether ms has every node of nodes alive with a decodable summary.
func seesAll(nodes []*testNode) func(*testNode, []Member) bool {
	return func(_ *testNode, ms []Member) bool {
		for _, n := range nodes {
			if m, ok := member(ms, n.name); !ok || !m.Usable() {
				return false
			}
		}
		return true
	}
}

func seesRevision(name string, rev uint64) func(*testNode, []Member) bool {
	return func(_ *testNode, ms []Member) bool {
		m, ok := member(ms, name)
		return ok && m.Usable() && m.Summary.Revision == rev
	}
}

func TestClusterMembersSeeEachOther(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	awaitView(t, nodes, "all three members", seesAll(nodes))

	for _, n := range nodes {
		ms := n.Members()
		if len(ms) != 3 {
			t.Fatalf("%s sees %d members, want 3: %+v", n.name, len(ms), ms)
		}
		for i, m := range ms {
			other := nodes[i] // names sort like the start order
			if m.Name != other.name || m.Addr != other.LocalAddr() || m.State != StateAlive {
				t.Errorf("%s sees %+v, want %s alive at %s", n.name, m, other.name, other.LocalAddr())
			}
			if m.Self != (m.Name == n.name) {
				t.Errorf("%s: %s Self = %v", n.name, m.Name, m.Self)
			}
			if m.Summary.PeerAddr != other.name+".test:7443" || m.Summary.Models[0].Model != "NVIDIA L40S" {
				t.Errorf("%s sees %s's summary as %+v", n.name, m.Name, m.Summary)
			}
		}
		if n.HealthScore() != 0 {
			t.Logf("%s health score %d", n.name, n.HealthScore())
		}
	}
}

func TestClusterPublishReachesOthers(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	awaitView(t, nodes, "all three members", seesAll(nodes))

	s := summaryFor("n01", 2)
	s.Models[0].Free = 3
	s.Drained = true
	nodes[1].set(s)
	if err := nodes[1].Publish(); err != nil {
		t.Fatal(err)
	}
	awaitView(t, nodes, "n01's revision 2", seesRevision("n01", 2))
	for _, n := range nodes {
		m, _ := member(n.Members(), "n01")
		if m.Summary.Models[0].Free != 3 || !m.Summary.Drained {
			t.Errorf("%s sees n01 as %+v", n.name, m.Summary)
		}
	}
}

func TestClusterPublishCoalescesBursts(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	awaitView(t, nodes, "all three members", seesAll(nodes))

	const burst = 200
	for rev := uint64(2); rev < 2+burst; rev++ {
		nodes[1].set(summaryFor("n01", rev))
		if err := nodes[1].Publish(); err != nil {
			t.Fatal(err)
		}
	}
	awaitView(t, nodes, "n01's last revision", seesRevision("n01", 1+burst))
	updates := nodes[1].pub.updates.Load()
	t.Logf("%d changes published with %d UpdateNode calls", burst, updates)
	if updates > 10 {
		t.Errorf("%d UpdateNode calls for a burst of %d changes; they should be merged", updates, burst)
	}

	// Publishing an unchanged summary costs nothing.
	before := nodes[1].pub.updates.Load()
	for range 10 {
		if err := nodes[1].Publish(); err != nil {
			t.Fatal(err)
		}
	}
	if after := nodes[1].pub.updates.Load(); after != before {
		t.Errorf("unchanged summary re-advertised %d times", after-before)
	}
}

func TestClusterPublishKeepsPreviousSummaryWhenTooLarge(t *testing.T) {
	n := startNode(t, "solo", nil)
	before := n.currentMeta()
	big := summaryFor("solo", 2)
	for i := range 40 {
		big.Models = append(big.Models, ModelCapacity{Model: fmt.Sprintf("NVIDIA Future GPU %02d with a long name", i), Total: 1})
	}
	n.set(big)
	err := n.Publish()
	if !errors.Is(err, ErrSummaryTooLarge) {
		t.Fatalf("Publish = %v, want ErrSummaryTooLarge", err)
	}
	if string(n.currentMeta()) != string(before) {
		t.Error("a summary that does not fit replaced the advertised one")
	}
}

func TestClusterLeaveShowsLeft(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	awaitView(t, nodes, "all three members", seesAll(nodes))

	if err := nodes[2].Leave(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	awaitView(t, nodes[:2], "n02 left", func(_ *testNode, ms []Member) bool {
		m, ok := member(ms, "n02")
		return ok && m.State == StateLeft
	})
	if err := nodes[2].Publish(); err == nil {
		t.Error("Publish after Leave succeeded")
	}
	if err := nodes[2].Leave(time.Second); err != nil {
		t.Errorf("second Leave: %v", err)
	}
	if err := nodes[2].Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := nodes[2].Leave(time.Second); err == nil {
		t.Error("Leave after Shutdown succeeded")
	}
}

// A member that stops without leaving is first suspected by whichever member
// probes it, then declared dead by all.
func TestClusterFailureShowsSuspectThenDead(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	awaitView(t, nodes, "all three members", seesAll(nodes))

	var wg sync.WaitGroup
	var sawSuspect atomic.Bool
	errs := make(chan error, 2)
	for _, n := range nodes[:2] {
		ch, cancel := n.Subscribe()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cancel()
			deadline := time.NewTimer(waitLimit)
			defer deadline.Stop()
			for {
				m, _ := member(n.Members(), "n02")
				switch m.State {
				case StateSuspect:
					sawSuspect.Store(true)
				case StateDead:
					return
				case StateLeft:
					errs <- fmt.Errorf("%s: n02 shown as left, but it failed", n.name)
					return
				}
				select {
				case <-ch:
				case <-deadline.C:
					errs <- fmt.Errorf("%s: n02 not declared dead within %v: %+v", n.name, waitLimit, m)
					return
				}
			}
		}()
	}
	if err := nodes[2].Shutdown(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if !sawSuspect.Load() {
		t.Error("no member showed n02 as suspect before dead; did memberlist's \"Suspect ... has failed\" log line change?")
	}
}

func TestClusterUndecodableSummaryIsListedNotUsable(t *testing.T) {
	seed := startNode(t, "n00", nil)
	future := startNode(t, "n01", func(c *Config) {
		joining(seed)(c)
		c.Tune = func(mc *memberlist.Config) {
			fastTimings(mc)
			mc.Delegate = futureMeta{mc.Delegate}
		}
	})
	join(t, future)
	awaitView(t, []*testNode{seed}, "n01 with its undecodable summary", func(_ *testNode, ms []Member) bool {
		m, ok := member(ms, "n01")
		return ok && m.State == StateAlive && m.SummaryErr != nil
	})
	m, _ := member(seed.Members(), "n01")
	if m.Usable() {
		t.Error("a member whose summary does not decode is usable for placement")
	}
	t.Logf("listed with: %v", m.SummaryErr)
}

// futureMeta advertises a summary in a format this agent does not know.
type futureMeta struct{ memberlist.Delegate }

func (futureMeta) NodeMeta(int) []byte { return []byte{0xC7, 1, 2, 3} }

func TestClusterWithoutKeyRefusesToStart(t *testing.T) {
	_, err := newNode(t, "plain", func(c *Config) { c.Insecure = false })
	if err == nil {
		t.Fatal("started without a gossip key and without Insecure")
	}
	for _, want := range []string{"--gossip-key-file", "--insecure-gossip"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not tell the operator about %s", err, want)
		}
	}
}

func withKeyFile(path string) func(*Config) {
	return func(c *Config) { c.KeyFile, c.Insecure = path, false }
}

func TestClusterEncrypted(t *testing.T) {
	good := writeKeyFile(t, 0o600, key(1, 32))
	wrong := writeKeyFile(t, 0o600, key(2, 32))

	nodes := startCluster(t, 2, withKeyFile(good))
	awaitView(t, nodes, "both encrypted members", seesAll(nodes))

	intruders := map[string]func(*Config){
		"wrong-key": withKeyFile(wrong),
		"no-key":    func(*Config) {}, // Insecure: speaks plaintext
	}
	for name, tweak := range intruders {
		n := startNode(t, name, func(c *Config) {
			tweak(c)
			joining(nodes[0])(c)
			c.JoinRetryMax = 2
		})
		if err := n.Join(context.Background()); err == nil {
			t.Errorf("%s joined an encrypted cluster", name)
		} else {
			t.Logf("%s refused: %v", name, err)
		}
		if _, ok := member(nodes[0].Members(), name); ok {
			t.Errorf("%s is listed by the encrypted cluster", name)
		}
	}
}

func TestClusterKeyRotation(t *testing.T) {
	k1, k2 := key(1, 32), key(2, 32)
	dir := t.TempDir()
	files := []string{dir + "/n00.key", dir + "/n01.key"}
	write := func(lines ...string) {
		for _, f := range files {
			if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(k1)
	nodes := []*testNode{startNode(t, "n00", withKeyFile(files[0]))}
	nodes = append(nodes, startNode(t, "n01", func(c *Config) {
		withKeyFile(files[1])(c)
		joining(nodes[0])(c)
	}))
	join(t, nodes[1])
	awaitView(t, nodes, "both members", seesAll(nodes))

	rev := uint64(1)
	steps := []struct {
		name  string
		lines []string
	}{
		{"add the new key as second", []string{"# rotating", k1, k2}},
		{"make the new key primary", []string{k2, k1}},
		{"remove the old key", []string{k2}},
	}
	for _, step := range steps {
		write(step.lines...)
		for i, n := range nodes {
			if err := n.ReloadKeys(files[i]); err != nil {
				t.Fatalf("%s: %s: %v", step.name, n.name, err)
			}
		}
		// Both directions still decrypt: each member's new summary reaches the other.
		rev++
		for _, n := range nodes {
			n.set(summaryFor(n.name, rev))
			if err := n.Publish(); err != nil {
				t.Fatal(err)
			}
		}
		awaitView(t, nodes, step.name+": both summaries at revision "+strconv.FormatUint(rev, 10), func(_ *testNode, ms []Member) bool {
			return seesRevision("n00", rev)(nil, ms) && seesRevision("n01", rev)(nil, ms)
		})
	}

	oldKey := writeKeyFile(t, 0o600, k1)
	stale := startNode(t, "stale", func(c *Config) {
		withKeyFile(oldKey)(c)
		joining(nodes[0])(c)
		c.JoinRetryMax = 1
	})
	if err := stale.Join(context.Background()); err == nil {
		t.Error("a member with only the retired key joined")
	}
	newKey := writeKeyFile(t, 0o600, k2)
	fresh := startNode(t, "fresh", func(c *Config) {
		withKeyFile(newKey)(c)
		joining(nodes[0])(c)
	})
	join(t, fresh)
	awaitView(t, append(nodes, fresh), "the member with the new key", seesAll(append(nodes, fresh)))
}

func TestClusterReloadKeysNeedsEncryption(t *testing.T) {
	n := startNode(t, "plain", nil)
	if err := n.ReloadKeys(writeKeyFile(t, 0o600, key(1, 32))); err == nil {
		t.Error("keys loaded into an unencrypted cluster")
	}
}

// retryWatcher is a slog handler that signals each logged join retry.
type retryWatcher struct {
	slog.Handler
	retried chan struct{}
}

// Enabled lets every record through: the wrapped handler may discard all.
func (retryWatcher) Enabled(context.Context, slog.Level) bool { return true }

func (h retryWatcher) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "no gossip seed answered; retrying" {
		select {
		case h.retried <- struct{}{}:
		default:
		}
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h retryWatcher) WithAttrs(as []slog.Attr) slog.Handler {
	return retryWatcher{h.Handler.WithAttrs(as), h.retried}
}

func TestClusterJoinRetriesUntilSeedAppears(t *testing.T) {
	// Reserve a port for the seed, which starts only after the joiner failed.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()

	retried := make(chan struct{}, 1)
	joiner := startNode(t, "late-joiner", func(c *Config) {
		c.Join = []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
		c.Log = slog.New(retryWatcher{testLogger().Handler(), retried})
	})
	joined := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	go func() { joined <- joiner.Join(ctx) }()

	select {
	case <-retried:
	case err := <-joined:
		t.Fatalf("Join returned before the seed existed: %v", err)
	case <-ctx.Done():
		t.Fatal("no failed join attempt logged")
	}
	seed := startNode(t, "seed", func(c *Config) { c.BindPort = port })
	if err := <-joined; err != nil {
		t.Fatalf("Join did not reach the late seed: %v", err)
	}
	nodes := []*testNode{seed, joiner}
	awaitView(t, nodes, "both members", seesAll(nodes))
}

func TestClusterJoinGivesUp(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	n := startNode(t, "lonely", func(c *Config) { c.Join = []string{addr}; c.JoinRetryMax = 2 })
	err = n.Join(context.Background())
	if err == nil || !strings.Contains(err.Error(), "after 2 attempts") {
		t.Errorf("Join = %v, want it to give up after 2 attempts", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n.retries = 0
	if err := n.Join(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Join with an ended context = %v, want context.Canceled", err)
	}
}

func TestClusterJoinSkipsItself(t *testing.T) {
	n := startNode(t, "first", nil)
	n.seeds = []string{n.LocalAddr()}
	if err := n.Join(context.Background()); err != nil {
		t.Errorf("the first server, listed in its own seeds, failed to start: %v", err)
	}
}

// Convergence at the scale of a rack with memberlist's LAN timings, as in
// production; measured and reported, not asserted.
func TestClusterConvergenceTwentyNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("20 nodes with LAN timings")
	}
	const count = 20
	lan := func(c *Config) { c.Tune = nil }
	start := time.Now()
	nodes := startCluster(t, count, lan)
	joined := time.Since(start)
	awaitView(t, nodes, "all members", seesAll(nodes))
	t.Logf("%d nodes: joins took %v, membership converged after %v", count, joined.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	start = time.Now()
	nodes[7].set(summaryFor("n07", 42))
	if err := nodes[7].Publish(); err != nil {
		t.Fatal(err)
	}
	// The change spreads by epidemic: each member that learns it passes it
	// on to a few random others for a few gossip rounds, so it nearly always
	// reaches all within a second. A member that every copy missed (UDP
	// datagrams dropped on a loaded machine) learns it from the next
	// push/pull exchange, which each member runs every PushPullInterval with
	// a random other: that, not the epidemic, bounds the wait.
	backstop := 2*memberlist.DefaultLANConfig().PushPullInterval + waitLimit
	awaitViewWithin(t, backstop, nodes, "n07's revision 42", seesRevision("n07", 42))
	t.Logf("%d nodes: a summary change reached all in %v", count, time.Since(start).Round(time.Millisecond))
}

// A member that missed a join learns it from the exchange that a member
// which saw the join runs once the change has settled. Here nothing else
// could tell it: no gossip, no probes to piggyback on, and memberlist's
// periodic exchange is off.
func TestCatchUpAfterMembershipChanges(t *testing.T) {
	exchanges := make(chan string, 16)
	silent := func(c *Config) {
		c.Tune = func(mc *memberlist.Config) {
			fastTimings(mc)
			mc.ProbeInterval = 0
			mc.GossipNodes = 0
			mc.PushPullInterval = 0
		}
		c.catchUp = catchUpTimings{quiet: 20 * time.Millisecond, most: 100 * time.Millisecond}
	}
	a := startNode(t, "a", func(c *Config) {
		silent(c)
		c.catchUp.exchanged = func(with string) { exchanges <- with }
	})
	b := startNode(t, "b", func(c *Config) { silent(c); joining(a)(c) })
	join(t, b)
	awaitView(t, []*testNode{a, b}, "a and b", seesAll([]*testNode{a, b}))
	awaitExchange := func() string {
		t.Helper()
		select {
		case with := <-exchanges:
			return with
		case <-time.After(waitLimit):
			t.Fatalf("a ran no catch-up exchange within %v", waitLimit)
			return ""
		}
	}
	if with := awaitExchange(); with != "b" {
		t.Fatalf("a caught up with %s after b joined, want b (the only other member)", with)
	}
	c := startNode(t, "c", func(c *Config) { silent(c); joining(a)(c) })
	join(t, c)
	if with := awaitExchange(); with != "b" {
		t.Fatalf("a caught up with %s after c joined, want b (the member that did not change)", with)
	}
	awaitView(t, []*testNode{b}, "c, through a's catch-up", seesAll([]*testNode{a, b, c}))
}

// The catch-up exchange reads members' addresses while alive messages
// update them: it must not read memberlist's node structs, which those
// messages rewrite under memberlist's lock. Under -race (make test), this
// test failed with the exchange reading Node.Addr from ml.Members().
func TestCatchUpExchangeRacesNoAliveMessage(t *testing.T) {
	a := startNode(t, "a", nil)
	b := startNode(t, "b", joining(a))
	join(t, b)
	awaitView(t, []*testNode{a, b}, "a and b", seesAll([]*testNode{a, b}))
	stop := time.Now().Add(time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for rev := uint64(2); time.Now().Before(stop); rev++ {
			b.set(summaryFor("b", rev))
			if err := b.Publish(); err != nil {
				t.Errorf("publish: %v", err)
				return
			}
		}
	}()
	for time.Now().Before(stop) {
		a.catchUp.exchange()
	}
	<-done
}
