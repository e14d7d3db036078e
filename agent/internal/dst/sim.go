package dst

import (
	"container/heap"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// Config is one schedule's shape. Times are virtual milliseconds.
type Config struct {
	Seed    uint64
	Dir     string // the machines and ledgers; reused by every schedule
	Nodes   int
	Clients int
	IDs     int // claim IDs per client
	Ops     int // operations per client
	// Run is how long faults are injected; Settle how long the healed
	// cluster then runs before the checks: past every lease, timeout and
	// two anti-entropy passes (30 s each).
	Run, Settle      int64
	MaxDelay         int64
	ClientTimeout    int64
	ReservationLease int64
	NameLease        int64
	RememberReleased int64
	RegUncertain     float64
	// KillAtHold is the chance, while faults run, that an owner is
	// killed as its hold of a claim ID reaches the registry (half of
	// those holds then never take effect): its ledger's commit, written
	// while the hold is answered, is left awaiting its name.
	KillAtHold float64
	// KillAtRelease is the same chance for a name's release: the node is
	// killed as it reaches the registry (half of those releases then never
	// take effect). An owner's ledger has written the claim's release by
	// then, its fdatasync overlapping the registry's write.
	KillAtRelease float64
	// BrokenGrants makes the registry acknowledge holds and confirms it
	// never applies: owners then commit claims whose names they do not
	// hold, which the checks must catch.
	BrokenGrants bool
	Trace        bool
}

// DefaultConfig is the shape CI runs, for seed.
func DefaultConfig(seed uint64, dir string) Config {
	return Config{
		Seed: seed, Dir: dir, Nodes: 4, Clients: 4, IDs: 2, Ops: 12,
		Run: 90_000, Settle: 150_000, MaxDelay: 30, ClientTimeout: 6_000,
		ReservationLease: 5_000, NameLease: 5_000, RememberReleased: 10_000,
		RegUncertain: 0.05, KillAtHold: 0.05, KillAtRelease: 0.05,
	}
}

// offBeat puts the driver's steps off the processes' beat (run).
const offBeat = 7919 * time.Nanosecond

// profile is every simulated server's machine: two GPUs.
const profile = "rtx6000pro-2"

// Outcome is what one schedule did and what the checks found.
type Outcome struct {
	Seed       uint64
	Violations []string
	Trace      string
	ClientOps  int
	Acked      int
	RegOps     int
	Faults     int
	// History is the registry's operations, for the porcupine check
	// (model.go).
	History []regOp
	// Checked counts the IDs whose acknowledged state was checked;
	// Skipped those left out because an abandoned call might land late;
	// Revived those of them that a claim whose client gave up (not one
	// sent beside the release on purpose) brought back after an
	// acknowledged release: what the owner refuses to do for a caller
	// that stopped waiting (owner.callerGone) where it still can.
	Checked, Skipped, Revived int
	// AwaitingKept and AwaitingUndone count the commits awaiting their
	// name that restarted owners kept (the registry held the ID there) and
	// undid.
	AwaitingKept, AwaitingUndone int
	// KilledAtRelease counts the nodes killed as a name's release reached
	// the registry (Config.KillAtRelease); ReleasesLost, those releases
	// that never took effect.
	KilledAtRelease, ReleasesLost int
	// Known are violations of the kind the hand-back defect made (an
	// acknowledged claim lost after its moved name was handed back;
	// docs/names.md, "a hand-back that lapsed"): reported by name,
	// failing the run only with DST_STRICT=1.
	Known []string
}

// idState is what the clients know for certain about one claim ID.
type idState struct {
	// acked: the last operation on the ID was acknowledged and none was
	// sent after it: "claimed" (on node, GPUs) or "released".
	acked string
	node  string
	gpus  []string
	items []api.Item // what it was claimed with
	// abandoned: a call of this kind ended without a definite answer
	// (timeout, 503) and may still take effect later, after an answer
	// the client got to a later call (see docs/names.md, "Simulation");
	// "hasty" marks a claim sent beside a release on purpose.
	abandoned map[string]bool
}

// Run runs one schedule, in a synctest bubble of its own, and checks it.
func Run(t *testing.T, cfg Config) (out Outcome) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) { out = run(cfg) })
	return out
}

func run(cfg Config) (out Outcome) {
	w := &world{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		start: time.Now(), wake: make(chan struct{}, 1), ended: make(chan struct{}), seen: map[uint64]uint64{}}
	w.faulty.Store(true)
	w.reg = &registry{w: w}
	w.reg.base = names.NewLocal(time.Now, time.Duration(cfg.NameLease)*time.Millisecond)
	n := cfg.Nodes
	w.cut = make([][]bool, n+1)
	for i := range w.cut {
		w.cut[i] = make([]bool, n+1)
	}
	w.loss = float64(w.rng.IntN(4)) * 0.03 // 0, 3, 6 or 9 % of messages
	p, err := sim.Load(profile)
	if err != nil {
		panic(err)
	}
	for i := range n {
		nd := &node{w: w, idx: i, name: fmt.Sprintf("gpu-%c", 'a'+i), path: filepath.Join(cfg.Dir, fmt.Sprintf("ledger-%d.db", i))}
		removeLedger(nd.path)
		// The machine in memory: it outlives the agent's process here
		// without a state file.
		k, err := fakekernel.New(p.KernelConfig())
		if err != nil {
			panic(err)
		}
		nd.kernel = k
		w.nodes = append(w.nodes, nd)
	}
	w.gossip = newGossip(w)
	for _, nd := range w.nodes {
		if err := nd.start(); err != nil {
			panic(err)
		}
	}
	w.gossip.round()
	regCtx, stopReg := context.WithCancel(context.Background())
	go w.reg.expire(regCtx)
	// The driver's own steps (gossip rounds, faults, the heal) fall off
	// the whole milliseconds the processes' tickers keep: a process woken
	// by its timer at the instant the driver changes what it reads would
	// run beside the driver in no fixed order.
	var tick func()
	tick = func() {
		w.gossip.round()
		w.at(gossipEvery+offBeat, tick)
	}
	w.at(gossipEvery+offBeat, tick)

	ids := map[string]*idState{}
	var idNames []string
	for c := range cfg.Clients {
		for k := range cfg.IDs {
			id := fmt.Sprintf("vm-%d-%d", c, k)
			ids[id] = &idState{abandoned: map[string]bool{}}
			idNames = append(idNames, id)
		}
	}
	var model string
	for m := range w.nodes[0].ledger.Totals(time.Now()) {
		model = m // the profile has one model
	}
	for c := range cfg.Clients {
		cl := &client{w: w, ids: ids, mine: idNames[c*cfg.IDs : (c+1)*cfg.IDs], model: model,
			rng: rand.New(rand.NewPCG(cfg.Seed, uint64(c)+1))}
		go cl.run()
	}
	w.scheduleFaults(&out)

	w.runUntil(w.start.Add(time.Duration(cfg.Run)*time.Millisecond + offBeat))
	w.heal()
	w.runUntil(w.start.Add(time.Duration(cfg.Run+cfg.Settle) * time.Millisecond))
	// Every client has had its answer or given up; the leases have passed.
	w.checkFinal(ids, idNames)
	w.checkRegistry()

	// Tear down: every process stopped, every call in flight ended.
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	close(w.ended)
	for _, nd := range w.nodes {
		if nd.alive {
			nd.kill()
		}
	}
	stopReg()
	out.Seed = cfg.Seed
	out.Violations, out.Known = w.fail, w.known
	out.Trace = w.traceText()
	out.RegOps = w.reg.ops
	out.History = w.reg.history
	out.Checked, out.Skipped, out.Revived = w.checked, w.lateSkipped, w.revived
	out.ClientOps, out.Acked = int(w.clientOps.Load()), int(w.acked.Load())
	out.AwaitingKept, out.AwaitingUndone = int(w.awaitingKept.Load()), int(w.awaitingUndone.Load())
	out.KilledAtRelease, out.ReleasesLost = w.killedAtRelease, w.releasesLost
	return out
}

// removeLedger removes a ledger file and its journal.
func removeLedger(path string) {
	for _, p := range []string{path, ledger.JournalPath(path)} {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			panic(err)
		}
	}
}

// scheduleFaults plans the schedule's faults over its run.
func (w *world) scheduleFaults(out *Outcome) {
	n := len(w.nodes)
	for t := w.rng.Int64N(3_000); t < w.cfg.Run-5_000; t += 2_000 + w.rng.Int64N(6_000) {
		kind := w.rng.IntN(6)
		a := w.rng.IntN(n)
		b := (a + 1 + w.rng.IntN(n)) % (n + 1)                            // another node, or the registry
		dur := time.Duration(500+w.rng.Int64N(12_000)) * time.Millisecond // up to past every lease
		out.Faults++
		w.at(time.Duration(t)*time.Millisecond+time.Duration(w.rng.Int64N(int64(time.Millisecond))), func() {
			nd := w.nodes[a]
			switch kind {
			case 0: // kill -9, restarted later
				if !nd.alive {
					return
				}
				w.logf("FAULT kill %s for %v", nd.name, dur)
				w.killFor(nd, dur)
			case 1: // SIGSTOP past the leases
				if !nd.alive {
					return
				}
				w.logf("FAULT pause %s for %v", nd.name, dur)
				w.mu.Lock()
				nd.pausedUntil = later(nd.pausedUntil, time.Now().Add(dur))
				w.mu.Unlock()
			case 2, 3: // partition: two-way or one-way
				w.logf("FAULT cut %s -> %s (two-way %v) for %v", w.name(a), w.name(b), kind == 2, dur)
				w.cut[a][b] = true
				if kind == 2 {
					w.cut[b][a] = true
				}
				w.at(dur, func() {
					w.cut[a][b] = false
					if kind == 2 {
						w.cut[b][a] = false
					}
				})
			case 4: // the registry loses its quorum
				w.logf("FAULT registry down for %v", dur)
				w.reg.mu.Lock()
				w.reg.downUntil = later(w.reg.downUntil, time.Now().Add(dur))
				w.reg.mu.Unlock()
			case 5: // a node cut from everyone
				w.logf("FAULT isolate %s for %v", nd.name, dur)
				for j := range n + 1 {
					w.cut[a][j], w.cut[j][a] = true, true
				}
				w.at(dur, func() {
					for j := range n + 1 {
						w.cut[a][j], w.cut[j][a] = false, false
					}
				})
			}
		})
	}
}

// killFor kills nd as kill -9 does and restarts it dur later, unless the
// cluster was healed meanwhile (heal restarts it).
func (w *world) killFor(nd *node, dur time.Duration) {
	nd.kill()
	w.at(dur, func() {
		if !nd.alive && w.faulty.Load() {
			w.logf("FAULT restart %s", nd.name)
			if err := nd.start(); err != nil {
				panic(err)
			}
		}
	})
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// heal ends every fault: the settle phase runs on a healthy cluster.
func (w *world) heal() {
	w.logf("HEAL")
	w.faulty.Store(false)
	w.loss = 0
	for i := range w.cut {
		for j := range w.cut[i] {
			w.cut[i][j] = false
		}
	}
	w.reg.mu.Lock()
	w.reg.downUntil = time.Time{}
	w.reg.mu.Unlock()
	now := time.Now()
	for _, nd := range w.nodes {
		w.mu.Lock()
		nd.pausedUntil = time.Time{}
		w.mu.Unlock()
		if !nd.alive {
			if err := nd.start(); err != nil {
				panic(err)
			}
		}
	}
	// Messages held back by a pause go now, in their order.
	for _, d := range w.q {
		if d.at.After(now) && d.at.Sub(now) > time.Duration(w.cfg.MaxDelay)*time.Millisecond {
			d.at = now
		}
	}
	heap.Init(&w.q)
}

// client runs operations on its own claim IDs through random agents and
// retries a 503 or a timeout through another one, as a real client does.
type client struct {
	w     *world
	ids   map[string]*idState
	mine  []string
	model string
	rng   *rand.Rand
}

func (c *client) run() {
	w := c.w
	// Waits to the nanosecond: two clients' calls (and their timeouts)
	// never fall on one instant, where their goroutines would run side by
	// side in no fixed order.
	time.Sleep(c.upTo(500 * time.Millisecond))
	for range w.cfg.Ops {
		id := c.mine[c.rng.IntN(len(c.mine))]
		items := []api.Item{{Model: c.model, Count: 1 + c.rng.IntN(2)}}
		op := []string{"claim", "claim", "get", "release", "resize"}[c.rng.IntN(5)]
		st := c.ids[id]
		if op != "get" {
			st.acked = "" // what it was is no longer certain
		}
		if op == "release" && st.node != "" && c.rng.IntN(4) == 0 {
			// A hasty client: the same claim again, straight to the server
			// that held it, while the release may still run there.
			c.hasty(id, w.index(st.node), st.items, c.upTo(100*time.Millisecond))
		}
		for try := 3; try > 0; try-- {
			c.w.clientOps.Add(1)
			via := c.rng.IntN(len(w.nodes))
			cl, err, answered := c.do(via, op, id, items)
			switch {
			case !answered:
				w.logf("client %s %s via %s: no answer", op, id, w.name(via))
			case err != nil:
				w.logf("client %s %s via %s: %v", op, id, w.name(via), err)
			default:
				w.logf("client %s %s via %s: %s on %s %v", op, id, w.name(via), cl.State, cl.Node, gpuAddrs(cl))
			}
			if !answered || api.IsCode(err, api.CodeUnavailable) || api.IsCode(err, api.CodeInternal) {
				st.abandoned[op] = true
				time.Sleep(200*time.Millisecond + c.upTo(2*time.Second))
				continue
			}
			c.settled(op, id, cl, err)
			break
		}
		time.Sleep(c.upTo(1500 * time.Millisecond))
		if !w.faulty.Load() {
			return
		}
	}
}

// upTo is a random wait shorter than d, to the nanosecond.
func (c *client) upTo(d time.Duration) time.Duration { return time.Duration(c.rng.Int64N(int64(d))) }

// hasty sends a claim of id after delay without waiting for its answer,
// beside the client's next call: the two run at once, in no order the
// client knows, so the claim counts as abandoned.
func (c *client) hasty(id string, via int, items []api.Item, delay time.Duration) {
	c.ids[id].abandoned["claim"] = true
	c.ids[id].abandoned["hasty"] = true
	c.w.clientOps.Add(1)
	go func() {
		time.Sleep(delay)
		cl, err, answered := c.do(via, "claim", id, items)
		c.w.logf("client hasty claim %s via %s: %v %s %v", id, c.w.name(via), answered, cl.Node, err)
	}()
}

// do sends one call through agent via: its answer, or answered false
// when none came within the client's timeout.
func (c *client) do(via int, op, id string, items []api.Item) (api.Claim, error, bool) {
	w := c.w
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(w.cfg.ClientTimeout)*time.Millisecond)
	defer cancel()
	a, ok := w.call(ctx, -1, 0, via, fmt.Sprintf("client %s %s %v", op, id, items), func(hctx context.Context) any {
		co := w.nodes[via].coord
		var cl api.Claim
		var err error
		switch op {
		case "claim":
			cl, err = co.Claim(hctx, id, api.ClaimRequest{GPUs: items})
		case "get":
			cl, err = co.Get(hctx, id)
		case "release":
			cl, err = co.Release(hctx, id)
		case "resize":
			cl, err = co.Resize(hctx, id, api.ResizeRequest{GPUs: items})
		}
		return result[api.Claim]{v: wire(cl), err: wireError(err)}
	})
	if !ok {
		return api.Claim{}, nil, false
	}
	if _, refused := a.(notSent); refused {
		return api.Claim{}, &api.Error{Code: api.CodeUnavailable, Message: "connection refused"}, true
	}
	r := a.(result[api.Claim])
	if r.err != nil {
		return r.v, r.err, true
	}
	return r.v, nil, true
}

func gpuAddrs(c api.Claim) []string {
	out := make([]string, 0, len(c.GPUs))
	for _, g := range c.GPUs {
		out = append(out, g.PCIAddress)
	}
	slices.Sort(out)
	return out
}

// settled notes an acknowledged answer.
func (c *client) settled(op, id string, cl api.Claim, err error) {
	st := c.ids[id]
	switch {
	case (op == "claim" || op == "resize") && err == nil:
		st.acked, st.node, st.gpus, st.items = "claimed", cl.Node, gpuAddrs(cl), cl.Items
		c.w.acked.Add(1)
	case op == "release" && (err == nil || api.IsCode(err, api.CodeNotFound)):
		st.acked = "released"
		c.w.acked.Add(1)
	}
}

// checkFinal checks the healed, settled cluster against what the clients
// were told.
func (w *world) checkFinal(ids map[string]*idState, order []string) {
	now := time.Now()
	for _, id := range order {
		st := ids[id]
		var holders []string
		var held ledger.Claim
		for _, nd := range w.nodes {
			c, err := nd.ledger.Get(id)
			if err == nil && c.Live(now) {
				if c.State == ledger.StateReserved {
					w.violation("claim %s still reserved on %s after every lease passed", id, nd.name)
					continue
				}
				if c.AwaitingName {
					// Its owner asks the registry at start and again
					// from half a second on: the settle phase is
					// several passes long.
					w.violation("claim %s still awaits its name on %s after the cluster healed", id, nd.name)
				}
				holders = append(holders, nd.name)
				held = c
			}
		}
		if len(holders) > 1 {
			w.violation("claim %s committed on %v: a name held twice", id, holders)
		}
		switch {
		case st.acked == "claimed" && (st.abandoned["release"] || st.abandoned["resize"]),
			st.acked == "released" && st.abandoned["claim"]:
			// An abandoned resize cannot place a copy once the name is
			// released: its move needs the name held.
			w.lateSkipped++
			if st.acked == "released" && !st.abandoned["hasty"] && len(holders) > 0 {
				w.revived++
				w.logf("final: %s released, and held again on %v by a claim whose client gave up", id, holders)
			}
		case st.acked == "claimed":
			w.checked++
			if len(holders) == 0 {
				if w.reg.handedBack(id) {
					w.knownDefect("acknowledged claim %s (GPUs %v on %s) is held nowhere after a hand-back of its moved name: lost", id, st.gpus, st.node)
				} else {
					w.violation("acknowledged claim %s (GPUs %v on %s) is held nowhere: lost", id, st.gpus, st.node)
				}
			} else if !slices.Equal(held.GPUs, st.gpus) || holders[0] != st.node {
				w.violation("acknowledged claim %s had GPUs %v on %s and now holds %v on %s", id, st.gpus, st.node, held.GPUs, holders[0])
			}
		case st.acked == "released":
			w.checked++
			if len(holders) > 0 {
				w.violation("acknowledged release of %s, but %v holds its GPUs %v", id, holders, held.GPUs)
			}
		}
	}
}

// checkRegistry checks that, once settled, the registry and the ledgers
// agree: every held name's owner holds the claim committed under its
// token, and every committed claim's name is held by its owner.
func (w *world) checkRegistry() {
	ctx := context.Background()
	if _, err := w.reg.base.ExpirePending(ctx); err != nil {
		panic(err)
	}
	l, err := w.reg.base.List(ctx, names.Filter{Kind: names.KindClaim}, names.Linearizable)
	if err != nil {
		panic(err)
	}
	byName := map[string]names.Record{}
	for _, r := range l.Records {
		byName[r.Name] = r
		if r.State != names.StateHeld {
			w.violation("name %s still %s after every lease passed", r.Name, r.State)
			continue
		}
		c, err := w.nodes[w.index(r.Owner)].ledger.Get(r.Name)
		if err != nil || c.State != ledger.StateCommitted {
			w.violation("name %s held on %s (token %d), whose ledger does not hold it", r.Name, r.Owner, r.Token)
		} else if c.NameToken != r.Token {
			w.violation("name %s held on %s under token %d, committed there under %d", r.Name, r.Owner, r.Token, c.NameToken)
		}
	}
	for _, nd := range w.nodes {
		for _, c := range nd.ledger.List() {
			if c.State != ledger.StateCommitted {
				continue
			}
			if r, ok := byName[c.ID]; !ok || r.Owner != nd.name {
				w.violation("claim %s committed on %s, but the registry has %+v", c.ID, nd.name, r)
			}
		}
	}
}

func (w *world) index(name string) int {
	for i, nd := range w.nodes {
		if nd.name == name {
			return i
		}
	}
	panic("no node " + name)
}
