package main

import (
	"fmt"
	"testing"
	"time"
)

// benchMix is the bench's platform in round-robin profiles, 50 servers:
// dgx-h100, a100-pcie-4, l40s-4, rtx6000pro-2, mixed (its usable GPUs).
func benchMix() capacity {
	capa := capacity{}
	for i := range 50 {
		s := fmt.Sprintf("gpu%03d", i)
		switch i % 5 {
		case 0:
			capa[s] = map[string]int{"H100": 8}
		case 1:
			capa[s] = map[string]int{"A100": 4}
		case 2:
			capa[s] = map[string]int{"L40S": 4}
		case 3:
			capa[s] = map[string]int{"RTX": 2}
		case 4:
			capa[s] = map[string]int{"H100": 2, "L40S": 1, "RTX": 1}
		}
	}
	return capa
}

// On the bench's trace, with claims and releases instantaneous and every
// view lagging by up to a second, choosing on stale figures costs little
// once the coordinator re-checks before refusing; reading the twelve
// servers nearest the request first keeps it within 1% of the oracle.
// Deterministic (seeded): no timing is measured.
func TestStaleViewModel(t *testing.T) {
	capa := benchMix()
	for _, load := range []float64{0.9, 0.95} {
		oracle, view, best, near := 0, 0, 0, 0
		for seed := uint64(1); seed <= 20; seed++ {
			tr := newTrace(seed, capa, load, 3*time.Second, 6*time.Second, "x")
			a, _ := simulate(tr, capa, bestFit, seed)
			oracle += a
			view += staleModel(tr, capa, 500*time.Millisecond, true, nil, seed)
			best += staleModel(tr, capa, 500*time.Millisecond, true, probeBest, seed)
			near += staleModel(tr, capa, 500*time.Millisecond, true, probeNearest(capa), seed)
		}
		ratio := func(n int) float64 { return float64(n) / float64(oracle) }
		t.Logf("load %.0f%%, 20 traces: oracle %d; view only ×%.3f, six best read ×%.3f, twelve nearest read ×%.3f",
			load*100, oracle, ratio(view), ratio(best), ratio(near))
		if ratio(near) < 0.99 {
			t.Errorf("load %.0f%%: twelve nearest read ×%.3f of the oracle, want ≥ ×0.99", load*100, ratio(near))
		}
	}
}

// The oracle's figure moves on its tie-breaks alone: tieSpread replays it
// with other tie orders, and the spread it reports is ordered and bounded
// by the claims offered. On this trace ties decide a few claims, so a
// spread of zero would mean the other tie orders were not used.
func TestOracleTieSpread(t *testing.T) {
	capa := benchMix()
	tr := newTrace(3, capa, 0.95, 3*time.Second, 6*time.Second, "x")
	_, offered := simulate(tr, capa, bestFit, 3)
	s := tieSpread(tr, capa, 3)
	if !(s[0] <= s[1] && s[1] <= s[2] && s[2] <= offered) {
		t.Fatalf("tie spread %v of %d offered: want fewest ≤ median ≤ most ≤ offered", s, offered)
	}
	if s[0] == s[2] {
		t.Errorf("tie spread %v: every tie order accepted the same", s)
	}
}
