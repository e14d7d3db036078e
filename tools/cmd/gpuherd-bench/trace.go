package main

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/gpuherd/gpuherd/agent/placement"
)

// request is one claim of the trace.
type request struct {
	ID     string
	At     time.Duration // arrival, from the start of the replay
	Hold   time.Duration // how long it keeps its GPUs once granted
	Model  string
	Count  int
	Warmup bool // part of the initial fill: not counted in acceptance
}

// trace is a seeded workload: Poisson arrivals, exponential holding times,
// claims of 1, 2, 4 or 8 GPUs of one model each, models in proportion to
// the platform's capacity, sizes capped at what one server of the model has.
type trace struct {
	Load     float64
	Rate     float64 // arrivals per second
	MeanSize float64
	Requests []request
	Duration time.Duration
	Capa     capacity // the platform it was built for (the oracle's start)
}

var sizeWeights = map[int]float64{1: 0.4, 2: 0.3, 4: 0.2, 8: 0.1}

// modelMix is, per model, its share of the capacity and its size choices.
type modelMix struct {
	model  string
	share  float64
	sizes  []int
	weight []float64
}

func mixOf(capa capacity) ([]modelMix, int, float64) {
	total, byModel, maxOne := 0, map[string]int{}, map[string]int{}
	for _, ms := range capa {
		for m, n := range ms {
			total += n
			byModel[m] += n
			maxOne[m] = max(maxOne[m], n)
		}
	}
	var mix []modelMix
	mean := 0.0
	for m, n := range byModel {
		mm := modelMix{model: m, share: float64(n) / float64(total)}
		sum := 0.0
		for _, s := range []int{1, 2, 4, 8} {
			if s <= maxOne[m] {
				mm.sizes = append(mm.sizes, s)
				mm.weight = append(mm.weight, sizeWeights[s])
				sum += sizeWeights[s]
			}
		}
		for i := range mm.weight {
			mm.weight[i] /= sum
			mean += mm.share * mm.weight[i] * float64(mm.sizes[i])
		}
		mix = append(mix, mm)
	}
	slices.SortFunc(mix, func(a, b modelMix) int { return cmp.Compare(a.model, b.model) })
	return mix, total, mean
}

// newTrace builds the trace for a target load (share of all GPUs held on
// average): rate = load × GPUs / (mean size × mean hold). It starts in the
// steady state: exponential holds are memoryless, so the claims alive at
// time 0 are Poisson(rate × hold) fresh arrivals, issued first, spread over
// a short warm-up window; acceptance counts only the arrivals after it.
func newTrace(seed uint64, capa capacity, load float64, hold, dur time.Duration, prefix string) trace {
	rnd := rand.New(rand.NewPCG(seed, uint64(load*1000)))
	mix, total, mean := mixOf(capa)
	rate := load * float64(total) / (mean * hold.Seconds())
	warm := min(2*time.Second, dur/4) // the initial fill is spread over this much
	t := trace{Load: load, Rate: rate, MeanSize: mean, Duration: warm + dur, Capa: capa}
	pick := func() (string, int) {
		x := rnd.Float64()
		mm := mix[len(mix)-1]
		for _, m := range mix {
			if x < m.share {
				mm = m
				break
			}
			x -= m.share
		}
		y := rnd.Float64()
		for i, w := range mm.weight {
			if y < w {
				return mm.model, mm.sizes[i]
			}
			y -= w
		}
		return mm.model, mm.sizes[len(mm.sizes)-1]
	}
	expHold := func() time.Duration { return time.Duration(rnd.ExpFloat64() * float64(hold)) }
	n := 0
	add := func(at time.Duration, warm bool) {
		m, c := pick()
		t.Requests = append(t.Requests, request{ID: fmt.Sprintf("%s-%05d", prefix, n), At: at, Hold: expHold(), Model: m, Count: c, Warmup: warm})
		n++
	}
	fill := poisson(rnd, rate*hold.Seconds())
	for i := range fill {
		add(time.Duration(i)*warm/time.Duration(max(fill, 1)), true)
	}
	for at := warm; ; {
		at += time.Duration(rnd.ExpFloat64() / rate * float64(time.Second))
		if at >= warm+dur {
			break
		}
		add(at, false)
	}
	return t
}

func poisson(rnd *rand.Rand, mean float64) int {
	// Normal approximation is plenty for the means used here (tens to hundreds).
	if mean > 30 {
		return max(0, int(math.Round(mean+math.Sqrt(mean)*rnd.NormFloat64())))
	}
	l, k, p := math.Exp(-mean), 0, 1.0
	for {
		p *= rnd.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

// ranker orders the servers that fit want, best first.
type ranker func(servers []placement.Server, want []placement.Want, rnd *rand.Rand) []string

// bestFit is the agent's own ranking (placement.Rank).
func bestFit(servers []placement.Server, want []placement.Want, rnd *rand.Rand) []string {
	return placement.Rank(servers, want, "", rnd)
}

// tieSeeds is how many other tie-breaks tieSpread replays the oracle with.
const tieSeeds = 32

// tieSpread replays the trace as the oracle does, on exact, instantaneous
// state, with tieSeeds other orders for best fit's ties, and returns the
// fewest, the median and the most claims accepted: how far the oracle's
// own figure moves on tie-breaks alone, which no allocator's run can be
// told apart from.
func tieSpread(t trace, capa capacity, seed uint64) [3]int {
	got := make([]int, tieSeeds)
	for i := range got {
		got[i], _ = simulate(t, capa, bestFit, seed+1000+uint64(i))
	}
	slices.Sort(got)
	return [3]int{got[0], got[len(got)/2], got[len(got)-1]}
}

// firstFit takes the fitting servers in name order.
func firstFit(servers []placement.Server, want []placement.Want, _ *rand.Rand) []string {
	out := placement.Rank(servers, want, "", nil) // every fitting server
	slices.SortFunc(out, cmpName)
	return out
}

// randomFit takes the fitting servers in random order.
func randomFit(servers []placement.Server, want []placement.Want, rnd *rand.Rand) []string {
	out := placement.Rank(servers, want, "", nil)
	rnd.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// simulate replays the trace on exact, instantaneous state (an omniscient
// allocator) with the given ranking: the oracle is bestFit. It returns
// accepted and offered claims, warm-up excluded.
func simulate(t trace, capa capacity, rank ranker, seed uint64) (accepted, offered int) {
	for i, ok := range simulateEach(t, capa, rank, seed) {
		if t.Requests[i].Warmup {
			continue
		}
		offered++
		if ok {
			accepted++
		}
	}
	return accepted, offered
}

// simulateEach is simulate's decision for each request of the trace, by
// index: whether the omniscient allocator granted it.
func simulateEach(t trace, capa capacity, rank ranker, seed uint64) []bool {
	granted := make([]bool, len(t.Requests))
	free := map[string]map[string]int{}
	for s, ms := range capa {
		free[s] = map[string]int{}
		for m, n := range ms {
			free[s][m] = n
		}
	}
	names := make([]string, 0, len(free))
	for s := range free {
		names = append(names, s)
	}
	slices.SortFunc(names, cmpName)
	type rel struct {
		at     time.Duration
		server string
		model  string
		count  int
	}
	var releases []rel // kept sorted by time
	rnd := rand.New(rand.NewPCG(seed, 7))
	for ri, r := range t.Requests {
		for len(releases) > 0 && releases[0].at <= r.At {
			x := releases[0]
			releases = releases[1:]
			free[x.server][x.model] += x.count
		}
		servers := make([]placement.Server, len(names))
		for i, s := range names {
			servers[i] = placement.Server{Name: s, Free: free[s]}
		}
		got := rank(servers, []placement.Want{{Model: r.Model, Count: r.Count}}, rnd)
		if len(got) == 0 {
			continue
		}
		granted[ri] = true
		s := got[0]
		free[s][r.Model] -= r.Count
		x := rel{at: r.At + r.Hold, server: s, model: r.Model, count: r.Count}
		i, _ := slices.BinarySearchFunc(releases, x.at, func(a rel, at time.Duration) int { return cmp.Compare(a.at, at) })
		releases = slices.Insert(releases, i, x)
	}
	return granted
}

// fitsSomewhere reports whether some server of free holds count of model.
func fitsSomewhere(free capacity, model string, count int) bool {
	for _, ms := range free {
		if ms[model] >= count {
			return true
		}
	}
	return false
}

// staleModel replays the trace as a coordinator placing on a gossip view
// that lags the truth: each server's figures in the view are those of
// up to 2×lag ago (uniformly drawn per claim and server). Before choosing,
// it reads the exact figures of the servers probe picks, ranks those that
// fit by them best fit, and takes the first; when none does, it asks the
// view's candidates in order (an owner takes a claim it can hold), and at
// last re-reads every server and takes the best fit (the agent's re-check
// before refusing). Releases and claims are instantaneous: what separates
// it from the oracle is only the choices made on stale figures. probe nil
// reads nothing before asking.
func staleModel(t trace, capa capacity, lag time.Duration, warmBlind bool, probe func(view []placement.Server, want []placement.Want, rnd *rand.Rand) []string, seed uint64) (accepted int) {
	type change struct {
		at     time.Duration
		server string
		model  string
		delta  int
	}
	free := capacity{}
	var names []string
	for s, ms := range capa {
		free[s] = map[string]int{}
		for m, n := range ms {
			free[s][m] = n
		}
		names = append(names, s)
	}
	slices.SortFunc(names, cmpName)
	var history []change // applied, in time order
	type rel struct {
		at     time.Duration
		server string
		model  string
		count  int
	}
	var releases []rel
	rnd := rand.New(rand.NewPCG(seed, 11))
	apply := func(c change) {
		free[c.server][c.model] += c.delta
		history = append(history, c)
	}
	// viewOf is server s's free GPUs as of `at`: the truth minus every
	// change applied after it.
	viewOf := func(s string, at time.Duration) map[string]int {
		out := maps.Clone(free[s])
		for i := len(history) - 1; i >= 0 && history[i].at > at; i-- {
			if h := history[i]; h.server == s {
				out[h.model] -= h.delta
			}
		}
		return out
	}
	fresh := func(s string) placement.Server { return placement.Server{Name: s, Free: free[s]} }
	for _, r := range t.Requests {
		for len(releases) > 0 && releases[0].at <= r.At {
			x := releases[0]
			releases = releases[1:]
			apply(change{at: x.at, server: x.server, model: x.model, delta: x.count})
		}
		want := []placement.Want{{Model: r.Model, Count: r.Count}}
		view := make([]placement.Server, len(names))
		for i, s := range names {
			at := r.At - time.Duration(rnd.Float64()*2*float64(lag))
			if r.Warmup && warmBlind {
				at = 0 // the fill's burst: every view still shows the empty platform
			}
			view[i] = placement.Server{Name: s, Free: viewOf(s, at)}
		}
		var order []string
		if probe != nil && !(r.Warmup && warmBlind) {
			var read []placement.Server
			for _, s := range probe(view, want, rnd) {
				read = append(read, fresh(s))
			}
			order = placement.Rank(read, want, "", rnd)
		}
		order = append(order, placement.Rank(view, want, "", rnd)...)
		chosen := ""
		for i, s := range order {
			if i >= 8 {
				break
			}
			if fresh(s).Free[r.Model] >= r.Count {
				chosen = s
				break
			}
		}
		if chosen == "" {
			all := make([]placement.Server, len(names))
			for i, s := range names {
				all[i] = fresh(s)
			}
			if got := placement.Rank(all, want, "", rnd); len(got) > 0 {
				chosen = got[0]
			}
		}
		if chosen == "" {
			continue
		}
		if !r.Warmup {
			accepted++
		}
		apply(change{at: r.At, server: chosen, model: r.Model, delta: -r.Count})
		x := rel{at: r.At + r.Hold, server: chosen, model: r.Model, count: r.Count}
		i, _ := slices.BinarySearchFunc(releases, x.at, func(a rel, at time.Duration) int { return cmp.Compare(a.at, at) })
		releases = slices.Insert(releases, i, x)
	}
	return accepted
}

// probeBest reads the view's six best candidates (the agent before it
// read the servers nearest the request).
func probeBest(view []placement.Server, want []placement.Want, rnd *rand.Rand) []string {
	r := placement.Rank(view, want, "", rnd)
	return r[:min(6, len(r))]
}

// probeNearest reads the twelve servers nearest the request by the view,
// on either side (the agent's attempt.probe).
func probeNearest(capa capacity) func(view []placement.Server, want []placement.Want, rnd *rand.Rand) []string {
	return func(view []placement.Server, want []placement.Want, rnd *rand.Rand) []string {
		return placement.Nearest(view, want, func(s string) bool {
			for _, w := range want {
				if capa[s][w.Model] < w.Count {
					return false
				}
			}
			return true
		}, 12, rnd)
	}
}
