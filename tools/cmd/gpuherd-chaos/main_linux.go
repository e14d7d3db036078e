package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
)

func main() { os.Exit(run()) }

type options struct {
	seed     uint64
	agents   int
	duration time.Duration
	binary   string
	claimers int
	lease    time.Duration
	settle   time.Duration
	cliShare float64
	lanes    int
	owners   int
	groups   int
	keep     bool
	cleanup  bool
	prefix   string
	sabotage string
}

func parseFlags() options {
	var o options
	flag.Uint64Var(&o.seed, "seed", 1, "seed of every random choice (faults, targets, requests); printed")
	flag.IntVar(&o.agents, "agents", 5, "agents, each a separate process in its own network namespace (2 to 200)")
	flag.DurationVar(&o.duration, "duration", 40*time.Second, "how long claimers and faults run")
	flag.StringVar(&o.binary, "binary", "bin/gpuherd", "the gpuherd binary")
	flag.IntVar(&o.claimers, "claimers", 8, "concurrent claimers")
	flag.DurationVar(&o.lease, "lease", 5*time.Second, "the agents' --reservation-lease (at least 3s)")
	flag.DurationVar(&o.settle, "directory-settle", 2*time.Second, "the agents' --directory-settle: short, so that the claim directory vouches between faults")
	flag.Float64Var(&o.cliShare, "cli-share", 0.2, "share of the claimers' operations that run the gpuherd CLI instead of the API client")
	flag.IntVar(&o.lanes, "fault-lanes", 2, "faults injected concurrently")
	flag.IntVar(&o.owners, "owner-lanes", 2, "concurrent owner scenarios: a claim lands, its owner is killed, frozen past a lease, cut off or partitioned with the name authority, while clients retry the claim through the other agents")
	flag.IntVar(&o.groups, "group-clients", 1, "concurrent clients creating, resizing and deleting node groups")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (logs, data dirs) also when the run passes")
	flag.BoolVar(&o.cleanup, "cleanup", false, "only remove what a crashed run left (its namespaces and their processes), then exit")
	flag.StringVar(&o.prefix, "netns-prefix", "ghc", "prefix of the network namespaces this program creates and removes")
	flag.StringVar(&o.sabotage, "sabotage", "", "check the checker: \"wipe-ledger\" deletes n1's ledger.db before the final restart, which must be reported as lost commits")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), `Usage: gpuherd-chaos [flags]

Runs gpuherd agents as separate processes in network namespaces joined by
veth pairs to a bridge, drives concurrent claimers through them while
injecting faults (kill -9 and restart, SIGSTOP, partitions, packet loss),
then heals everything, restarts every agent and checks the invariants.
Needs root (network namespaces) and nft. Exit 0: no violation; 1: a
violation or a harness failure; 2: usage or setup error.

`)
		flag.PrintDefaults()
	}
	flag.Parse()
	return o
}

// clock prefixes every line with the time since the start.
type clock struct {
	mu    sync.Mutex
	start time.Time
}

func (c *clock) logf(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fmt.Printf("[%6.1fs] %s\n", time.Since(c.start).Seconds(), fmt.Sprintf(format, args...))
}

func run() int {
	o := parseFlags()
	ck := &clock{start: time.Now()}
	logf := ck.logf
	if flag.NArg() > 0 || o.agents < 2 || o.agents > 200 || o.lease < 3*time.Second || o.settle < 0 || o.duration <= 0 || o.claimers < 1 || o.lanes < 0 || o.owners < 0 || o.groups < 0 ||
		(o.sabotage != "" && o.sabotage != "wipe-ledger") {
		fmt.Fprintln(os.Stderr, "gpuherd-chaos: bad flags (see -h): need 2 to 200 agents, a lease of at least 3s, a directory settle of 0 or more, a positive duration, 1 claimer or more")
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "gpuherd-chaos: must run as root (it creates network namespaces)")
		return 2
	}
	nw := &network{prefix: o.prefix, n: o.agents}
	ctx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stopSignals()
	if o.cleanup {
		if err := nw.teardown(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "gpuherd-chaos:", err)
			return 1
		}
		return 0
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			fmt.Fprintf(os.Stderr, "gpuherd-chaos: %s not found (install iproute2 and nftables)\n", tool)
			return 2
		}
	}
	bin, err := filepath.Abs(o.binary)
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuherd-chaos: --binary: %v (run `make build`)\n", err)
		return 2
	}
	fmt.Printf("gpuherd-chaos: seed=%d agents=%d duration=%s claimers=%d fault-lanes=%d owner-lanes=%d group-clients=%d lease=%s directory-settle=%s binary=%s\n",
		o.seed, o.agents, o.duration, o.claimers, o.lanes, o.owners, o.groups, o.lease, o.settle, bin)

	dir, err := os.MkdirTemp("", "gpuherd-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpuherd-chaos:", err)
		return 2
	}
	h := newHistory(logf)
	h.seed = o.seed
	var agents []*agent
	// Set before the workload starts, read-only after.
	h.resizeLeftMixed = func(group string) bool { return loggedResizeLeftMixed(agents, group) }
	failed := true
	defer func() {
		for _, a := range agents {
			a.signal(syscall.SIGCONT)
			_ = a.kill9()
			a.client.Close()
		}
		if err := nw.teardown(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "gpuherd-chaos: cleanup:", err)
		}
		if failed || o.keep {
			fmt.Printf("work directory kept: %s (agent logs in */agent.log)\n", dir)
		} else {
			os.RemoveAll(dir)
		}
	}()

	// A crashed earlier run may have left namespaces (and agents in them).
	if names, err := nw.ours(ctx); err == nil && len(names) > 0 {
		logf("removing %d namespaces left by an earlier run: %v", len(names), names)
	}
	if err := nw.teardown(ctx); err != nil {
		logf("setup: %v", err)
		return 2
	}
	if err := nw.setup(ctx); err != nil {
		logf("setup: %v", err)
		return 2
	}
	pki, key, err := secrets(ctx, bin, dir, o.agents)
	if err != nil {
		logf("setup: %v", err)
		return 2
	}
	for i := 1; i <= o.agents; i++ {
		a := newAgent(dir, bin, i, o.agents, pki, key, o.lease, o.settle)
		a.ns = nw.nodeNS(i)
		agents = append(agents, a)
	}
	for _, a := range agents {
		if err := a.start(); err != nil {
			logf("setup: %v", err)
			return 2
		}
	}
	for _, a := range agents {
		if err := a.waitReady(ctx, 30*time.Second); err != nil {
			logf("setup: %v", err)
			return 2
		}
	}
	if err := waitMembers(ctx, agents, 30*time.Second); err != nil {
		logf("setup: %v", err)
		return 2
	}
	names := make([]string, len(agents))
	for i, a := range agents {
		names[i] = fmt.Sprintf("%s=%s@%s", a.name, a.profile, a.ip)
	}
	logf("cluster up: %v", names)

	// The run: claimers, fault lanes and the monitor, for the duration.
	w := &workload{h: h, agents: agents, models: modelsOf(ctx, agents), cliShare: o.cliShare, stop: make(chan struct{}), logf: logf, maxHeld: 3}
	f := newFaulter(nw, agents, o.lease, h, logf)
	m := &monitor{agents: agents, lease: o.lease, h: h}
	mctx, stopMonitor := context.WithCancel(ctx)
	var mwg sync.WaitGroup
	mwg.Add(1)
	go func() { defer mwg.Done(); m.run(mctx) }()
	var cwg, fwg sync.WaitGroup
	for k := 1; k <= o.claimers; k++ {
		cwg.Add(1)
		go w.claimer(k, rand.New(rand.NewPCG(o.seed, uint64(k))), &cwg)
	}
	for k := 1; k <= o.groups; k++ {
		cwg.Add(1)
		go w.groupClient(rand.New(rand.NewPCG(o.seed, uint64(500+k))), &cwg)
	}
	deadline := time.Now().Add(o.duration)
	for l := 1; l <= o.lanes; l++ {
		fwg.Add(1)
		go func() {
			defer fwg.Done()
			f.lane(ctx, rand.New(rand.NewPCG(o.seed, uint64(1000+l))), deadline)
		}()
	}
	owners := &ownerScenarios{w: w, f: f, lease: o.lease}
	for l := 1; l <= o.owners; l++ {
		fwg.Add(1)
		go func() {
			defer fwg.Done()
			owners.lane(ctx, l, rand.New(rand.NewPCG(o.seed, uint64(2000+l))), deadline)
		}()
	}
	sleep(ctx, time.Until(deadline))
	logf("stopping the claimers (in-flight calls finish or time out)")
	close(w.stop)
	cwg.Wait()
	fwg.Wait()
	stopMonitor()
	mwg.Wait()
	runEnd := time.Now()
	if ctx.Err() != nil {
		logf("interrupted")
		return 1
	}

	// Heal, restart everything (kill -9 once more: a committed claim must
	// survive that too), wait for the cluster and for every lease.
	logf("healing every fault, then kill -9 and restart of every agent")
	if err := nw.healAll(ctx); err != nil {
		f.harnessErr(err)
	}
	for _, a := range agents {
		a.signal(syscall.SIGCONT)
	}
	// Before the restart forgets them: no GPU the running process fenced
	// may be offered as free.
	for _, a := range agents {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := a.client.Status(cctx)
		cancel()
		log, lerr := readLog(a)
		if err == nil && lerr == nil {
			checkFencedNotFree(h, a.name, sinceLastStart(log), st)
		}
	}
	for _, a := range agents {
		if err := a.crashed(); err != nil {
			h.violate("agent-crashed", "%v%s", err, a.tail(20))
		}
		if err := a.kill9(); err != nil {
			f.harnessErr(err)
		}
	}
	if o.sabotage == "wipe-ledger" {
		// The file and its journal, as a lost disk: with the journal
		// left, the agent would refuse to start rather than lose them.
		logf("SABOTAGE: deleting %s's ledger and its journal; the checks must report its claims lost", agents[0].name)
		path := filepath.Join(agents[0].dataDir, "ledger.db")
		for _, p := range []string{path, ledger.JournalPath(path)} {
			if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
				f.harnessErr(err)
			}
		}
	}
	for _, a := range agents {
		if err := a.start(); err != nil {
			f.harnessErr(err)
		}
	}
	for _, a := range agents {
		if err := a.waitReady(ctx, 30*time.Second); err != nil {
			h.violate("restart-failed", "final restart: %v", err)
		}
	}
	if err := waitMembers(ctx, agents, 30*time.Second); err != nil {
		h.violate("no-reconvergence", "after healing: %v", err)
	}
	wait := o.lease + o.lease/4 + time.Second
	logf("cluster whole again; waiting %s so that every lease has run out", wait)
	sleep(ctx, wait)
	fs, err := collect(ctx, agents, h)
	if err != nil {
		f.harnessErr(fmt.Errorf("reading the final state: %w", err))
	}
	var nClaims, nGPUs int
	if fs != nil {
		nClaims, nGPUs = finalCheck(fs, h, runEnd)
	}
	prng := rand.New(rand.NewPCG(o.seed, 9999))
	logf("healed: IDs that never existed and every held claim, through every agent")
	probeHealed(w, prng, "healed")
	if o.agents >= 3 {
		deadMember(ctx, w, prng, logf)
	}
	for _, a := range agents {
		log, err := readLog(a)
		if err != nil {
			f.harnessErr(err)
			continue
		}
		checkFenceCancelled(h, a.name, log)
	}

	// The report.
	h.mu.Lock()
	defer h.mu.Unlock()
	fmt.Printf("\n== gpuherd-chaos seed=%d agents=%d duration=%s: counts\n", o.seed, o.agents, o.duration)
	total := 0
	var ops []string
	for op := range h.ops {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	var lines []string
	for _, op := range ops {
		n := 0
		line := ""
		for _, oc := range []outcome{outOK, outNotAvailable, outNotFound, outConflict, outRefused, outAmbiguous} {
			if c := h.ops[op][oc]; c > 0 {
				line += fmt.Sprintf(" %s=%d", oc, c)
				n += c
			}
		}
		total += n
		lines = append(lines, fmt.Sprintf("  %-12s %5d:%s", op, n, line))
	}
	fmt.Printf("operations: %d (%d claimers, %.0f%% through the CLI)\n", total, o.claimers, 100*o.cliShare)
	for _, l := range lines {
		fmt.Println(l)
	}
	fmt.Print(f.summary())
	fmt.Println(clockNote)
	fmt.Printf("checks: %d monitor snapshots during the run; final state: %d claims, %d claimed GPUs, %d claim IDs in the history\n",
		m.snapshots, nClaims, nGPUs, len(h.recs))
	var notes []string
	for k := range h.notes {
		notes = append(notes, k)
	}
	sort.Strings(notes)
	fmt.Println("expected effects of faults (not violations):")
	if len(notes) == 0 {
		fmt.Println("  none")
	}
	for _, k := range notes {
		fmt.Printf("  %-80s %d\n", k, h.notes[k])
	}
	nv := 0
	for _, c := range h.violations {
		nv += c
	}
	fmt.Printf("violations: %d\n", nv)
	var kinds []string
	for k := range h.violations {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Printf("  %-36s %d\n", k, h.violations[k])
	}
	for _, d := range h.details {
		fmt.Println("  " + d)
	}
	if len(f.harness) > 0 {
		fmt.Printf("harness errors: %d\n", len(f.harness))
		for _, e := range f.harness {
			fmt.Println("  " + e)
		}
	}
	if nv > 0 || len(f.harness) > 0 {
		fmt.Printf("FAIL seed=%d (rerun: %s)\n", o.seed, strings.Join(os.Args, " "))
		return 1
	}
	failed = false
	fmt.Printf("PASS seed=%d\n", o.seed)
	return 0
}

// secrets makes the CA, one certificate per agent (naming its address) and
// the gossip key, with the gpuherd commands an operator runs.
func secrets(ctx context.Context, bin, dir string, n int) (pki, key string, err error) {
	pki = filepath.Join(dir, "pki")
	key = filepath.Join(dir, "gossip.key")
	if _, err := sh(ctx, bin, "tls", "ca", "--dir", pki); err != nil {
		return "", "", err
	}
	for i := 1; i <= n; i++ {
		if _, err := sh(ctx, bin, "tls", "cert", fmt.Sprintf("n%d", i), "--ca-dir", pki, "--out", pki, "--host", nodeIP(i)); err != nil {
			return "", "", err
		}
	}
	out, err := exec.CommandContext(ctx, bin, "gossip", "keygen").Output()
	if err != nil {
		return "", "", fmt.Errorf("gpuherd gossip keygen: %w", err)
	}
	return pki, key, os.WriteFile(key, out, 0o600)
}

// waitMembers waits until every agent sees every agent alive.
func waitMembers(ctx context.Context, agents []*agent, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok := true
		for _, a := range agents {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			ms, err := a.client.Members(cctx)
			cancel()
			if err != nil {
				ok, last = false, fmt.Sprintf("%s: %v", a.name, err)
				break
			}
			alive := 0
			for _, m := range ms {
				if m.State == "alive" {
					alive++
				}
			}
			if alive != len(agents) {
				ok, last = false, fmt.Sprintf("%s sees %d of %d alive", a.name, alive, len(agents))
				break
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agents did not form one cluster within %s (%s)", timeout, last)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// modelsOf sums the cluster's GPUs per model from the agents' status, so
// that requests follow what the platform has.
func modelsOf(ctx context.Context, agents []*agent) []modelSpec {
	total := map[string]int{}
	most := map[string]int{}
	for _, a := range agents {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := a.client.Status(cctx)
		cancel()
		if err != nil {
			continue
		}
		here := map[string]int{}
		for _, g := range st.GPUs {
			if g.State != api.StateUnhealthy {
				here[g.Model]++
			}
		}
		for m, c := range here {
			total[m] += c
			most[m] = max(most[m], c)
		}
	}
	var out []modelSpec
	for m, c := range total {
		out = append(out, modelSpec{name: m, weight: c, maxOne: most[m]})
	}
	sort.Slice(out, func(x, y int) bool { return out[x].name < out[y].name })
	if len(out) == 0 {
		out = []modelSpec{{name: "H100 80GB", weight: 1, maxOne: 1}}
	}
	return out
}
