package main

import (
	"fmt"
	"runtime/metrics"
)

// schedLatencies reads the runtime's histogram of the time goroutines
// spent runnable before they ran.
func schedLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	return s[0].Value.Float64Histogram()
}

// schedSince says the quantiles of the waits to run since before.
func schedSince(before *metrics.Float64Histogram) string {
	w := waitsBetween(before, schedLatencies())
	if w.n == 0 {
		return "no waits"
	}
	return fmt.Sprintf("%d waits; p50 %.0fµs p90 %.0fµs p99 %.0fµs; sum ≥ %.2fs",
		w.n, w.quantile(0.5)*1e6, w.quantile(0.9)*1e6, w.quantile(0.99)*1e6, w.atLeast())
}

// waits is a histogram of waits (seconds): counts[i] fell in
// [buckets[i], buckets[i+1]).
type waits struct {
	buckets []float64
	counts  []uint64
	n       uint64
}

// waitsBetween is what after recorded since before (the same metric,
// read twice: the same buckets).
func waitsBetween(before, after *metrics.Float64Histogram) waits {
	w := waits{buckets: after.Buckets, counts: make([]uint64, len(after.Counts))}
	for i := range w.counts {
		w.counts[i] = after.Counts[i] - before.Counts[i]
		w.n += w.counts[i]
	}
	return w
}

// quantile is the upper bound of the bucket that holds the p-quantile:
// the wait that share p of them did not exceed, rounded up to a bucket.
func (w waits) quantile(p float64) float64 {
	want := uint64(p * float64(w.n))
	var seen uint64
	for i, c := range w.counts {
		seen += c
		if seen > want {
			return w.buckets[i+1]
		}
	}
	return w.buckets[len(w.buckets)-1]
}

// atLeast is the waits' total, each counted at its bucket's lower bound.
func (w waits) atLeast() float64 {
	var sum float64
	for i, c := range w.counts {
		sum += float64(c) * max(w.buckets[i], 0)
	}
	return sum
}
