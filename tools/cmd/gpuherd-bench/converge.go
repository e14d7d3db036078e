package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/gossip"
	"github.com/gpuherd/gpuherd/gossip/gossiptest"
)

// spread is how long a change took to reach 50%, 99% and 100% of the others.
type spread struct {
	n             int
	p50, p99, all time.Duration
	missed        int // agents that never saw it within the limit
}

func spreadOf(n int, seen []time.Duration, missed int) spread {
	slices.Sort(seen)
	at := func(q float64) time.Duration {
		k := int(q*float64(len(seen)+missed)+0.999999) - 1
		if k >= len(seen) || len(seen) == 0 {
			return -1
		}
		return seen[max(k, 0)]
	}
	return spread{n: n, p50: at(0.5), p99: at(0.99), all: at(1), missed: missed}
}

// mergeSpreads is the median over trials of each figure.
func mergeSpreads(ss []spread) spread {
	if len(ss) == 0 {
		return spread{}
	}
	med := func(f func(spread) time.Duration) time.Duration {
		v := make([]time.Duration, len(ss))
		for i, s := range ss {
			v[i] = f(s)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	out := spread{n: ss[0].n, p50: med(func(s spread) time.Duration { return s.p50 }),
		p99: med(func(s spread) time.Duration { return s.p99 }), all: med(func(s spread) time.Duration { return s.all })}
	for _, s := range ss {
		out.missed += s.missed
	}
	return out
}

// convergeReal measures, on the running agents, how long a capacity change
// of one owner (a claim of one GPU, reserved and committed on it) takes to
// show in the gossip view of every other agent (Agent.Members, polled).
func convergeReal(c *cluster, trials int, limit time.Duration) ([]spread, error) {
	ctx := context.Background()
	var out []spread
	for trial := range trials {
		owner := c.nodes[(trial*7+3)%len(c.nodes)]
		self := view(owner)
		var model string
		before := -1
		for _, s := range self {
			if s.Name == owner.name {
				for m, f := range s.Free {
					if f > 0 && (model == "" || m < model) {
						model, before = m, f
					}
				}
			}
		}
		if model == "" {
			return out, fmt.Errorf("%s has nothing free", owner.name)
		}
		id := fmt.Sprintf("conv-%d", trial)
		for step, want := range []int{before - 1, before} {
			t0 := time.Now()
			if step == 0 {
				req := api.ClaimRequest{GPUs: []api.Item{{Model: model, Count: 1}}, PreferNode: owner.name, SameNode: true}
				if _, err := owner.a.Claim(ctx, id, req); err != nil {
					return out, err
				}
			} else if _, err := owner.a.Release(ctx, id); err != nil {
				return out, err
			}
			pending := map[string]*node{}
			for _, nd := range c.nodes {
				if nd != owner {
					pending[nd.name] = nd
				}
			}
			var seen []time.Duration
			for len(pending) > 0 && time.Since(t0) < limit {
				for name, nd := range pending {
					ms, _ := nd.a.Members(ctx)
					i, ok := slices.BinarySearchFunc(ms, owner.name, func(m api.Member, n string) int { return cmpStr(m.Name, n) })
					if !ok {
						continue
					}
					for _, x := range ms[i].Models {
						if x.Model == model && x.Free == want {
							seen = append(seen, time.Since(t0))
							delete(pending, name)
						}
					}
				}
				time.Sleep(2 * time.Millisecond)
			}
			out = append(out, spreadOf(len(c.nodes), seen, len(pending)))
		}
	}
	return out, nil
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// mockResult is one cluster on the in-memory transport.
type mockResult struct {
	n        int
	join     time.Duration // until every member lists every other alive; -1: not within the limit
	minAlive int           // fewest alive members any member listed when the join wait ended
	changes  []spread
	metaSize int

	waves int // join waves
	// formedUpTo is how many had joined when the bench gave up forming
	// the cluster (join is then -1 and nothing else was measured).
	formedUpTo int
	joinCPU    time.Duration // process CPU while the cluster formed
	idle       traffic       // sent by all members over the idle window
	idleWin    time.Duration
	idleCPU    time.Duration // process CPU over the idle window
	change     traffic       // sent by all members from the first change until its last rebroadcast
	changeN    int           // changes in that window (each a new summary of one member)
	changeW    time.Duration
	heap       uint64 // live heap after a GC, the whole process, with the cluster formed
	rss        int64  // process RSS then
}

// joinWave is how many members join at a time: each wave joins, through
// members already in, and the bench waits until its members are seen
// everywhere before the next one starts (see convergeMock).
const joinWave = 50

// convergeMock runs n gossip.Cluster members (the gossip package as the
// agents use it: its codec, its view, its publisher) in memory, with LAN
// timings, and measures how long a summary change of one member takes to
// reach the others (seen through Subscribe + Members), what the members
// send each other idle and per change, and their memory.
// The transport is gossiptest.Network (see there why not memberlist's
// MockTransport), metered.
//
// Members join in waves of joinWave, each member through a random member
// already in, and each wave waits until its members are listed alive by a
// sample of the others and the receive queues have drained. All n joining
// at once (the bench did so before) does not form above a few hundred
// members on two cores: every join is an epidemic broadcast that every
// member re-gossips, and each member that learns a burst of joins runs a
// catch-up push/pull of the whole state; the work for 1,000 members
// outruns two cores, the receive queues grow (to gigabytes), acks come
// later than the 500 ms probe timeout, and members suspect each other,
// which adds refutations to the queues. A platform of 1,000 servers does
// the same work on 1,000 machines. Timings stay memberlist's LAN ones.
func convergeMock(n, trials int, limit, idle time.Duration) (mockResult, error) {
	res := mockResult{n: n}
	netw := &gossiptest.Network{}
	meter := &netMeter{}
	trs := make([]*meteredTransport, n)
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("m%04d", i)
		trs[i] = &meteredTransport{Transport: netw.NewTransport(), m: meter}
	}
	backlog := func() int {
		q := 0
		for _, t := range trs {
			q += len(t.PacketCh())
		}
		return q
	}
	frees := make([]atomic.Int32, n)
	summary := func(i int) func() gossip.Summary {
		return func() gossip.Summary {
			return benchSummary(int(frees[i].Load()))
		}
	}
	if b, err := benchSummary(8).Encode(); err == nil {
		res.metaSize = len(b)
	}
	cs := make([]*gossip.Cluster, n)
	defer func() {
		var wg sync.WaitGroup
		for _, c := range cs {
			if c != nil {
				wg.Add(1)
				go func() { defer wg.Done(); _ = c.Shutdown() }()
			}
		}
		wg.Wait()
	}()
	rnd := rand.New(rand.NewPCG(uint64(n), 24))
	aliveIn := func(c *gossip.Cluster) int {
		alive := 0
		for _, m := range c.Members() {
			if m.State == gossip.StateAlive {
				alive++
			}
		}
		return alive
	}
	start, cpu0 := time.Now(), cpuTime()
	queued, stalled := 0, 0
	for lo := 0; lo < n; lo += joinWave {
		if stalled >= 2 {
			// Two waves in a row waited out their limit while the queues
			// grew: the members no longer keep up with each other here.
			res.join, res.formedUpTo = -1, lo
			res.joinCPU = cpuTime() - cpu0
			progress("  giving up at %d members: two waves in a row did not drain (receive queues %d packets)", lo, backlog())
			return res, nil
		}
		hi := min(lo+joinWave, n)
		res.waves++
		for i := lo; i < hi; i++ {
			frees[i].Store(8)
			tr := trs[i]
			cfg := gossip.Config{NodeName: names[i], Insecure: true, Log: mockLog, Tune: func(mc *memberlist.Config) { mc.Transport = tr }}
			switch {
			case lo > 0:
				cfg.Join = []string{cs[rnd.IntN(lo)].LocalAddr()}
			case i > 0:
				cfg.Join = []string{cs[0].LocalAddr()}
			}
			c, err := gossip.New(cfg, summary(i))
			if err != nil {
				return res, err
			}
			cs[i] = c
		}
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for _, c := range cs[max(lo, 1):hi] {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				ctx, cancel := context.WithTimeout(context.Background(), limit)
				defer cancel()
				_ = c.Join(ctx)
			}()
		}
		wg.Wait()
		// The wave is in when its members and a sample of the others list
		// everyone so far alive, and the receive queues have drained.
		sample := slices.Clone(cs[lo:hi])
		for range min(20, lo) {
			sample = append(sample, cs[rnd.IntN(lo)])
		}
		w0 := time.Now()
		for calm := 0; calm < 4 && time.Since(w0) < 3*limit; {
			ok := backlog() < hi
			for _, c := range sample {
				if !ok {
					break
				}
				ok = aliveIn(c) >= hi
			}
			if ok {
				calm++
			} else {
				calm = 0
			}
			time.Sleep(250 * time.Millisecond)
		}
		grew := backlog() > queued && backlog() > hi
		queued = backlog()
		if time.Since(w0) >= 3*limit && grew {
			stalled++
		} else {
			stalled = 0
		}
		if n > 2*joinWave {
			progress("  %d members in, after %v (this wave %v), receive queues %d packets, CPU %v",
				hi, time.Since(start).Round(time.Millisecond), time.Since(w0).Round(time.Millisecond), backlog(), (cpuTime() - cpu0).Round(time.Second))
		}
	}
	for last := time.Now(); ; {
		ok := true
		res.minAlive = n
		suspect, dead := 0, 0
		for _, c := range cs {
			alive := 0
			for _, m := range c.Members() {
				switch m.State {
				case gossip.StateAlive:
					alive++
				case gossip.StateSuspect:
					suspect++
				default:
					dead++
				}
			}
			res.minAlive = min(res.minAlive, alive)
			if alive < n {
				ok = false
			}
		}
		if !ok && time.Since(last) > 5*time.Second {
			last = time.Now()
			progress("  not formed yet: fewest alive seen %d; %d suspect and %d dead entries in all views; receive queues %d packets; CPU %v",
				res.minAlive, suspect, dead, backlog(), (cpuTime() - cpu0).Round(time.Second))
		}
		if ok {
			res.join = time.Since(start)
			break
		}
		if time.Since(start) > 3*limit*time.Duration(res.waves) {
			// Measure anyway: a member that does not know the owner yet
			// counts as never having seen the change.
			res.join = -1
			break
		}
		time.Sleep(time.Second)
	}
	res.joinCPU = cpuTime() - cpu0
	// Let the joins' broadcasts and catch-up exchanges drain.
	for t := time.Now(); time.Since(t) < limit && backlog() > n/10; {
		time.Sleep(100 * time.Millisecond)
	}
	// Every member runs one catch-up push/pull at most 5 s after the last
	// membership change (gossip/catchup.go): wait it out, so that the idle
	// window holds only the steady traffic.
	time.Sleep(8 * time.Second)

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.heap, res.rss = ms.HeapInuse, rssBytes(0)
	if idle > 0 {
		t0, c0 := meter.read(), cpuTime()
		time.Sleep(idle)
		res.idle, res.idleCPU = meter.read().since(t0), cpuTime()-c0
		res.idleWin = res.idle.at.Sub(t0.at)
	}

	ch0 := meter.read()
	for trial := range trials {
		k := (trial*37 + 5) % n
		owner := names[k]
		want := 15 - int(frees[k].Load()) // 8 free becomes 7, 7 becomes 8
		var (
			mu     sync.Mutex
			seen   []time.Duration
			ready  sync.WaitGroup
			done   sync.WaitGroup
			stop   = make(chan struct{})
			t0     time.Time
			t0Lock sync.RWMutex
		)
		t0Lock.Lock()
		for i, c := range cs {
			if i == k {
				continue
			}
			ch, cancel := c.Subscribe()
			ready.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				defer cancel()
				ready.Done()
				for {
					select {
					case <-stop:
						return
					case <-ch:
					}
					// One member, not the whole view: a thousand watchers
					// copying a thousand members at every change would be
					// the bench's own load.
					m, ok := c.Member(owner)
					if ok && len(m.Summary.Models) > 0 && int(m.Summary.Models[0].Free) == want {
						t0Lock.RLock()
						d := time.Since(t0)
						t0Lock.RUnlock()
						mu.Lock()
						seen = append(seen, d)
						mu.Unlock()
						return
					}
				}
			}()
		}
		ready.Wait()
		frees[k].Store(int32(want))
		t0 = time.Now()
		t0Lock.Unlock()
		if err := cs[k].Publish(); err != nil {
			close(stop)
			done.Wait()
			return res, err
		}
		deadline := time.Now().Add(limit)
		for time.Now().Before(deadline) {
			mu.Lock()
			got := len(seen)
			mu.Unlock()
			if got == n-1 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		close(stop)
		done.Wait()
		mu.Lock()
		res.changes = append(res.changes, spreadOf(n, slices.Clone(seen), n-1-len(seen)))
		mu.Unlock()
		time.Sleep(300 * time.Millisecond)
	}
	if trials > 0 {
		// The last change's rebroadcasts (gossip.DefaultRebroadcast) belong
		// to it: the window closes after the last one has spread.
		time.Sleep(gossip.DefaultRebroadcast[len(gossip.DefaultRebroadcast)-1] + 2*time.Second)
		res.change, res.changeN = meter.read().since(ch0), trials
		res.changeW = res.change.at.Sub(ch0.at)
	}
	return res, nil
}

// perMember is bytes per second per member over the window.
func perMember(t traffic, n int, win time.Duration) float64 {
	if win <= 0 || n == 0 {
		return 0
	}
	return float64(t.bytes()) / float64(n) / win.Seconds()
}

// changeBytes is what one change cost each member on average, above the
// idle traffic: the window's bytes less the idle rate over the window, per
// change and member.
func (m mockResult) changeBytes() float64 {
	if m.changeN == 0 || m.n == 0 {
		return 0
	}
	idleRate := perMember(m.idle, m.n, m.idleWin)
	extra := float64(m.change.bytes())/float64(m.n) - idleRate*m.changeW.Seconds()
	return extra / float64(m.changeN)
}

var mockLog = func() *slog.Logger {
	if os.Getenv("GPUHERD_BENCH_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}()

// benchSummary is a realistic summary: a heterogeneous server (three
// models), as the "mixed" profile publishes it.
func benchSummary(freeH100 int) gossip.Summary {
	return gossip.Summary{
		AgentVersion: "v0.9.0-12-gdeadbeef0123",
		PeerAddr:     "10.128.14.203:7947",
		Revision:     123456,
		Models: []gossip.ModelCapacity{
			{Model: "NVIDIA H100 80GB", Total: 8, Free: uint16(freeH100), Healthy: 8},
			{Model: "NVIDIA L40S", Total: 2, Free: 2, Healthy: 2},
			{Model: "NVIDIA RTX 6000 Pro", Total: 1, Free: 1, Healthy: 1},
		},
	}
}
