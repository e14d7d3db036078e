package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
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

// mockResult is one cluster on memberlist's in-memory transport.
type mockResult struct {
	n        int
	join     time.Duration // until every member lists every other alive; -1: not within the limit
	minAlive int           // fewest alive members any member listed when the join wait ended
	changes  []spread
	metaSize int
}

// convergeMock runs n gossip.Cluster members (the gossip package as the
// agents use it: its codec, its view, its publisher) in memory, with LAN timings, and measures how long a summary change of
// one member takes to reach the others (seen through Subscribe + Members).
// The transport is gossiptest.Network (see there why not memberlist's
// MockTransport).
func convergeMock(n, trials int, limit time.Duration) (mockResult, error) {
	res := mockResult{n: n}
	netw := &gossiptest.Network{}
	trs := make([]*gossiptest.Transport, n)
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("m%04d", i)
		trs[i] = netw.NewTransport()
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
	var seed string
	for i := range n {
		frees[i].Store(8)
		tr := trs[i]
		cfg := gossip.Config{NodeName: names[i], Insecure: true, Log: mockLog, Tune: func(mc *memberlist.Config) { mc.Transport = tr }}
		if i > 0 {
			cfg.Join = []string{seed}
		}
		c, err := gossip.New(cfg, summary(i))
		if err != nil {
			return res, err
		}
		cs[i] = c
		if i == 0 {
			seed = c.LocalAddr()
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, c := range cs[1:] {
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
	for {
		ok := true
		res.minAlive = n
		for _, c := range cs {
			alive := 0
			for _, m := range c.Members() {
				if m.State == gossip.StateAlive {
					alive++
				}
			}
			res.minAlive = min(res.minAlive, alive)
			if alive < n {
				ok = false
			}
		}
		if ok {
			res.join = time.Since(start)
			break
		}
		if time.Since(start) > 3*limit {
			// Measure anyway: a member that does not know the owner yet
			// counts as never having seen the change.
			res.join = -1
			break
		}
		time.Sleep(time.Second)
	}
	time.Sleep(time.Second) // let the join's broadcasts drain

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
					ms := c.Members()
					j, ok := slices.BinarySearchFunc(ms, owner, func(m gossip.Member, s string) int { return cmpStr(m.Name, s) })
					if ok && len(ms[j].Summary.Models) > 0 && int(ms[j].Summary.Models[0].Free) == want {
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
	return res, nil
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
