package main

import (
	"math"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
)

func TestWaitsBetween(t *testing.T) {
	buckets := []float64{math.Inf(-1), 0, 1e-6, 1e-3, 1e-2, math.Inf(1)}
	before := &metrics.Float64Histogram{Buckets: buckets, Counts: []uint64{0, 5, 5, 5, 5}}
	// Since before: 80 waits under a microsecond, 15 up to a
	// millisecond, 5 up to ten.
	after := &metrics.Float64Histogram{Buckets: buckets, Counts: []uint64{0, 85, 20, 10, 5}}
	w := waitsBetween(before, after)
	if w.n != 100 {
		t.Fatalf("n = %d, want 100", w.n)
	}
	for _, c := range []struct{ p, want float64 }{{0.5, 1e-6}, {0.79, 1e-6}, {0.8, 1e-3}, {0.9, 1e-3}, {0.95, 1e-2}, {0.99, 1e-2}} {
		if got := w.quantile(c.p); got != c.want {
			t.Errorf("quantile(%v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got, want := w.atLeast(), 15*1e-6+5*1e-3; math.Abs(got-want) > 1e-12 {
		t.Errorf("atLeast = %v, want %v", got, want)
	}
}

func TestSchedSinceCountsTheWaitsOfThisProcess(t *testing.T) {
	before := schedLatencies()
	if len(before.Buckets) != len(before.Counts)+1 {
		t.Fatalf("%d buckets for %d counts", len(before.Buckets), len(before.Counts))
	}
	// Goroutines made runnable and run: the runtime samples some of
	// their waits (not every one), so a thousand leave some.
	var wg sync.WaitGroup
	for range 1000 {
		wg.Add(1)
		go wg.Done()
	}
	wg.Wait()
	if w := waitsBetween(before, schedLatencies()); w.n == 0 {
		t.Fatal("no waits recorded for a thousand goroutines")
	}
	if got := schedSince(before); !strings.Contains(got, " waits; p50 ") {
		t.Fatalf("summary %q: want the waits' count and quantiles", got)
	}
}
