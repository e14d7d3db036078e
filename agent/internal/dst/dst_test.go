package dst

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// schedules is which seeds TestSimulation runs: DST_SCHEDULES of them (or
// 100) from DST_FIRST (or 1).
// DST_SEED runs that one seed, with its trace on failure.
func schedules(t *testing.T) (first uint64, n int) {
	if s := os.Getenv("DST_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DST_SEED=%q: want an unsigned integer", s)
		}
		return seed, 1
	}
	n = 100
	if s := os.Getenv("DST_SCHEDULES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("DST_SCHEDULES=%q: want a positive integer", s)
		}
		n = v
	}
	first = 1
	if s := os.Getenv("DST_FIRST"); s != "" { // a later stretch of seeds
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil || v < 1 {
			t.Fatalf("DST_FIRST=%q: want a positive integer", s)
		}
		first = v
	}
	return first, n
}

// workers is how many schedules run side by side: each runs in a bubble
// of its own, and one schedule keeps about one core busy.
const workers = 2

func TestSimulation(t *testing.T) {
	first, n := schedules(t)
	start := time.Now()
	var (
		mu                                                               sync.Mutex
		ops, acked, regOps, faults, checked, skipped, revived, undecided int
		known                                                            []uint64
		awaitingKept, awaitingUndone                                     int
		killedAtRelease, releasesLost                                    int
	)
	strict := os.Getenv("DST_STRICT") == "1"
	t.Run("schedules", func(t *testing.T) {
		for wk := range workers {
			t.Run(fmt.Sprintf("worker-%d", wk), func(t *testing.T) {
				t.Parallel()
				dir := t.TempDir()
				for seed := first + uint64(wk); seed < first+uint64(n); seed += workers {
					cfg := DefaultConfig(seed, dir)
					cfg.Trace = n == 1
					out := Run(t, cfg)
					if out.Revived > 0 {
						t.Logf("DST_SEED=%d: %d released IDs claimed again by a claim whose client gave up", seed, out.Revived)
					}
					if len(out.Known) > 0 {
						t.Logf("DST_SEED=%d: open defect (docs/names.md, \"Simulation\"): %s", seed, out.Known[0])
						if strict {
							out.Violations = append(out.Violations, out.Known...)
						}
					}
					var res porcupine.CheckResult
					if len(out.Violations) == 0 {
						res, out.Violations = checkHistory(out.History, 2*time.Second)
					}
					mu.Lock()
					ops, acked, regOps, faults = ops+out.ClientOps, acked+out.Acked, regOps+out.RegOps, faults+out.Faults
					checked, skipped, revived = checked+out.Checked, skipped+out.Skipped, revived+out.Revived
					awaitingKept, awaitingUndone = awaitingKept+out.AwaitingKept, awaitingUndone+out.AwaitingUndone
					killedAtRelease, releasesLost = killedAtRelease+out.KilledAtRelease, releasesLost+out.ReleasesLost
					if res == porcupine.Unknown {
						undecided++
					}
					if len(out.Known) > 0 {
						known = append(known, seed)
					}
					mu.Unlock()
					if n == 1 && os.Getenv("DST_TRACE") == "1" {
						t.Log(out.Trace)
					}
					if len(out.Violations) > 0 {
						if n == 1 && os.Getenv("DST_TRACE") != "1" {
							t.Log(out.Trace)
						}
						t.Fatalf("DST_SEED=%d: %d violations:\n%s\nreplay: DST_SEED=%d go test ./agent/internal/dst -run '^TestSimulation$' -v", seed, len(out.Violations), joinLines(out.Violations), seed)
					}
				}
			})
		}
	})
	el := time.Since(start)
	t.Logf("%d schedules in %v (%.1f schedules/s, %d side by side): %d client calls (%d acknowledged claims/releases), %d registry commands applied, %d faults; final state checked for %d IDs, %d left out (an abandoned call could land late; %d released IDs claimed again by one whose client gave up); %d registry histories linearizable, %d undecided in 2 s; %d commits awaiting their name after a crash kept, %d undone; %d nodes killed as a name's release reached the registry (%d of those releases lost); the open defect in %d schedules %v",
		n, el.Round(time.Millisecond), float64(n)/el.Seconds(), workers, ops, acked, regOps, faults, checked, skipped, revived, n-undecided, undecided, awaitingKept, awaitingUndone, killedAtRelease, releasesLost, len(known), known)
}

// TestSimulationCatchesCommitWithoutName proves the checks can fail: a
// registry that acknowledges holds and confirms it never applied lets
// owners commit claims whose names they do not hold.
func TestSimulationCatchesCommitWithoutName(t *testing.T) {
	dir := t.TempDir()
	for seed := uint64(1); seed <= 20; seed++ {
		cfg := DefaultConfig(seed, dir)
		cfg.BrokenGrants = true
		if out := Run(t, cfg); len(out.Violations) > 0 {
			t.Logf("DST_SEED=%d found it: %s", seed, out.Violations[0])
			return
		}
	}
	t.Fatal("20 schedules with grants never applied found no violation: the checks cannot fail")
}

// TestSimulationReplays: the same seed gives the same schedule, event by
// event, though the roles run on goroutines: every message, registry call,
// fault and answer at the same virtual time, in the same order. 8 seeds,
// or DST_REPLAYS.
func TestSimulationReplays(t *testing.T) {
	dir := t.TempDir()
	n := uint64(8)
	if s := os.Getenv("DST_REPLAYS"); s != "" { // more seeds, to hunt a replay that differs
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil || v < 1 {
			t.Fatalf("DST_REPLAYS=%q: want a positive integer", s)
		}
		n = v
	}
	for seed := uint64(1); seed <= n; seed++ {
		cfg := DefaultConfig(seed, dir)
		cfg.Trace = true
		a, b := Run(t, cfg), Run(t, cfg)
		if a.Trace == "" {
			t.Fatalf("seed %d traced nothing", seed)
		}
		if a.Trace != b.Trace {
			al, bl := strings.Split(a.Trace, "\n"), strings.Split(b.Trace, "\n")
			for i := range min(len(al), len(bl)) {
				if al[i] != bl[i] {
					t.Fatalf("seed %d ran two different schedules, from line %d:\n%s\n%s", seed, i, al[i], bl[i])
				}
			}
			t.Fatalf("seed %d ran two different schedules: %d and %d lines", seed, len(al), len(bl))
		}
	}
}

func joinLines(s []string) string {
	out := ""
	for _, l := range s {
		out += "  " + l + "\n"
	}
	return out
}
