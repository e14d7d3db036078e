package main

import (
	"cmp"
	"fmt"
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
