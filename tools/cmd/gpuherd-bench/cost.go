package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/pki"
	"github.com/gpuherd/gpuherd/gossip/gossiptest"
)

// The cost per operation (docs/protocol.md, "Cost per operation"): full
// agents in one process on the in-memory peer network (agent/claimtest)
// and in-memory gossip (gossip/gossiptest), the name registry run as in
// production with names_voters set: three voter agents running raft over
// mutual TLS on loopback with their logs on disk, every other agent a
// client that forwards to the leader over the peer API. A sequence of
// unloaded claims of one GPU, each followed by a get and a release of the
// same ID, each through a random agent; every operation is measured alone,
// from its call until nothing it caused is still moving.

// opKind is a measured operation.
type opKind int

const (
	opClaim opKind = iota
	opGet
	opRelease
	opKinds
)

func (k opKind) String() string { return [...]string{"claim", "get", "release"}[k] }

// costConfig is how the cost is measured.
type costConfig struct {
	sizes []int
	// ops is how many claims (and as many gets and releases) each size runs.
	ops int
	// quiet ends an operation's window: nothing it caused moved for that long.
	quiet time.Duration
	// converge bounds the wait for every agent to see every other.
	converge time.Duration
	seed     uint64
	log      *slog.Logger
	progress func(format string, args ...any)
}

// opSample is what one operation cost.
type opSample struct {
	peer int // peer API requests naming the claim ID
	// redirects are those of them that asked a registry server that no
	// longer leads (it named the leader, which was asked next).
	redirects int
	appends   int // registry AppendEntries RPCs carrying an entry that names it
	ledger    int // ledger write transactions (fsynced), all agents
	store     int // registry store write transactions (fsynced), all voters
	took      time.Duration
	// election: the registry's voters voted (or sent a snapshot or a
	// leadership transfer) during the window, which writes their stores
	// and sends RPCs of its own; such a sample is left out, and counted.
	election bool
}

func (s opSample) fsyncs() int { return s.ledger + s.store }

// stated is the most one operation costs by docs/protocol.md ("Cost per
// operation"), with three registry voters, whatever the number of servers:
// a claim is one call that reserves and commits on the owner (nothing is
// read before: the owner's hold is the check), the owner's hold forwarded to the
// leader and its notice to the ID's home (without any_node, nothing asks
// the home where the ID last ran: the hold recalls it); one registry write,
// appended to two followers and stored by three voters; one ledger commit.
// A get is a forwarded lookup and a read on the owner. A release is a
// forwarded lookup, the release on the owner, the owner's name release
// forwarded, its notice to the home and the coordinator's second lookup
// (a name moved away meanwhile); one registry write; the ledger's release
// and its memory of it.
var stated = [opKinds]opSample{
	opClaim:   {peer: 3, appends: 2, ledger: 1, store: 3},
	opGet:     {peer: 2},
	opRelease: {peer: 5, appends: 2, ledger: 2, store: 3},
}

// background is what ran beside the operations, per second over the whole
// measuring phase: not per operation, and not counted in its figures.
type background struct {
	peer  float64 // peer API requests naming no measured ID (anti-entropy lists, resyncs)
	beats float64 // raft AppendEntries without entries (heartbeats, commit-index ticks, leader checks)
}

// costResult is the cost per operation at one size.
type costResult struct {
	n        int
	voters   []string
	gpus     int
	err      error // the size could not be measured: why
	startup  time.Duration
	converge time.Duration
	scale    int // gossip timers stretched by this factor
	rss      int64
	bg       background
	phase    time.Duration // the measuring phase, for the background rates
	ops      [opKinds][]opSample
	retried  [opKinds][]opSample // the successful retries after a 503, apart
	paths    [opKinds]map[string]int
	bgPaths  map[string]int // background requests by request, over the measuring phase
	// unsettled counts operations whose window closed at the deadline
	// with something still moving; strayAppends counts entries-carrying
	// raft RPCs inside windows that did not name the measured ID.
	unsettled, strayAppends int
	// leftOut counts operations left out of the figures: the registry held
	// an election (or sent a snapshot, or handed its leadership over) while
	// they were measured, or they were answered a retryable 503 and tried
	// again.
	leftOut int
}

// costCluster is one size's agents, registry and meters.
type costCluster struct {
	cfg    costConfig
	dir    string
	caDir  string
	m      *costMeter
	net    *costNet
	gossip *gossiptest.Network
	scale  int

	names  []string
	voters []string
	regs   map[string]*names.Registry
	// regsMu guards regs while the voters open: each registry asks
	// leaderFirst from its own goroutines as soon as it runs.
	regsMu  sync.RWMutex
	agents  []*agent.Agent
	cancels []context.CancelFunc
	dones   []chan error
}

// gossipScale stretches memberlist's timers for large in-process
// clusters: two cores cannot run the probe and gossip loops of 1,000
// members at LAN timings (BENCHMARKS.md: at 500 gossip-only members the
// membership never settled). Gossip is not counted here, only its pace
// changes. Raft keeps its LAN timing: stretched tenfold, one election
// outlasted the agent's own deadline for a registry call (8 s) and failed
// the claim that waited.
func gossipScale(n int) int { return max(1, n/100) }

func runCost(cc costConfig) []*costResult {
	var out []*costResult
	for _, n := range cc.sizes {
		cc.progress("cost per operation: %d servers", n)
		r := runCostSize(cc, n)
		if r.err != nil {
			cc.progress("  %d servers: %v", n, r.err)
		}
		out = append(out, r)
	}
	return out
}

// runCostSize measures one size; a size that cannot start or converge is
// reported in the result, not fatal.
func runCostSize(cfg costConfig, n int) *costResult {
	r := &costResult{n: n, scale: gossipScale(n)}
	dir, err := os.MkdirTemp("", "gpuherd-cost-")
	if err != nil {
		r.err = err
		return r
	}
	defer os.RemoveAll(dir)
	c := &costCluster{cfg: cfg, dir: dir, caDir: filepath.Join(dir, "ca"), m: newCostMeter(), gossip: &gossiptest.Network{},
		scale: r.scale, regs: map[string]*names.Registry{}}
	c.net = newCostNet(c.m)
	defer c.stop()
	if err := c.startAll(n, r); err != nil {
		r.err = err
		return r
	}
	r.voters = c.voters
	if err := c.measureOps(r); err != nil {
		r.err = err
	}
	t0 := time.Now()
	c.stop()
	cfg.progress("  measured in %v; stopped in %v", r.phase.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	return r
}

// startAll starts the registry and n agents, and waits until every agent
// sees every other and every agent's registry handle knows the leader.
func (c *costCluster) startAll(n int, r *costResult) error {
	if err := pki.CreateCA(c.caDir, "gpuherd-bench cost CA", 24*time.Hour); err != nil {
		return err
	}
	for i := range n {
		c.names = append(c.names, fmt.Sprintf("gpu%03d", i))
	}
	c.voters = names.ChooseVoters(c.names, 3)
	t0 := time.Now()
	if err := c.openRegistry(); err != nil {
		return err
	}
	c.agents = make([]*agent.Agent, n)
	c.cancels = make([]context.CancelFunc, n)
	c.dones = make([]chan error, n)
	trs := make([]*gossiptest.Transport, n)
	for i := range n {
		trs[i] = c.gossip.NewTransport()
	}
	if err := c.startAgent(0, trs[0], ""); err != nil {
		return err
	}
	seed := trs[0].Addr()
	if errs := startRest(n, func(i int) error { return c.startAgent(i, trs[i], seed) }); len(errs) > 0 {
		return fmt.Errorf("%d of %d agents did not start; first: %w", len(errs), n, errs[0])
	}
	r.startup = time.Since(t0)
	c.cfg.progress("  %d agents up in %v (gossip timers ×%d); waiting for every one to see every other", n, r.startup.Round(time.Millisecond), c.scale)
	t1 := time.Now()
	if err := c.awaitConverged(); err != nil {
		return err
	}
	r.converge = time.Since(t1)
	t2 := time.Now()
	if err := c.awaitLeader(); err != nil {
		return err
	}
	c.cfg.progress("  converged in %v; every agent's registry handle answered in %v more", r.converge.Round(time.Millisecond), time.Since(t2).Round(time.Millisecond))
	for _, m := range c.self() {
		for _, x := range m.Models {
			r.gpus += x.Total
		}
	}
	r.rss = rssBytes(0)
	c.cfg.progress("  registry voters %v; %d GPUs; RSS %.0f MiB; measuring", c.voters, r.gpus, float64(r.rss)/(1<<20))
	return nil
}

// openRegistry opens every agent's registry handle: raft over mutual TLS
// for the voters, a forwarding client for the others.
func (c *costCluster) openRegistry() error {
	var servers []names.Server
	lns := map[string]net.Listener{}
	for _, v := range c.voters {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		lns[v] = ln
		servers = append(servers, names.Server{ID: v, Address: ln.Addr().String()})
	}
	isServer := func(node string) bool { return slices.Contains(c.voters, node) }
	for _, node := range c.names {
		files, err := c.issue(node)
		if err != nil {
			return err
		}
		ncfg := names.Config{Node: node, Role: names.RoleClient, Servers: servers, Discover: c.leaderFirst,
			Forwarder: c.net.forwarder(node), Timing: names.LANTiming(), Logger: c.cfg.log}
		if ln, ok := lns[node]; ok {
			srv, err := pki.ServerConfig(files)
			if err != nil {
				return err
			}
			cli, err := pki.ClientConfigAnyNode(files)
			if err != nil {
				return err
			}
			layer, err := names.NewTLSStreamLayer(ln, srv, cli, isServer)
			if err != nil {
				return err
			}
			ncfg.Role, ncfg.DataDir = names.RoleVoter, filepath.Join(c.dir, node, "names")
			ncfg.Transport = countingTransport{Transport: names.NewTLSTransport(layer, c.cfg.log), m: c.m}
		}
		reg, err := names.Open(ncfg)
		if err != nil {
			return fmt.Errorf("name registry on %s: %w", node, err)
		}
		c.regsMu.Lock()
		c.regs[node] = reg
		c.regsMu.Unlock()
	}
	return nil
}

// leaderFirst names the voters, the leader first: what a client learns
// from gossip in the agent (registry.go, discover).
func (c *costCluster) leaderFirst() []string {
	out := slices.Clone(c.voters)
	c.regsMu.RLock()
	defer c.regsMu.RUnlock()
	leads := func(v string) bool { r := c.regs[v]; return r != nil && r.IsLeader() }
	slices.SortStableFunc(out, func(a, b string) int {
		la, lb := leads(a), leads(b)
		switch {
		case la && !lb:
			return -1
		case lb && !la:
			return 1
		}
		return 0
	})
	return out
}

func (c *costCluster) issue(node string) (pki.Files, error) {
	certDir := filepath.Join(c.dir, "certs")
	if err := pki.IssueCert(c.caDir, certDir, node, []string{"127.0.0.1"}, 12*time.Hour); err != nil {
		return pki.Files{}, err
	}
	return pki.Files{CA: filepath.Join(c.caDir, "ca.crt"), Cert: filepath.Join(certDir, node+".crt"), Key: filepath.Join(certDir, node+".key")}, nil
}

func (c *costCluster) startAgent(i int, tr *gossiptest.Transport, seed string) error {
	node := c.names[i]
	cfg := agent.DefaultConfig()
	cfg.NodeName = node
	cfg.DataDir = filepath.Join(c.dir, node)
	cfg.Socket = filepath.Join(c.dir, node+".sock")
	cfg.Simulate = profiles[i%len(profiles)]
	cfg.NVML = "off"
	cfg.LogLevel = "warn"
	cfg.GossipAddr = "127.0.0.1:0"
	cfg.AdvertiseAddr = "127.0.0.1"
	cfg.PeerAddr = "127.0.0.1:0"
	cfg.InsecureGossip = true
	certDir := filepath.Join(c.dir, "certs")
	cfg.TLSCA, cfg.TLSCert, cfg.TLSKey = filepath.Join(c.caDir, "ca.crt"), filepath.Join(certDir, node+".crt"), filepath.Join(certDir, node+".key")
	if seed != "" {
		cfg.Join = []string{seed}
	}
	scale := time.Duration(c.scale)
	tune := func(mc *memberlist.Config) {
		mc.Transport = tr
		mc.ProbeInterval *= scale
		mc.ProbeTimeout *= scale
		mc.GossipInterval *= scale
		mc.PushPullInterval *= scale
	}
	a, err := agent.New(context.Background(), cfg, c.cfg.log.With("node", node),
		agent.WithPeerNetwork(c.net), agent.WithGossipTune(tune), agent.WithNames(c.regs[node]))
	if err != nil {
		return fmt.Errorf("starting %s: %w", node, err)
	}
	cancel, done, err := runAgent(a)
	if err != nil {
		return fmt.Errorf("starting %s: %w", node, err)
	}
	c.agents[i], c.cancels[i], c.dones[i] = a, cancel, done
	return nil
}

// awaitConverged polls until every agent sees every other alive with its
// capacity: a get or release must reach the owner the registry names.
func (c *costCluster) awaitConverged() error {
	start := time.Now()
	pending := slices.Clone(c.agents)
	for len(pending) > 0 {
		pending = slices.DeleteFunc(pending, func(a *agent.Agent) bool { return seesAll(a, len(c.agents)) })
		if len(pending) == 0 {
			break
		}
		if time.Since(start) > c.cfg.converge {
			return fmt.Errorf("%d of %d agents did not see every other within %v", len(pending), len(c.agents), c.cfg.converge)
		}
		time.Sleep(time.Duration(max(50, len(c.agents)/2)) * time.Millisecond)
	}
	return nil
}

func seesAll(a *agent.Agent, n int) bool {
	ms, _ := a.Members(context.Background())
	alive := 0
	for _, m := range ms {
		if m.State == "alive" && len(m.Models) > 0 {
			alive++
		}
	}
	return alive >= n
}

// awaitLeader makes every agent's registry handle find the leader (a
// lookup through each), so that no measured operation pays for a client's
// first search.
func (c *costCluster) awaitLeader() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, 8)
	)
	for _, node := range c.names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			for {
				_, err := c.regs[node].Lookup(ctx, names.Claim("warm-up"), names.Linearizable)
				if errors.Is(err, names.ErrNotFound) {
					return
				}
				if ctx.Err() != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s: %w", node, err))
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("the name registry did not answer %d agents; first: %w", len(errs), errs[0])
	}
	return nil
}

// self is each agent's own entry: its capacity, from its ledger.
func (c *costCluster) self() []api.Member {
	var out []api.Member
	for _, a := range c.agents {
		ms, _ := a.Members(context.Background())
		for _, m := range ms {
			if m.Self {
				out = append(out, m)
			}
		}
	}
	return out
}

func (c *costCluster) ledgerSyncs() int {
	s := 0
	for _, a := range c.agents {
		s += int(a.LedgerSyncs())
	}
	return s
}

func (c *costCluster) storeCommits() int {
	s := 0
	for _, v := range c.voters {
		if st := c.regs[v].Store(); st != nil {
			s += int(st.Commits())
		}
	}
	return s
}

// measureOps measures the operations, and the background beside them.
func (c *costCluster) measureOps(r *costResult) error {
	m := c.m
	peer0, op0, beats0, t0 := m.peerAll.Load(), m.peerOp.Load(), m.beats.Load(), time.Now()
	m.takeBackground()
	defer func() {
		r.bgPaths = m.takeBackground()
		r.phase = time.Since(t0)
		sec := r.phase.Seconds()
		r.bg = background{
			peer:  float64(m.peerAll.Load()-peer0-(m.peerOp.Load()-op0)) / sec,
			beats: float64(m.beats.Load()-beats0) / sec,
		}
	}()
	models := modelsByShare(c.capacity())
	rnd := rand.New(rand.NewPCG(c.cfg.seed, uint64(len(c.agents))))
	pick := func() *agent.Agent { return c.agents[rnd.IntN(len(c.agents))] }
	ctx := context.Background()
	stray0 := m.appendsUnattributed.Load()
	for k := range opKinds {
		r.paths[k] = map[string]int{}
	}
	for i := range c.cfg.ops {
		id := fmt.Sprintf("cost-%d-%d", len(c.agents), i)
		model := models[i%len(models)]
		var owner string
		steps := [opKinds]func() error{
			opClaim: func() error {
				cl, err := pick().Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: model, Count: 1}}})
				owner = cl.Node
				return err
			},
			opGet: func() error {
				cl, err := pick().Get(ctx, id)
				if err == nil && cl.Node != owner {
					err = fmt.Errorf("get answered %s on %s, claimed on %s", id, cl.Node, owner)
				}
				return err
			},
			opRelease: func() error { _, err := pick().Release(ctx, id); return err },
		}
		for k, step := range steps {
			s, settled, err := c.measure(id, step)
			retried := false
			for try := 1; isUnavailable(err) && try < 5; try++ {
				// A retryable 503 (the registry electing a leader, an owner
				// not seen for a moment): retried as a client would. The
				// failed attempt is left out; the retry is reported
				// apart, as it may wait for what the failed one left (a
				// name pending under the first coordinator until its
				// lease lapses, polled meanwhile).
				m.takePaths()
				r.leftOut++
				retried = true
				c.awaitRegistryLeader()
				s, settled, err = c.measure(id, step)
			}
			if retried && opKind(k) == opRelease && isNotFound(err) {
				// The attempt answered 503 had released it after all (an
				// owner slower than the coordinator's deadline): a
				// client's retry learns it from the 404.
				err = nil
			}
			if err != nil {
				return fmt.Errorf("%s %s: %w", opKind(k), id, err)
			}
			paths := m.takePaths()
			if !settled {
				r.unsettled++
			}
			switch {
			case s.election:
				r.leftOut++
				continue
			case retried:
				r.retried[k] = append(r.retried[k], s)
				continue
			}
			r.ops[k] = append(r.ops[k], s)
			for p, n := range paths {
				r.paths[k][p] += n
			}
		}
	}
	r.strayAppends = int(m.appendsUnattributed.Load() - stray0)
	return nil
}

// measure runs one operation on claim id and counts what it caused until
// nothing of it moved for the quiet period (settled), or 5 s; an operation
// that failed is waited for the same way, and its error returned.
func (c *costCluster) measure(id string, do func() error) (opSample, bool, error) {
	m := c.m
	c.awaitRegistryQuiet()
	m.takePaths()
	m.measure(id)
	defer m.measure("")
	snap := func() [6]int {
		return [6]int{int(m.peerOp.Load()), int(m.appendsOp.Load()), c.ledgerSyncs(), c.storeCommits(), int(m.votes.Load() + m.raftOther.Load()), int(m.redirects.Load())}
	}
	before := snap()
	t0 := time.Now()
	opErr := do()
	took := time.Since(t0)
	last, since := snap(), time.Now()
	settled := false
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
		if now := snap(); now != last {
			last, since = now, time.Now()
			continue
		}
		if time.Since(since) >= c.cfg.quiet {
			settled = true
			break
		}
	}
	if opErr != nil {
		// Waited for all the same: what the failed attempt set moving
		// must not land in the next window.
		return opSample{}, settled, opErr
	}
	return opSample{peer: last[0] - before[0], appends: last[1] - before[1], ledger: last[2] - before[2], store: last[3] - before[3], took: took,
		election: last[4] != before[4], redirects: last[5] - before[5]}, settled, nil
}

// awaitRegistryQuiet waits (up to 5 s) until every voter has stored and
// applied the leader's whole log: a follower still catching up on earlier
// entries would store them inside the next operation's window.
func (c *costCluster) awaitRegistryQuiet() {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		var last []uint64
		caughtUp := true
		for _, v := range c.voters {
			ra := c.regs[v].Raft()
			last = append(last, ra.LastIndex())
			caughtUp = caughtUp && ra.AppliedIndex() == ra.LastIndex()
		}
		if caughtUp && slices.Min(last) == slices.Max(last) {
			return
		}
	}
}

// awaitRegistryLeader waits (up to 30 s) until a voter leads the registry.
func (c *costCluster) awaitRegistryLeader() {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if slices.ContainsFunc(c.voters, func(v string) bool { return c.regs[v].IsLeader() }) {
			return
		}
	}
}

func isUnavailable(err error) bool {
	var e *api.Error
	return errors.As(err, &e) && e.Code == api.CodeUnavailable
}

// capacity is each server's usable GPUs per model.
func (c *costCluster) capacity() capacity {
	out := capacity{}
	for _, m := range c.self() {
		out[m.Name] = usable(m)
	}
	return out
}

// stop stops every agent, then the registry handles. All at once: each
// agent's graceful leave may wait seconds for gossip, which is idle time.
func (c *costCluster) stop() {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
	for i, a := range c.agents {
		if a == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c.cancels[i]()
			<-c.dones[i]
			a.Close()
		}()
	}
	wg.Wait()
	for _, reg := range c.regs {
		wg.Add(1)
		go func() { defer wg.Done(); _ = reg.Close() }()
	}
	wg.Wait()
	c.agents, c.regs = nil, map[string]*names.Registry{}
}

// startRest runs start for agents 1 to n-1 (the first, their seed, is
// started before), eight at a time, and says which failed.
func startRest(n int, start func(i int) error) []error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, 8)
	)
	for i := 1; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := start(i); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errs
}
