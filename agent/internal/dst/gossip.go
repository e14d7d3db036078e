package dst

import (
	"slices"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/ledger"
)

// gossip is the membership as each server's gossip would show it: a
// server hears another while that one's process runs, is not paused and
// its messages reach it; it forgets one it has not heard for suspectAfter.
// Capacities are as last published, one round old at most.
type gossip struct {
	w *world

	mu    sync.Mutex
	heard [][]time.Time // heard[a][b]: when a last heard b
	caps  []map[string]ledger.ModelTotals
	gens  []int
	shown [][]int // what seen answered at the last round
	subs  map[int]chan struct{}
	next  int
}

// suspectAfter is how long a server goes unheard before the others stop
// placing claims on it (memberlist's suspicion, roughly).
const suspectAfter = 3 * time.Second

// gossipEvery is the round.
const gossipEvery = 500 * time.Millisecond

func newGossip(w *world) *gossip {
	n := len(w.nodes)
	g := &gossip{w: w, heard: make([][]time.Time, n), caps: make([]map[string]ledger.ModelTotals, n), gens: make([]int, n),
		shown: make([][]int, n), subs: map[int]chan struct{}{}}
	for i := range g.heard {
		g.heard[i] = make([]time.Time, n)
	}
	return g
}

// round runs on the driver, between steps.
func (g *gossip) round() {
	now := time.Now()
	w := g.w
	g.mu.Lock()
	defer g.mu.Unlock()
	for b, nd := range w.nodes {
		if !nd.alive || nd.pausedUntil.After(now) {
			continue
		}
		g.caps[b], g.gens[b] = nd.ledger.Totals(now), nd.gen
		for a := range w.nodes {
			if !w.cut[b][a] {
				g.heard[a][b] = now
			}
		}
	}
	changed := false
	for a := range w.nodes {
		s := g.seenLocked(a, now)
		if !slices.Equal(s, g.shown[a]) {
			g.shown[a], changed = s, true
		}
	}
	if changed {
		for _, c := range g.subs {
			select {
			case c <- struct{}{}:
			default:
			}
		}
	}
}

func (g *gossip) seenLocked(a int, now time.Time) []int {
	var out []int
	for b, t := range g.heard[a] {
		if b == a || (!t.IsZero() && now.Sub(t) < suspectAfter) {
			out = append(out, b)
		}
	}
	return out
}

// seen are the servers a hears now, itself included.
func (g *gossip) seen(a int) []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seenLocked(a, time.Now())
}

func (g *gossip) capacity(i int) map[string]ledger.ModelTotals {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.caps[i]
}

// boot is the process generation gossip last showed for i: a restart is a
// new boot, which the homes see.
func (g *gossip) boot(i int) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.gens[i]
}

func (g *gossip) subscribe() (<-chan struct{}, func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := make(chan struct{}, 1)
	k := g.next
	g.next++
	g.subs[k] = c
	return c, func() {
		g.mu.Lock()
		delete(g.subs, k)
		g.mu.Unlock()
	}
}
