package names

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// tcluster is a registry cluster in one process: voters on raft's
// InmemTransport, clients forwarding through a MemNetwork, and faults on
// both (kill, restart on the same data directory, partitions).
type tcluster struct {
	t       *testing.T
	net     *MemNetwork
	servers []Server
	clock   func() time.Time
	lease   time.Duration
	timing  Timing

	mu    sync.Mutex
	nodes map[string]*tnode
	// cut holds the partitioned pairs, so that a restarted node's
	// transport gets the same links as before.
	cut map[[2]string]bool
}

type tnode struct {
	id    string
	role  Role
	dir   string
	trans *raft.InmemTransport
	reg   *Registry
}

type clusterOpt func(*tcluster)

func withClock(now func() time.Time) clusterOpt { return func(c *tcluster) { c.clock = now } }
func withLease(d time.Duration) clusterOpt      { return func(c *tcluster) { c.lease = d } }

// withHold shortens the wait for a leader, for tests that expect none.
func withHold(d time.Duration) clusterOpt { return func(c *tcluster) { c.timing.Hold = d } }

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("NAMES_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// newCluster starts voters node-a.. and clients named in clients.
func newCluster(t *testing.T, voters int, clients []string, opts ...clusterOpt) *tcluster {
	t.Helper()
	// A cluster test mostly waits for elections and timeouts: they run
	// side by side (TestMain sets how many).
	t.Parallel()
	c := &tcluster{t: t, net: NewMemNetwork(), nodes: map[string]*tnode{}, cut: map[[2]string]bool{},
		clock: time.Now, lease: time.Minute, timing: FastTiming()}
	for _, o := range opts {
		o(c)
	}
	for i := 0; i < voters; i++ {
		id := fmt.Sprintf("node-%c", 'a'+i)
		c.servers = append(c.servers, Server{ID: id, Address: id})
	}
	base := t.TempDir()
	for _, s := range c.servers {
		c.nodes[s.ID] = &tnode{id: s.ID, role: RoleVoter, dir: filepath.Join(base, s.ID)}
	}
	for _, id := range clients {
		c.nodes[id] = &tnode{id: id, role: RoleClient}
	}
	for _, s := range c.servers {
		c.start(s.ID)
	}
	for _, id := range clients {
		c.start(id)
	}
	t.Cleanup(c.closeAll)
	return c
}

func (c *tcluster) config(n *tnode) Config {
	return Config{
		Node: n.id, Role: n.role, Servers: c.servers, DataDir: n.dir,
		Forwarder: c.net.From(n.id), Clock: c.clock, Lease: c.lease, Timing: c.timing,
		Logger: testLogger(c.t).With("node", n.id),
	}
}

// start opens node id's registry, on its data directory if it had one.
func (c *tcluster) start(id string) *Registry {
	c.t.Helper()
	c.mu.Lock()
	n := c.nodes[id]
	cfg := c.config(n)
	if n.role != RoleClient {
		_, n.trans = raft.NewInmemTransportWithTimeout(raft.ServerAddress(id), 500*time.Millisecond)
		cfg.Transport = n.trans
		c.linkLocked(id)
	}
	c.mu.Unlock()
	reg, err := Open(cfg)
	if err != nil {
		c.t.Fatalf("open %s: %v", id, err)
	}
	c.mu.Lock()
	n.reg = reg
	c.mu.Unlock()
	c.net.Attach(id, reg)
	return reg
}

// linkLocked connects id's transport with every running server it is not
// cut from, both ways.
func (c *tcluster) linkLocked(id string) {
	me := c.nodes[id]
	for _, o := range c.nodes {
		if o.id == id || o.trans == nil || o.reg == nil || c.cut[[2]string{id, o.id}] {
			continue
		}
		me.trans.Connect(raft.ServerAddress(o.id), o.trans)
		o.trans.Connect(raft.ServerAddress(id), me.trans)
	}
}

// kill stops node id as a crash would: it stops answering at once; its
// data directory stays.
func (c *tcluster) kill(id string) {
	c.t.Helper()
	c.net.Attach(id, nil)
	c.mu.Lock()
	n := c.nodes[id]
	reg := n.reg
	n.reg = nil
	for _, o := range c.nodes {
		if o.trans != nil && o.id != id {
			o.trans.Disconnect(raft.ServerAddress(id))
		}
	}
	if n.trans != nil {
		n.trans.DisconnectAll()
	}
	c.mu.Unlock()
	if reg != nil {
		if err := reg.Close(); err != nil {
			c.t.Logf("close %s: %v", id, err)
		}
	}
}

// partition cuts every link between the two sides, raft and forwarding.
func (c *tcluster) partition(side []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range side {
		for id, o := range c.nodes {
			if slices.Contains(side, id) {
				continue
			}
			c.cut[[2]string{a, id}], c.cut[[2]string{id, a}] = true, true
			c.net.Cut(a, id)
			if an := c.nodes[a]; an.trans != nil && o.trans != nil {
				an.trans.Disconnect(raft.ServerAddress(id))
				o.trans.Disconnect(raft.ServerAddress(a))
			}
		}
	}
}

func (c *tcluster) heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.cut)
	c.net.Heal()
	for id, n := range c.nodes {
		if n.trans != nil && n.reg != nil {
			c.linkLocked(id)
		}
	}
}

func (c *tcluster) reg(id string) *Registry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id].reg
}

func (c *tcluster) alive() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for id, n := range c.nodes {
		if n.reg != nil {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

func (c *tcluster) closeAll() {
	for _, id := range c.alive() {
		c.kill(id)
	}
}

// leader waits until exactly one of the given servers leads and every
// other one names it.
func (c *tcluster) leader(among ...string) string {
	c.t.Helper()
	if len(among) == 0 {
		for _, s := range c.servers {
			if c.reg(s.ID) != nil {
				among = append(among, s.ID)
			}
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var leaders []string
		agree := true
		for _, id := range among {
			r := c.reg(id)
			if r == nil {
				continue
			}
			if r.IsLeader() {
				leaders = append(leaders, id)
			}
		}
		if len(leaders) == 1 {
			for _, id := range among {
				if r := c.reg(id); r != nil && r.Leader() != leaders[0] {
					agree = false
				}
			}
			if agree {
				return leaders[0]
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatalf("no single leader among %v", among)
	return ""
}

// caughtUp waits until server id has applied everything the leader has
// written: a stale read answers from that server's own copy, which applies
// what the leader committed a moment later.
func (c *tcluster) caughtUp(t *testing.T, id string) {
	t.Helper()
	last := c.reg(c.leader()).Raft().LastIndex()
	for deadline := time.Now().Add(10 * time.Second); c.reg(id).Raft().AppliedIndex() < last; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s applied up to %d, the leader wrote up to %d", id, c.reg(id).Raft().AppliedIndex(), last)
		}
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func others(all []Server, not ...string) []string {
	var out []string
	for _, s := range all {
		if !slices.Contains(not, s.ID) {
			out = append(out, s.ID)
		}
	}
	return out
}

func TestClusterAcquireConfirmReleaseThroughAnyAgent(t *testing.T) {
	c := newCluster(t, 3, []string{"node-x"})
	leader := c.leader()
	follower := others(c.servers, leader)[0]
	ctx := ctxT(t, 10*time.Second)
	vm := Claim("vm-1")

	// A client agent forwards to the leader.
	g, err := c.reg("node-x").Acquire(ctx, vm, "node-x", "", "req-1", nil)
	if err != nil || g.Retry || g.Record.State != StatePending {
		t.Fatalf("acquire: %+v, %v", g, err)
	}
	// A retry through a follower gets the same grant.
	again, err := c.reg(follower).Acquire(ctx, vm, follower, "", "req-1", nil)
	if err != nil || !again.Retry || again.Record.Token != g.Record.Token || again.Record.Caller != "node-x" {
		t.Fatalf("retry: %+v, %v", again, err)
	}
	// Another request is refused, naming who places it.
	_, err = c.reg(leader).Acquire(ctx, vm, leader, "", "req-2", nil)
	var re *RefusedError
	if !errors.As(err, &re) || re.Code != CodeConflict || re.Record.Caller != "node-x" {
		t.Fatalf("other request: %v", err)
	}
	// The owner confirms under the token; a linearizable read anywhere sees it.
	if _, err := c.reg(follower).Confirm(ctx, vm, g.Record.Token, follower, nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range c.alive() {
		r, err := c.reg(id).Lookup(ctx, vm, Linearizable)
		if err != nil || r.State != StateHeld || r.Owner != follower {
			t.Fatalf("lookup on %s: %+v, %v", id, r, err)
		}
	}
	// A stale read on a follower answers from its copy without the leader.
	c.caughtUp(t, follower)
	r, err := c.reg(follower).Lookup(ctx, vm, Stale)
	if err != nil || r.Token != g.Record.Token {
		t.Fatalf("stale lookup: %+v, %v", r, err)
	}
	if _, err := c.reg("node-x").Release(ctx, vm, g.Record.Token, follower); err != nil {
		t.Fatal(err)
	}
	if _, err := c.reg(leader).Lookup(ctx, vm, Linearizable); !errors.Is(err, ErrNotFound) {
		t.Fatalf("lookup after release: %v", err)
	}
	if _, err := c.reg(leader).Release(ctx, vm, g.Record.Token, ""); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second release: %v", err)
	}
}

// The leader expires pending names with its own clock, carried in the
// command; the FSM never reads one.
func TestClusterLeaderExpiresPendingNames(t *testing.T) {
	clk := &fakeClock{now: t0}
	c := newCluster(t, 3, nil, withClock(clk.Now), withLease(10*time.Second))
	leader := c.leader()
	ctx := ctxT(t, 10*time.Second)
	g, err := c.reg(leader).Acquire(ctx, Claim("vm"), leader, "", "req", nil)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Second)
	// The expiry loop proposes the expiry by itself.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if recs, _ := c.reg(leader).fsm.Records(); len(recs) == 0 && !c.reg(leader).fsm.pendingPast(clk.Now()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the leader did not expire the lapsed name")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := c.reg(leader).Confirm(ctx, Claim("vm"), g.Record.Token, leader, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("confirm after expiry: %v", err)
	}
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
}

func TestClusterLeaderKilled(t *testing.T) {
	c := newCluster(t, 3, []string{"node-x"})
	old := c.leader()
	ctx := ctxT(t, 20*time.Second)
	g, err := c.reg("node-x").Acquire(ctx, Claim("before"), "node-x", "", "req", nil)
	if err != nil {
		t.Fatal(err)
	}
	c.kill(old)
	// The client waits out the election (Timing.Hold) and reaches the new
	// leader; the grant made before the kill is there.
	r, err := c.reg("node-x").Lookup(ctx, Claim("before"), Linearizable)
	if err != nil || r.Token != g.Record.Token {
		t.Fatalf("lookup after the leader died: %+v, %v", r, err)
	}
	if _, err := c.reg("node-x").Acquire(ctx, Claim("after"), "node-x", "", "req", nil); err != nil {
		t.Fatal(err)
	}
	c.start(old)
	c.leader()
	r, err = c.reg(old).Lookup(ctx, Claim("after"), Linearizable)
	if err != nil || r.State != StatePending {
		t.Fatalf("lookup through the restarted leader: %+v, %v", r, err)
	}
}

// A leader cut off from the other voters cannot grant anything; the
// majority side can; after the heal, only the majority's grants exist.
func TestClusterPartitionedLeader(t *testing.T) {
	c := newCluster(t, 3, nil, withHold(500*time.Millisecond))
	old := c.leader()
	rest := others(c.servers, old)
	ctx := ctxT(t, 30*time.Second)
	c.partition([]string{old})

	_, err := c.reg(old).Acquire(ctx, Claim("vm"), old, "", "minority", nil)
	var u *UnavailableError
	if !errors.As(err, &u) {
		t.Fatalf("minority acquire: %v, want unavailable", err)
	}
	if !slices.Equal(u.Unreached, rest) {
		t.Fatalf("unavailable names %v, want the voters it cannot reach %v (%v)", u.Unreached, rest, err)
	}
	g, err := retryUnavailable(ctx, func() (Grant, error) {
		return c.reg(rest[0]).Acquire(ctx, Claim("vm"), rest[0], "", "majority", nil)
	})
	if err != nil || g.Retry {
		t.Fatalf("majority acquire: %+v, %v", g, err)
	}
	c.heal()
	c.leader()
	for _, id := range c.alive() {
		r, err := c.reg(id).Lookup(ctx, Claim("vm"), Linearizable)
		if err != nil || r.Request != "majority" || r.Token != g.Record.Token {
			t.Fatalf("after heal, %s reads %+v, %v", id, r, err)
		}
	}
}

// Without a quorum nothing is granted, and the error names the voters
// that did not answer: never a guess.
func TestClusterWithoutQuorumNamesUnreachedVoters(t *testing.T) {
	c := newCluster(t, 3, []string{"node-x"}, withHold(300*time.Millisecond))
	c.leader()
	c.kill("node-b")
	c.kill("node-c")
	ctx := ctxT(t, 20*time.Second)
	for _, via := range []string{"node-a", "node-x"} {
		_, err := c.reg(via).Acquire(ctx, Claim("vm"), via, "", "req", nil)
		var u *UnavailableError
		if !errors.As(err, &u) || !u.Retryable() {
			t.Fatalf("acquire via %s: %v, want unavailable", via, err)
		}
		for _, dead := range []string{"node-b", "node-c"} {
			if !slices.Contains(u.Unreached, dead) {
				t.Fatalf("via %s: %q does not name %s", via, err, dead)
			}
		}
		if _, err := c.reg(via).Lookup(ctx, Claim("vm"), Linearizable); !IsUnavailable(err) {
			t.Fatalf("linearizable lookup via %s without quorum: %v", via, err)
		}
	}
	// A stale read still answers from the survivor's copy.
	if _, err := c.reg("node-a").Lookup(ctx, Claim("vm"), Stale); !errors.Is(err, ErrNotFound) {
		t.Fatalf("stale lookup: %v", err)
	}
}

// Every voter stopped and started again on its data directory keeps
// every name it acknowledged, with the same tokens.
func TestClusterRestartKeepsNames(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader := c.leader()
	ctx := ctxT(t, 30*time.Second)
	want := map[string]Record{}
	for i := range 20 {
		k := Claim(fmt.Sprintf("vm-%d", i))
		g, err := c.reg(leader).Acquire(ctx, k, leader, "", "req", nil)
		if err != nil {
			t.Fatal(err)
		}
		r := g.Record
		if i%2 == 0 {
			if r, err = c.reg(leader).Confirm(ctx, k, r.Token, "node-b", nil); err != nil {
				t.Fatal(err)
			}
		}
		want[k.Name] = r
	}
	for _, s := range c.servers {
		c.kill(s.ID)
	}
	for _, s := range c.servers {
		c.start(s.ID)
	}
	leader = c.leader()
	for name, w := range want {
		r, err := c.reg(leader).Lookup(ctx, Claim(name), Linearizable)
		if err != nil || r.Token != w.Token || r.State != w.State || r.Owner != w.Owner {
			t.Fatalf("%s after restart: %+v, %v; want %+v", name, r, err, w)
		}
	}
}

func TestClusterAddAndRemoveServers(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader := c.leader()
	ctx := ctxT(t, 20*time.Second)
	c.mu.Lock()
	c.nodes["node-d"] = &tnode{id: "node-d", role: RoleNonVoter, dir: filepath.Join(t.TempDir(), "node-d")}
	c.mu.Unlock()
	c.start("node-d")
	if _, err := c.reg(leader).Acquire(ctx, Claim("vm"), leader, "", "req", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.reg("node-b").AddVoter(ctx, "node-d", "node-d"); err != nil {
		t.Fatal(err)
	}
	// The new voter catches up and answers a stale read from its copy.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := c.reg("node-d").Lookup(ctx, Claim("vm"), Stale); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("node-d never caught up")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.reg(leader).RemoveServer(ctx, "node-d"); err != nil {
		t.Fatal(err)
	}
	f := c.reg(leader).Raft().GetConfiguration()
	if err := f.Error(); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range f.Configuration().Servers {
		ids = append(ids, string(s.ID))
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"node-a", "node-b", "node-c"}) {
		t.Fatalf("servers %v", ids)
	}
}

// A coordinator paused past its lease cannot commit: its name lapsed and
// was granted again with a newer token, and its owner's confirm with the
// old token is refused.
func TestClusterPausedCoordinatorIsFenced(t *testing.T) {
	clk := &fakeClock{now: t0}
	c := newCluster(t, 3, []string{"node-x"}, withClock(clk.Now), withLease(10*time.Second))
	leader := c.leader()
	ctx := ctxT(t, 10*time.Second)
	vm := Claim("vm")
	paused, err := c.reg("node-x").Acquire(ctx, vm, "node-x", "node-b", "req-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Second) // node-x sleeps past its lease
	next, err := c.reg(leader).Acquire(ctx, vm, leader, "node-c", "req-1", nil)
	if err != nil || next.Retry || next.Record.Token <= paused.Record.Token {
		t.Fatalf("acquire after the lapse: %+v, %v", next, err)
	}
	if _, err := c.reg("node-b").Confirm(ctx, vm, paused.Record.Token, "node-b", nil); !errors.Is(err, ErrStale) {
		t.Fatalf("confirm with the paused coordinator's token: %v, want stale", err)
	}
	if _, err := c.reg("node-c").Confirm(ctx, vm, next.Record.Token, "node-c", nil); err != nil {
		t.Fatal(err)
	}
	r, err := c.reg("node-x").Lookup(ctx, vm, Linearizable)
	if err != nil || r.Owner != "node-c" || r.Token != next.Record.Token {
		t.Fatalf("lookup: %+v, %v", r, err)
	}
}

func TestClusterRefusesBadServerChanges(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader := c.leader()
	ctx := ctxT(t, 10*time.Second)
	if err := c.reg(leader).AddVoter(ctx, "node-d", ""); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a voter without an address: %v", err)
	}
	if err := c.reg(leader).AddNonVoter(ctx, "Not A Node", "somewhere"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a bad node name: %v", err)
	}
}

func withSnapshots(threshold, trailing uint64) clusterOpt {
	return func(c *tcluster) {
		c.timing.SnapshotThreshold, c.timing.TrailingLogs = threshold, trailing
		c.timing.SnapshotInterval = 50 * time.Millisecond
	}
}

// A voter that was down while the leader compacted its log catches up
// from a snapshot sent over the transport, and a voter restarted after its
// own snapshot restores from it: both end with every name.
func TestClusterCatchUpFromSnapshot(t *testing.T) {
	c := newCluster(t, 3, nil, withSnapshots(16, 4))
	c.leader()
	c.kill("node-c")
	leader := c.leader("node-a", "node-b")
	ctx := ctxT(t, 20*time.Second)
	tokens := map[string]uint64{}
	for i := range 60 {
		k := Claim(fmt.Sprintf("vm-%d", i))
		g, err := retryUnavailable(ctx, func() (Grant, error) { return c.reg(leader).Acquire(ctx, k, leader, "", "req", nil) })
		if err != nil {
			t.Fatal(err)
		}
		tokens[k.Name] = g.Record.Token
	}
	// Snapshot now rather than wait for the interval, so the entries
	// node-c misses are gone from the log.
	if err := c.reg(leader).Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if first, _ := c.reg(leader).Store().FirstIndex(); first <= 1 {
		t.Fatalf("the leader's log still starts at %d: nothing was compacted", first)
	}
	c.start("node-c")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		recs, err := c.reg("node-c").fsm.Records()
		if err == nil && len(recs) == len(tokens) {
			for _, r := range recs {
				if tokens[r.Name] != r.Token {
					t.Fatalf("node-c has %s with token %d, want %d", r.Name, r.Token, tokens[r.Name])
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-c holds %d of %d names", len(recs), len(tokens))
		}
	}
	// The leader, restarted, restores its snapshot and replays the rest.
	c.kill(leader)
	c.start(leader)
	c.leader()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		recs, err := c.reg(leader).fsm.Records()
		if err == nil && len(recs) == len(tokens) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted leader holds %d names (%v), want %d", len(recs), err, len(tokens))
		}
	}
}

// retryUnavailable retries op while the registry answers unavailable, as a
// client does: a test that expects a grant must not fail because a loaded
// machine delayed a heartbeat past the short test lease and the leader
// stepped down (every command is idempotent, so a retry is safe).
func retryUnavailable[T any](ctx context.Context, op func() (T, error)) (T, error) {
	for {
		v, err := op()
		if err == nil || !IsUnavailable(err) || ctx.Err() != nil {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(20 * time.Millisecond):
		}
	}
}
