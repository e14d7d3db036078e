package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
)

// One agent per process, as on a platform, where each server runs its
// own agent with its own Go runtime. The in-process cluster runs every
// agent in this one process: one scheduler with GOMAXPROCS of the
// machine's cores for all of them, where a goroutine that waits in an
// fdatasync or behind another agent's work delays every other agent's.
// Here each agent is a copy of this program (runChild) with its own
// runtime, reached as a client reaches it, over its API socket.

// procAgent is one agent in a process of its own.
type procAgent struct {
	name   string
	cmd    *exec.Cmd
	cli    *api.Client
	exited chan struct{} // closed once the process has ended
}

// stop asks the agent to stop, and kills it after 10 s.
func (p *procAgent) stop() {
	p.cli.Close()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// procsResult is what the per-process cluster measured.
type procsResult struct {
	n       int
	started time.Duration // start of every process until all see each other and the registry's leader
	seq     durations     // unloaded claims, through a random agent's API
	tput    float64
	tputLat durations
	tputCPU time.Duration // every agent process's CPU and this one's (the clients) during the test
	tputErr int
	idleCPU time.Duration // every agent process's CPU over idleWin, before the tests
	idleWin time.Duration
	err     error
}

// spawnAgent starts the agent cfg in a copy of this program; its output
// goes to logPath, or its stderr to this program's when there is none.
func spawnAgent(cfg agent.Config, logPath string) (*exec.Cmd, error) {
	spec, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if logPath != "" {
		f, err := os.Create(logPath)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		cmd.Stdout, cmd.Stderr = f, f
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// startProc starts agent i, joined to seed, and waits for its API to
// answer. An agent that ends first (a port taken meanwhile by another
// process, between freePort and its bind) is started again on others.
func startProc(c *cluster, i int, seed string) (*procAgent, string, error) {
	name := fmt.Sprintf("proc%03d", i)
	files, err := c.issue(name)
	if err != nil {
		return nil, "", err
	}
	var last error
	for range 5 {
		gport, err := freePort()
		if err != nil {
			return nil, "", err
		}
		pport, err := freePort()
		if err != nil {
			return nil, "", err
		}
		cfg := c.config(name, profiles[i%len(profiles)], files, gport, pport, seed)
		_ = os.RemoveAll(cfg.DataDir)
		cmd, err := spawnAgent(cfg, filepath.Join(c.dir, name+".log"))
		if err != nil {
			return nil, "", err
		}
		p := &procAgent{name: name, cmd: cmd, cli: api.NewClient(cfg.Socket), exited: make(chan struct{})}
		go func() { _ = cmd.Wait(); close(p.exited) }()
		deadline := time.Now().Add(30 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := p.cli.Status(ctx)
			cancel()
			if err == nil {
				return p, cfg.GossipAddr, nil
			}
			select {
			case <-p.exited:
				last = fmt.Errorf("%s ended at start (its log: %s.log)", name, name)
			case <-time.After(50 * time.Millisecond):
				if time.Now().Before(deadline) {
					continue
				}
				p.stop()
				last = fmt.Errorf("%s did not answer on its socket within 30s", name)
			}
			break
		}
	}
	return nil, "", last
}

// startProcs starts n agents, one per process, joined to the first.
func startProcs(c *cluster, n int) ([]*procAgent, error) {
	out := make([]*procAgent, n)
	first, seed, err := startProc(c, 0, "")
	if err != nil {
		return nil, err
	}
	out[0] = first
	errs := startRest(n, func(i int) error {
		p, _, err := startProc(c, i, seed)
		out[i] = p // each goroutine writes its own element
		return err
	})
	if len(errs) > 0 {
		stopProcs(out)
		return nil, errs[0]
	}
	return out, nil
}

func stopProcs(ps []*procAgent) {
	var wg sync.WaitGroup
	for _, p := range ps {
		if p != nil {
			wg.Add(1)
			go func() { defer wg.Done(); p.stop() }()
		}
	}
	wg.Wait()
}

// waitProcs waits until every agent sees want members alive with their
// GPUs and, once there is more than one, knows the name registry's
// leader with its voters (at most three) in place.
func waitProcs(ps []*procAgent, want int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	voters := min(3, want)
	for {
		ready := true
		why := ""
		for _, p := range ps {
			select {
			case <-p.exited:
				return fmt.Errorf("agent process %s ended (its log: %s.log)", p.name, p.name)
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			ms, err := p.cli.Members(ctx)
			var st api.Status
			if err == nil {
				st, err = p.cli.Status(ctx)
			}
			cancel()
			alive := 0
			for _, m := range ms {
				if m.State == "alive" && len(m.Models) > 0 {
					alive++
				}
			}
			switch {
			case err != nil:
				why = fmt.Sprintf("%s: %v", p.name, err)
			case alive < want:
				why = fmt.Sprintf("%s sees %d of %d members", p.name, alive, want)
			case want > 1 && (st.Names == nil || st.Names.Leader == ""):
				why = p.name + " knows no registry leader"
			case want > 1 && len(st.Names.Voters) > 0 && len(st.Names.Voters) < voters:
				why = fmt.Sprintf("%s: the registry has %d voters", p.name, len(st.Names.Voters))
			default:
				continue
			}
			ready = false
			break
		}
		if ready {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the %d agent processes were not ready within %v: %s", len(ps), limit, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// procAlloc places claims through a random agent's API, as a client
// would, and releases through the owner's.
type procAlloc struct {
	ps map[string]*procAgent
	by []*procAgent
}

func (procAlloc) name() string { return procsLabel }

func (x procAlloc) claim(ctx context.Context, rnd *rand.Rand, id, model string, count int) (string, error) {
	p := x.by[rnd.IntN(len(x.by))]
	return placedOn(p.cli.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: model, Count: count}}}))
}

func (x procAlloc) release(ctx context.Context, id, server string) error {
	p, ok := x.ps[server]
	if !ok {
		return fmt.Errorf("release %s: no agent process %q", id, server)
	}
	_, err := p.cli.Release(ctx, id)
	return err
}

// retries is not seen from outside the agents' processes.
func (procAlloc) retries() int64 { return 0 }

// procsCPU is the CPU time of every agent process and of this one.
func procsCPU(ps []*procAgent) time.Duration {
	t := cpuTime()
	for _, p := range ps {
		t += procCPU(p.cmd.Process.Pid)
	}
	return t
}

// runProcs measures n agents in processes of their own: unloaded claims,
// then the throughput test, with the in-process cluster's models.
func runProcs(o options, c *cluster, n int, models []string) procsResult {
	r := procsResult{n: n}
	progress("one process per agent: starting %d", n)
	t0 := time.Now()
	ps, err := startProcs(c, n)
	if err != nil {
		r.err = err
		return r
	}
	defer stopProcs(ps)
	if err := waitProcs(ps, n, 120*time.Second); err != nil {
		r.err = err
		return r
	}
	r.started = time.Since(t0)
	progress("  %d agent processes see each other and the registry's leader after %v", n, r.started.Round(time.Millisecond))
	al := procAlloc{ps: map[string]*procAgent{}, by: ps}
	for _, p := range ps {
		al.ps[p.name] = p
	}
	ctx := context.Background()
	idle := max(o.idle, 3*time.Second)
	cpu0, w0 := procsCPU(ps), time.Now()
	time.Sleep(idle)
	r.idleCPU, r.idleWin = procsCPU(ps)-cpu0, time.Since(w0)
	progress("  idle for %v: %.1f%% of one core, all processes", idle, 100*r.idleCPU.Seconds()/r.idleWin.Seconds())
	// Warm the connections between the agents (and the API sockets'),
	// as the in-process phases do before they measure.
	if _, _, _, err := closedLoop(ctx, al, models, o.workers, 2*time.Second, o.seed+1, "pw"); err != nil {
		progress("  warm-up: %v", err)
	}
	rnd := rand.New(rand.NewPCG(o.seed, uint64(n)+1000))
	progress("  unloaded latency: %d claims through the agents' APIs", o.seq)
	for i := range o.seq {
		id := fmt.Sprintf("pseq-%d", i)
		t := time.Now()
		srv, err := al.claim(ctx, rnd, id, models[i%len(models)], 1)
		if err != nil {
			r.err = fmt.Errorf("sequential claim: %w", err)
			return r
		}
		r.seq = append(r.seq, time.Since(t))
		if err := al.release(ctx, id, srv); err != nil {
			r.err = fmt.Errorf("sequential release: %w", err)
			return r
		}
	}
	progress("  throughput: %d clients for %v", o.workers, o.tput)
	cpu0 = procsCPU(ps)
	var tpErr error
	r.tputLat, r.tput, r.tputErr, tpErr = closedLoop(ctx, al, models, o.workers, o.tput, o.seed, "ptp")
	r.tputCPU = procsCPU(ps) - cpu0
	if tpErr != nil {
		progress("  %d errors, first: %v", r.tputErr, tpErr)
	}
	return r
}
