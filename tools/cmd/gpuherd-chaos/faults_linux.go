package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"
)

// Fault kinds.
const (
	faultClock   = "clock step (wall clock ± 1-3 leases)"
	faultKill    = "kill-9+restart"
	faultPause   = "pause (SIGSTOP<lease)"
	faultFreeze  = "freeze past lease (SIGSTOP>lease)"
	faultIsolate = "isolate (hub link down)"
	faultSplit   = "split partition (nft drop)"
	faultLoss    = "packet loss (nft numgen)"
)

var faultKinds = []string{faultKill, faultPause, faultFreeze, faultIsolate, faultSplit, faultLoss, faultClock}

// clockNote is printed with the counts: how clock steps are played.
const clockNote = `clock steps: the machine's clock is never touched (Go reads it through the vDSO,
  so libfaketime cannot reach gpuherd, and a real step would step every process).
  Each agent reads its wall clock through --clock-offset-file; a clock-step fault
  writes an offset of one to three leases, forward or back, into one agent's file,
  and in half of them restarts the agent while its clock is off, then sets it back.`

// faulter injects faults from several lanes at once. Faults of one class
// (process, link, loss) never overlap on one node, so that each heals what
// it broke; faults of different classes do compose (a paused agent behind a
// lossy link, a kill during a partition).
type faulter struct {
	nw     *network
	agents []*agent
	lease  time.Duration
	h      *history
	logf   func(format string, args ...any)

	mu          sync.Mutex
	busy        map[string]map[int]bool // class → node → in use
	splitActive bool
	counts      map[string]int
	harness     []string // failures of the harness itself (an ip or nft command)
}

func newFaulter(nw *network, agents []*agent, lease time.Duration, h *history, logf func(string, ...any)) *faulter {
	return &faulter{nw: nw, agents: agents, lease: lease, h: h, logf: logf,
		busy: map[string]map[int]bool{"proc": {}, "link": {}, "loss": {}}, counts: map[string]int{}}
}

// take reserves up to n random free nodes of a class; nil when none is free.
func (f *faulter) take(rng *rand.Rand, class string, n int) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var free []int
	for i := 1; i <= len(f.agents); i++ {
		if !f.busy[class][i] {
			free = append(free, i)
		}
	}
	rng.Shuffle(len(free), func(x, y int) { free[x], free[y] = free[y], free[x] })
	if len(free) > n {
		free = free[:n]
	}
	for _, i := range free {
		f.busy[class][i] = true
	}
	sort.Ints(free)
	return free
}

// takeOne reserves node i for a fault of class; false when it is in use.
func (f *faulter) takeOne(class string, i int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.busy[class][i] {
		return false
	}
	f.busy[class][i] = true
	return true
}

// takeSplit reserves the one partition that may be on at a time.
func (f *faulter) takeSplit() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.splitActive {
		return false
	}
	f.splitActive = true
	return true
}

func (f *faulter) giveSplit() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.splitActive = false
}

func (f *faulter) give(class string, nodes []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, i := range nodes {
		delete(f.busy[class], i)
	}
}

func (f *faulter) harnessErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.harness = append(f.harness, err.Error())
	f.logf("HARNESS ERROR: %v", err)
}

func (f *faulter) counted(kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts[kind]++
}

// between is a random duration in [lo, hi).
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// lane injects one fault after another until the deadline. Every fault is
// healed before the lane returns, also when ctx is cancelled.
func (f *faulter) lane(ctx context.Context, rng *rand.Rand, deadline time.Time) {
	for ctx.Err() == nil && time.Until(deadline) > time.Second {
		sleep(ctx, between(rng, 300*time.Millisecond, 2*time.Second))
		if ctx.Err() != nil || time.Until(deadline) < time.Second {
			return
		}
		// Holds end by the deadline, so that the run is bounded.
		hold := func(lo, hi time.Duration) time.Duration {
			return min(between(rng, lo, hi), max(time.Until(deadline), 100*time.Millisecond))
		}
		kind := faultKinds[rng.IntN(len(faultKinds))]
		switch kind {
		case faultKill:
			nodes := f.take(rng, "proc", 1)
			if len(nodes) == 0 {
				continue
			}
			a := f.agents[nodes[0]-1]
			down := between(rng, 200*time.Millisecond, 3*time.Second)
			f.logf("fault %s %s, down %s", kind, a.name, down.Round(time.Millisecond))
			f.counted(kind)
			if err := a.kill9(); err != nil {
				f.harnessErr(err)
			}
			sleep(ctx, down)
			f.restart(ctx, a)
			f.give("proc", nodes)
		case faultPause, faultFreeze:
			nodes := f.take(rng, "proc", 1)
			if len(nodes) == 0 {
				continue
			}
			a := f.agents[nodes[0]-1]
			d := hold(500*time.Millisecond, f.lease-500*time.Millisecond)
			if kind == faultFreeze {
				d = between(rng, f.lease+500*time.Millisecond, f.lease+3*time.Second)
			}
			f.logf("fault %s %s for %s", kind, a.name, d.Round(time.Millisecond))
			f.counted(kind)
			a.signal(syscall.SIGSTOP)
			sleep(ctx, d)
			a.signal(syscall.SIGCONT)
			f.logf("heal  %s %s: SIGCONT", kind, a.name)
			f.give("proc", nodes)
		case faultClock:
			nodes := f.take(rng, "proc", 1)
			if len(nodes) == 0 {
				continue
			}
			a := f.agents[nodes[0]-1]
			step := between(rng, f.lease, 3*f.lease).Round(time.Millisecond)
			if rng.IntN(2) == 0 {
				step = -step
			}
			restart := rng.IntN(2) == 0
			d := hold(2*time.Second, 6*time.Second)
			f.logf("fault %s %s: %+v for %s (restart while stepped: %v)", kind, a.name, step, d.Round(time.Millisecond), restart)
			f.counted(kind)
			if err := a.setClock(step); err != nil {
				f.harnessErr(err)
			}
			if restart {
				if err := a.kill9(); err != nil {
					f.harnessErr(err)
				}
				f.restart(ctx, a)
			}
			sleep(ctx, d)
			if err := a.setClock(0); err != nil {
				f.harnessErr(err)
			}
			if restart {
				if err := a.kill9(); err != nil {
					f.harnessErr(err)
				}
				f.restart(ctx, a)
			}
			f.logf("heal  %s %s", kind, a.name)
			f.give("proc", nodes)
		case faultIsolate:
			nodes := f.take(rng, "link", 1)
			if len(nodes) == 0 {
				continue
			}
			d := hold(2*time.Second, 8*time.Second)
			f.logf("fault %s n%d for %s", kind, nodes[0], d.Round(time.Millisecond))
			f.counted(kind)
			if err := f.nw.setLink(context.Background(), nodes[0], false); err != nil {
				f.harnessErr(err)
			}
			sleep(ctx, d)
			if err := f.nw.setLink(context.Background(), nodes[0], true); err != nil {
				f.harnessErr(err)
			}
			f.logf("heal  %s n%d", kind, nodes[0])
			f.give("link", nodes)
		case faultSplit:
			if !f.takeSplit() {
				continue
			}
			perm := rng.Perm(len(f.agents))
			k := 1 + rng.IntN(len(f.agents)/2)
			var a, b []int
			for x, p := range perm {
				if x < k {
					a = append(a, p+1)
				} else {
					b = append(b, p+1)
				}
			}
			sort.Ints(a)
			sort.Ints(b)
			d := hold(3*time.Second, 10*time.Second)
			f.logf("fault %s %v | %v for %s", kind, a, b, d.Round(time.Millisecond))
			f.counted(kind)
			table, err := f.nw.partition(context.Background(), a, b)
			if err != nil {
				f.harnessErr(err)
			}
			sleep(ctx, d)
			if err == nil {
				if err := f.nw.delTable(context.Background(), table); err != nil {
					f.harnessErr(err)
				}
			}
			f.logf("heal  %s %v | %v", kind, a, b)
			f.giveSplit()
		case faultLoss:
			nodes := f.take(rng, "loss", 1+rng.IntN(2))
			if len(nodes) == 0 {
				continue
			}
			pct := 10 + rng.IntN(41)
			d := hold(3*time.Second, 10*time.Second)
			f.logf("fault %s %d%% on %v for %s", kind, pct, nodes, d.Round(time.Millisecond))
			f.counted(kind)
			table, err := f.nw.loss(context.Background(), nodes, pct)
			if err != nil {
				f.harnessErr(err)
			}
			sleep(ctx, d)
			if err == nil {
				if err := f.nw.delTable(context.Background(), table); err != nil {
					f.harnessErr(err)
				}
			}
			f.logf("heal  %s on %v", kind, nodes)
			f.give("loss", nodes)
		}
	}
}

// restart starts a's agent again on the same data dir and addresses and
// waits for its socket. An agent that does not come back is a violation: a
// server must survive kill -9.
func (f *faulter) restart(ctx context.Context, a *agent) {
	if err := a.start(); err != nil {
		f.harnessErr(err)
		return
	}
	begin := time.Now()
	if err := a.waitReady(context.WithoutCancel(ctx), 30*time.Second); err != nil {
		f.h.violate("restart-failed", "%s after kill -9: %v", a.name, err)
		return
	}
	f.logf("heal  %s %s: restarted, answering after %s", faultKill, a.name, time.Since(begin).Round(time.Millisecond))
}

func (f *faulter) summary() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	total := 0
	s := ""
	for _, k := range append(slices.Clone(faultKinds), ownerFaultKinds...) {
		s += fmt.Sprintf("  %-40s %d\n", k, f.counts[k])
		total += f.counts[k]
	}
	return fmt.Sprintf("faults: %d\n%s", total, s)
}
