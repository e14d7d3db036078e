// Command gpuherd-bench measures gpuherd against real baselines on one
// machine: claim latency and throughput of N in-process agents on loopback
// (real memberlist, real HTTPS with mutual TLS, real bbolt with fsync,
// simulated hardware), the same against a central allocator on etcd, the
// placement quality against an omniscient best-fit oracle and against
// first-fit and random rankings of the same gossip view, gossip convergence
// up to 100 real agents and up to 1,000 members on memberlist's in-memory
// transport, and the floor: one loopback mTLS round trip and one fsync.
//
// It prints Markdown tables and writes PNG plots (see BENCHMARKS.md).
//
//	make bench                                          # the default run, < 10 min on 2 cores
//	bin/gpuherd-bench -sizes 10 -loads 0.9 -mock 100     # a quick one, after make bench built it
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/pki"
)

type options struct {
	sizes    []int
	focus    int
	loads    []float64
	hold     time.Duration
	traceDur time.Duration
	seq      int
	workers  int
	tput     time.Duration
	idle     time.Duration
	mock     []int
	mockIdle time.Duration
	trials   int
	seed     uint64
	etcdBin  string
	out      string
	keep     bool
	child    bool
	rankers  bool   // the bench coordinator's rows beside the agents' replays
	tputProf string // CPU profile of the agents' throughput test
	cost     costConfig
	model    modelConfig
	childAt  []int    // -child-members
	childEnv []string // -child-env
	procs    int      // -procs
}

func main() {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	var o options
	var sizes, loads, mock, cost, model, childAt, childEnv string
	flag.StringVar(&sizes, "sizes", "10,50,100", "cluster sizes of real in-process agents")
	flag.IntVar(&o.focus, "focus", 50, "size at which the load sweep, the rankers and etcd run")
	flag.StringVar(&loads, "loads", "0.5,0.7,0.9,0.95", "target loads (share of all GPUs held) of the trace replays")
	flag.DurationVar(&o.hold, "hold", 3*time.Second, "mean holding time of a claim in the trace (exponential)")
	flag.DurationVar(&o.traceDur, "trace", 6*time.Second, "measured length of each trace replay (after a warm-up fill)")
	flag.IntVar(&o.seq, "seq", 150, "sequential claims (claim 1 GPU, release) for unloaded latency, per size")
	flag.IntVar(&o.procs, "procs", 0, "agents in processes of their own (one each, as on a platform) for the unloaded latency and the throughput test, reached through their API sockets; 0 skips it")
	flag.IntVar(&o.workers, "workers", 16, "concurrent clients of the throughput test")
	flag.DurationVar(&o.tput, "tput", 5*time.Second, "length of the throughput test")
	flag.DurationVar(&o.idle, "idle", 8*time.Second, "idle window for CPU and memory")
	flag.StringVar(&mock, "mock", "100,250", "sizes of the in-memory gossip clusters")
	flag.DurationVar(&o.mockIdle, "mock-idle", 10*time.Second, "idle window of the in-memory gossip clusters (bytes/s, CPU)")
	flag.IntVar(&o.trials, "trials", 3, "capacity changes timed per size (each also timed back)")
	var seed uint
	flag.UintVar(&seed, "seed", 1, "seed of the traces and of every random choice of the bench")
	flag.StringVar(&o.etcdBin, "etcd", "/usr/bin/etcd", "etcd server binary (Debian: etcd-server)")
	flag.StringVar(&o.out, "out", "docs/bench", "directory for the PNG plots")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory")
	flag.BoolVar(&o.child, "child", true, "measure one agent in a process of its own at the largest size")
	flag.BoolVar(&o.rankers, "rankers", true, "replay the traces through the bench coordinator's rankings (best fit, first fit, random on the gossip view) too, at the focus size; false replays only the agents'")
	flag.StringVar(&cost, "cost", "10,100,1000", "sizes (servers) at which the messages and fsyncs per claim, get and release are counted")
	flag.IntVar(&o.cost.ops, "cost-ops", 50, "claims (each followed by a get and a release) per cost size")
	flag.DurationVar(&o.cost.quiet, "cost-quiet", 200*time.Millisecond, "an operation's window closes once nothing it caused moved for this long")
	flag.StringVar(&o.tputProf, "tput-cpuprofile", "", "write a CPU profile of the agents' throughput test alone to this file (its last size's), its allocations to FILE.allocs-start and FILE.allocs, and its lock contention to FILE.mutex")
	flag.StringVar(&model, "model", "50,100,250,1000,10000", "sizes of the gossip model (tools/internal/gossipsim); empty to skip it")
	flag.DurationVar(&o.model.churn, "model-churn", 10*time.Minute, "mean time between two capacity changes of one server, in the model's loaded runs")
	flag.IntVar(&o.model.changes, "model-changes", 5, "changes timed per size in the model")
	flag.StringVar(&childAt, "child-members", "", "sizes of gossip-only clusters (real memberlist on loopback, in this process) that one agent in its own process joins, for its RSS; e.g. 1000")
	flag.StringVar(&childBin, "child-bin", "", "run that agent from this gpuherd binary (gpuherd agent --config) instead of re-executing the bench")
	flag.StringVar(&childEnv, "child-env", "", "environment of that agent, space-separated KEY=VALUE (e.g. GOMEMLIMIT=32MiB); \"|\" separates variants, each measured")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	flag.Parse()
	o.seed = uint64(seed)
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	raiseFileLimit()
	if o.procs < 0 || (o.procs > 0 && o.procs < len(profiles)) {
		// The processes run the simulated servers round robin, as the
		// in-process cluster does; with fewer, some model it claims is
		// missing and every claim of it is refused.
		fatal(fmt.Errorf("-procs %d: 0, or at least %d (one agent of each simulated server: %s)", o.procs, len(profiles), strings.Join(profiles, ", ")))
	}
	var err error
	if o.sizes, err = parseInts(sizes); err != nil {
		fatal(err)
	}
	if o.mock, err = parseInts(mock); err != nil {
		fatal(err)
	}
	if o.loads, err = parseFloats(loads); err != nil {
		fatal(err)
	}
	if o.cost.sizes, err = parseInts(cost); err != nil {
		fatal(err)
	}
	if o.model.sizes, err = parseInts(model); err != nil {
		fatal(err)
	}
	o.model.seed = o.seed
	if o.childAt, err = parseInts(childAt); err != nil {
		fatal(err)
	}
	o.childEnv = strings.Split(childEnv, "|")
	o.cost.converge, o.cost.seed = 10*time.Minute, o.seed
	o.cost.log, o.cost.progress = slog.New(slog.DiscardHandler), progress
	slices.Sort(o.sizes)
	if len(o.sizes) > 0 && !slices.Contains(o.sizes, o.focus) {
		o.focus = o.sizes[len(o.sizes)/2]
	}
	if err := run(o); err != nil {
		fatal(err)
	}
}

// raiseFileLimit lifts the open-file limit: in one process, N agents that
// all talk to each other hold N×(N−1) client and as many server sockets
// (about 20,000 at 100 agents), which one agent per server never does.
func raiseFileLimit() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return
	}
	want := uint64(1 << 18)
	if l.Max < want {
		n := syscall.Rlimit{Cur: want, Max: want}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n) == nil { // needs CAP_SYS_RESOURCE
			return
		}
	}
	l.Cur = l.Max
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "gpuherd-bench:", err)
	os.Exit(1)
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 2 {
			return nil, fmt.Errorf("size %q: want an integer ≥ 2", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func parseFloats(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		x, err := strconv.ParseFloat(f, 64)
		if err != nil || x <= 0 || x > 1.5 {
			return nil, fmt.Errorf("load %q: want a share like 0.9", f)
		}
		out = append(out, x)
	}
	return out, nil
}

// progress goes to stderr; tables to stdout.
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// sizeResult is everything measured at one cluster size.
type sizeResult struct {
	n               int
	gpus            int
	startup         time.Duration
	converge        time.Duration
	seqAgent        durations // Agent.Claim, unloaded
	seqView         durations // bench coordinator, no ID lookup, unloaded
	lookup          durations // Agent.Get of an unknown ID: the home, then every server
	viaDirectory    int64     // claim-ID lookups the IDs' homes answered, over the Agent.Claim phases
	viaEvery        int64     // claim-ID lookups that asked every server
	tput            float64
	tputCPU         time.Duration // this process's CPU during the throughput test
	tputSyncs       syncCount     // the agents' disk syncs during the throughput test
	tputLat         durations
	tputErr         int
	tputRetries     int64 // owners' stale answers (not_available) during the test
	rssTotal        int64
	cpuIdle         time.Duration // process CPU during the idle window
	idleWin         time.Duration
	spreads         []spread
	replays         []replayResult
	oracle          map[float64][3]int // load → accepted by omniscient best fit, first fit, random
	oracleOffer     map[float64]int    // load → claims offered (warm-up excluded)
	oracleTies      map[float64][3]int // load → omniscient best fit over tieSeeds other tie-breaks: fewest, median, most accepted
	childRSS        int64
	childCPU        time.Duration
	childWin        time.Duration
	childErr        error
	etcdSeq         durations
	etcdTput        float64
	etcdTputLat     durations
	etcdReplay      *replayResult
	etcdErr         error
	etcdTputErrs    int
	etcdTputRetries int64         // transactions that lost a race and were retried
	etcdTputCPU     time.Duration // the bench's and etcd's CPU during etcd's throughput test
	etcdSyncs       syncCount     // etcd's disk syncs during its throughput test
	meshSkipped     bool          // Agent.Claim phases skipped: the full mesh exceeds the open-file limit
	models          []string      // the models claimed, by their share of the GPUs
}

func run(o options) error {
	began := time.Now()
	dir, err := os.MkdirTemp("", "gpuherd-bench-")
	if err != nil {
		return err
	}
	if !o.keep {
		defer os.RemoveAll(dir)
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctr := &counters{}
	c, err := newCluster(dir, ctr, log)
	if err != nil {
		return err
	}
	defer c.stop()
	benchFiles, err := c.issue(benchCoordinator)
	if err != nil {
		return err
	}
	progress("work dir %s; %d CPUs; %s", dir, runtime.NumCPU(), runtime.Version())

	progress("floor: loopback mTLS round trips and bbolt fsyncs")
	fl, err := measureFloor(c, 800)
	if err != nil {
		return err
	}

	var results []*sizeResult
	for _, n := range o.sizes {
		r, err := runSize(o, c, n, benchFiles)
		if err != nil {
			return fmt.Errorf("at %d agents: %w", n, err)
		}
		results = append(results, r)
	}
	c.stop()
	var procs *procsResult
	if o.procs > 0 && len(results) > 0 {
		models := results[len(results)-1].models
		for _, r := range results {
			if r.n == o.focus {
				models = r.models
			}
		}
		pr := runProcs(o, c, o.procs, models)
		if pr.err != nil {
			progress("  %v", pr.err)
		}
		procs = &pr
	}

	var mocks []mockResult
	if len(o.mock) > 0 {
		// Hundreds of memberlists in one process allocate fast: a larger
		// GC target leaves more of the two cores to their probes (the
		// memory figures are the live heap after a GC).
		defer debug.SetGCPercent(debug.SetGCPercent(400))
	}
	for _, n := range o.mock {
		progress("gossip on memberlist's in-memory transport: %d members", n)
		m, err := convergeMock(n, o.trials*2, 20*time.Second, o.mockIdle)
		if err != nil {
			progress("  %v", err)
			continue
		}
		mocks = append(mocks, m)
		if sp := mergeSpreads(m.changes); m.join >= 0 {
			progress("  formed in %v; a change seen by 50%% / 99%% / 100%% after %v / %v / %v; idle %.0f B/s per member; %.0f bytes per member per change; live heap %.0f KiB per member",
				m.join.Round(time.Millisecond), sp.p50, sp.p99, sp.all, perMember(m.idle, m.n, m.idleWin), m.changeBytes(), float64(m.heap)/1024/float64(m.n))
		}
		runtime.GC()
	}
	var childs []childScale
	var envs [][]string
	for _, e := range o.childEnv {
		envs = append(envs, strings.Fields(e))
	}
	for _, n := range o.childAt {
		progress("one agent in its own process joined to %d gossip members on loopback", n)
		for _, r := range runChildScale(c, n, envs, max(o.idle, 5*time.Second), o.out) {
			if r.err != nil {
				progress("  %v", r.err)
			} else {
				progress("  RSS %s MiB (anonymous %s, file %s), heap objects %s MiB, %d goroutines",
					mib(r.stats.RSS), mib(r.stats.RSSAnon), mib(r.stats.RSSFile), mib(int64(r.stats.HeapObjects)), r.stats.Goroutines)
			}
			childs = append(childs, r)
		}
		runtime.GC()
	}
	metaSize := 0
	if b, err := benchSummary(8).Encode(); err == nil {
		metaSize = len(b)
	}
	models := runModel(o.model, metaSize)
	costs := runCost(o.cost)
	if len(results) > 0 {
		report(os.Stdout, o, fl, results, procs, mocks, time.Since(began))
	}
	reportMock(os.Stdout, mocks)
	reportChildScale(os.Stdout, childs)
	if len(models) > 0 {
		reportModel(os.Stdout, o.model, models, mocks)
	}
	if len(costs) > 0 {
		reportCost(os.Stdout, o.cost, costs)
		reportScaleCost(os.Stdout, costs, models, mocks)
	}
	if len(results) > 0 {
		if err := plots(o, fl, results, mocks); err != nil {
			return err
		}
	}
	if err := plotScale(o, mocks, models); err != nil {
		return err
	}
	progress("done in %v", time.Since(began).Round(time.Second))
	return nil
}

func runSize(o options, c *cluster, n int, benchFiles pki.Files) (*sizeResult, error) {
	ctx := context.Background()
	r := &sizeResult{n: n, oracle: map[float64][3]int{}, oracleOffer: map[float64]int{}, oracleTies: map[float64][3]int{}}
	progress("starting agents: %d → %d", len(c.nodes), n)
	t0 := time.Now()
	if err := c.start(n-len(c.nodes), 8); err != nil {
		return nil, err
	}
	r.startup = time.Since(t0)
	conv, err := c.waitConverged(120 * time.Second)
	if err != nil {
		return nil, err
	}
	r.converge = conv
	capa := c.capacity()
	for _, ms := range capa {
		for _, k := range ms {
			r.gpus += k
		}
	}
	progress("%d agents up in %v, gossip converged %v later; %d GPUs", n, r.startup.Round(time.Millisecond), conv.Round(time.Millisecond), r.gpus)
	time.Sleep(2 * time.Second) // let the join traffic settle

	progress("idle for %v: CPU and memory", o.idle)
	runtime.GC()
	cpu0 := cpuTime()
	w0 := time.Now()
	time.Sleep(o.idle)
	r.cpuIdle, r.idleWin = cpuTime()-cpu0, time.Since(w0)
	r.rssTotal = rssBytes(0)

	progress("convergence of a capacity change: %d trials", o.trials)
	r.spreads, err = convergeReal(c, o.trials, 15*time.Second)
	if err != nil {
		return nil, err
	}

	models := modelsByShare(capa)
	r.models = models
	rnd := rand.New(rand.NewPCG(o.seed, uint64(n)))
	agentA := agentAlloc{c: c}
	va := newViewAlloc("bench coordinator (best fit)", c, bestFit, benchFiles)
	defer va.close()
	mesh := meshFits(n)
	r.meshSkipped = !mesh
	if !mesh {
		progress("%d agents talking to each other need ~%d sockets in this one process, over the open-file limit: Agent.Claim phases skipped, the bench coordinator runs them", n, 2*n*(n-1))
	}
	progress("warming the connections: every agent looks a claim up on every other")
	warm(c, va, mesh)
	if mesh {
		progress("waiting for the claim directory to vouch (directory_settle after the last join)")
		if err := waitDirectory(c, models[0], 60*time.Second); err != nil {
			return nil, err
		}
		progress("waiting for the name registry's voters (a steady cluster is measured, not its founding)")
		if err := waitRegistry(c, 60*time.Second); err != nil {
			return nil, err
		}
	}
	dir0, every0 := c.ctr.viaDirectory.Load(), c.ctr.viaEveryServer.Load()
	progress("unloaded latency: %d claims through the agents, then the bench coordinator", o.seq)
	for i := range o.seq {
		if !mesh {
			break
		}
		id := fmt.Sprintf("seq-%d-%d", n, i)
		t := time.Now()
		srv, err := agentA.claim(ctx, rnd, id, models[i%len(models)], 1)
		if err != nil {
			return nil, fmt.Errorf("sequential claim: %w", err)
		}
		r.seqAgent = append(r.seqAgent, time.Since(t))
		if err := agentA.release(ctx, id, srv); err != nil {
			return nil, err
		}
	}
	for i := range o.seq {
		id := fmt.Sprintf("seqv-%d-%d", n, i)
		t := time.Now()
		srv, err := va.claim(ctx, rnd, id, models[i%len(models)], 1)
		if err != nil {
			return nil, fmt.Errorf("sequential claim (bench coordinator): %w", err)
		}
		r.seqView = append(r.seqView, time.Since(t))
		_ = va.release(ctx, id, srv)
	}
	for i := range o.seq / 2 {
		if !mesh {
			break
		}
		nd := c.nodes[rnd.IntN(len(c.nodes))]
		t := time.Now()
		_, err := nd.a.Get(ctx, fmt.Sprintf("nowhere-%d", i))
		if err == nil || !isNotFound(err) {
			return nil, fmt.Errorf("lookup of an unknown claim: %v", err)
		}
		r.lookup = append(r.lookup, time.Since(t))
	}

	progress("throughput: %d clients for %v", o.workers, o.tput)
	var tpErr error
	var tpAlloc allocator = agentA
	if !mesh {
		tpAlloc = va
	}
	stopProf := startProfile(o.tputProf)
	cpu0 = cpuTime()
	syncs0 := c.syncs()
	retries0 := tpAlloc.retries()
	sched0 := schedLatencies()
	r.tputLat, r.tput, r.tputErr, tpErr = closedLoop(ctx, tpAlloc, models, o.workers, o.tput, o.seed, fmt.Sprintf("tp-%d", n))
	progress("  waits to run: %s", schedSince(sched0))
	r.tputCPU = cpuTime() - cpu0
	r.tputSyncs = c.syncs().minus(syncs0)
	r.tputRetries = tpAlloc.retries() - retries0
	stopProf()
	if tpErr != nil {
		progress("  %d errors, first: %v", r.tputErr, tpErr)
	}

	loads := []float64{0.9}
	if n == o.focus {
		loads = o.loads
	}
	for _, load := range loads {
		tr := newTrace(o.seed, capa, load, o.hold, o.traceDur, "x")
		a, off := simulate(tr, capa, bestFit, o.seed)
		b, _ := simulate(tr, capa, firstFit, o.seed)
		cc, _ := simulate(tr, capa, randomFit, o.seed)
		r.oracle[load] = [3]int{a, b, cc}
		r.oracleOffer[load] = off
		r.oracleTies[load] = tieSpread(tr, capa, o.seed)
		allocs := []allocator{agentA}
		if !mesh {
			allocs = []allocator{va}
		}
		if n == o.focus && o.rankers {
			allocs = append(allocs, va,
				newViewAlloc("bench coordinator (first fit)", c, firstFit, benchFiles),
				newViewAlloc("bench coordinator (random)", c, randomFit, benchFiles))
		}
		for k, al := range allocs {
			tr := newTrace(o.seed, capa, load, o.hold, o.traceDur, fmt.Sprintf("t%d-%02.0f-%d", n, load*100, k))
			progress("replay at load %.0f%% (%.1f claims/s, %d claims): %s", load*100, tr.Rate, len(tr.Requests), al.name())
			res := replay(ctx, tr, al, c.truthFree, o.seed)
			if res.firstErr != nil {
				progress("  %d errors, first: %v", res.errors, res.firstErr)
			}
			r.replays = append(r.replays, res)
			if v, ok := al.(*viewAlloc); ok && v != va {
				v.close()
			}
			time.Sleep(time.Second)
		}
	}

	r.viaDirectory, r.viaEvery = c.ctr.viaDirectory.Load()-dir0, c.ctr.viaEveryServer.Load()-every0
	if n == o.focus {
		runEtcd(o, c, r, capa, models)
	}
	if o.child && n == o.sizes[len(o.sizes)-1] {
		progress("one agent in its own process, joined to the %d", n)
		ch, err := startChild(c, fmt.Sprintf("gpu%03d", 900+n%100), "dgx-h100")
		if err != nil {
			r.childErr = err
		} else {
			time.Sleep(3 * time.Second)
			pid := ch.cmd.Process.Pid
			c0, w := procCPU(pid), time.Now()
			time.Sleep(o.idle)
			r.childCPU, r.childWin = procCPU(pid)-c0, time.Since(w)
			r.childRSS = rssBytes(pid)
			ch.stop()
		}
	}
	return r, nil
}

func runEtcd(o options, c *cluster, r *sizeResult, capa capacity, models []string) {
	ctx := context.Background()
	progress("etcd baseline: %s", o.etcdBin)
	e, err := startEtcd(o.etcdBin, c.dir)
	if err != nil {
		r.etcdErr = err
		progress("  %v", err)
		return
	}
	defer e.stop()
	cli, err := e.client()
	if err != nil {
		r.etcdErr = err
		return
	}
	defer cli.Close()
	ea, err := newEtcdAlloc(cli, capa)
	if err != nil {
		r.etcdErr = err
		return
	}
	rnd := rand.New(rand.NewPCG(o.seed, 99))
	for i := range o.seq {
		id := fmt.Sprintf("eseq-%d", i)
		t := time.Now()
		srv, err := ea.claim(ctx, rnd, id, models[i%len(models)], 1)
		if err != nil {
			r.etcdErr = err
			return
		}
		r.etcdSeq = append(r.etcdSeq, time.Since(t))
		_ = ea.release(ctx, id, srv)
	}
	progress("etcd throughput: %d clients for %v", o.workers, o.tput)
	var tpErr error
	cpu0, ecpu0 := cpuTime(), procCPU(e.cmd.Process.Pid)
	esyncs0, serr := e.syncs(ctx)
	conflicts0 := ea.retries()
	r.etcdTputLat, r.etcdTput, r.etcdTputErrs, tpErr = closedLoop(ctx, ea, models, o.workers, o.tput, o.seed, "etp")
	r.etcdTputRetries = ea.retries() - conflicts0
	r.etcdTputCPU = cpuTime() - cpu0 + procCPU(e.cmd.Process.Pid) - ecpu0
	if esyncs1, err := e.syncs(ctx); err == nil && serr == nil {
		r.etcdSyncs = esyncs1.minus(esyncs0)
	} else {
		progress("  etcd's sync counts unread: %v", cmp.Or(serr, err))
	}
	if tpErr != nil {
		progress("  %d errors, first: %v", r.etcdTputErrs, tpErr)
	}
	tr := newTrace(o.seed, capa, 0.9, o.hold, o.traceDur, "etr")
	progress("etcd replay at load 90%%")
	res := replay(ctx, tr, ea, nil, o.seed)
	r.etcdReplay = &res
}

// warm opens the connections a running platform keeps open: each agent's
// to every other (listing the claims asks every server), and the bench
// coordinator's to every owner. Without it the first claims through each
// agent pay up to N−1 TLS handshakes.
func warm(c *cluster, va *viewAlloc, agents bool) {
	ctx := context.Background()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, nd := range c.nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if agents {
				_, _ = nd.a.Claims(ctx)
			}
			if pc, err := va.client(nd.name); err == nil {
				_, _ = pc.Lookup(ctx, "warm-up")
			}
		}()
	}
	wg.Wait()
}

// waitDirectory waits until the claim directory answers lookups: the
// agents' homes vouch once the membership has been steady for
// directory_settle. A claim of a new ID through each agent in turn (then
// released) counts as a directory lookup once its home vouches.
// waitRegistry waits until every agent knows the name registry's leader
// and the registry has grown to its voters (three, or every agent when
// fewer): claims measured before that would measure its founding, whose
// configuration changes slow the first writes.
func waitRegistry(c *cluster, limit time.Duration) error {
	ctx := context.Background()
	want := min(3, len(c.nodes))
	start := time.Now()
	for {
		// Standbys (agents outside raft's configuration) list no voters:
		// the voters themselves do.
		ready, voters := true, 0
		for _, nd := range c.nodes {
			st, err := nd.a.Status(ctx)
			if err != nil || st.Names == nil || st.Names.Leader == "" {
				ready = false
				break
			}
			voters = max(voters, len(st.Names.Voters))
		}
		if ready && voters >= want {
			progress("  the registry has %d voters and every agent knows its leader, after %v", want, time.Since(start).Round(time.Millisecond))
			return nil
		}
		if time.Since(start) > limit {
			return fmt.Errorf("the name registry did not reach %d voters with a known leader within %v", want, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func waitDirectory(c *cluster, model string, limit time.Duration) error {
	ctx := context.Background()
	start := time.Now()
	for i := 0; ; i++ {
		before := c.ctr.viaDirectory.Load()
		nd := c.nodes[i%len(c.nodes)]
		id := fmt.Sprintf("settle-%d", i)
		cl, err := nd.a.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: model, Count: 1}}})
		if err != nil {
			return fmt.Errorf("waiting for the claim directory: %w", err)
		}
		vouched := c.ctr.viaDirectory.Load() > before
		if _, err := c.by[cl.Node].a.Release(ctx, id); err != nil {
			return fmt.Errorf("waiting for the claim directory: %w", err)
		}
		if vouched {
			progress("  the directory answered after %v", time.Since(start).Round(time.Millisecond))
			return nil
		}
		if time.Since(start) > limit {
			return fmt.Errorf("the claim directory did not vouch within %v", limit)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// meshFits reports whether n in-process agents that all talk to each other
// fit the open-file limit: each pair holds a client and a server socket per
// direction here, where a real server holds only its own ends.
func meshFits(n int) bool {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return true
	}
	return uint64(2*n*(n-1)+3000) < l.Cur
}

func isNotFound(err error) bool {
	var e *api.Error
	return errors.As(err, &e) && e.Code == api.CodeNotFound
}

// modelsByShare lists models weighted by their share of GPUs (a model with
// twice the GPUs appears twice as often).
func modelsByShare(capa capacity) []string {
	tot := map[string]int{}
	for _, ms := range capa {
		for m, k := range ms {
			tot[m] += k
		}
	}
	var out []string
	for m, k := range tot {
		for range (k + 9) / 10 {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return out
}
