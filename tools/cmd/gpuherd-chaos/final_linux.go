package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// The phases after the final checks of the whole cluster: what clients are
// told once every fault has healed, and while one member stays dead.

// probeHealed asks every agent, with every fault healed and every agent
// up, for IDs that never existed (get and release must answer not found,
// not a retryable 503) and for every claim the run still holds (it must be
// found as acknowledged).
func probeHealed(w *workload, rng *rand.Rand, tag string) {
	const strict = "with every fault healed and every agent up"
	probe(w, w.agents, rng, heldRecs(w.h, ""), tag, strict)
}

// probe asks every agent of via, all at once (a call may wait out an
// owner's timeout), for two IDs that never existed and for a share of the
// claims held.
func probe(w *workload, via []*agent, rng *rand.Rand, held []*claimRec, tag, strict string) {
	var wg sync.WaitGroup
	for i, a := range via {
		var mine []*claimRec
		for k, rec := range held {
			if k%len(via) == i {
				mine = append(mine, rec)
			}
		}
		cli := rng.IntN(2) == 0
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.getUnknown(a, fmt.Sprintf("nx-%s-g%d", tag, i), cli, strict)
			w.releaseUnknown(a, fmt.Sprintf("nx-%s-r%d", tag, i), !cli, strict)
			for _, rec := range mine {
				w.get(a, rec, cli)
			}
		}()
	}
	wg.Wait()
}

// heldRecs are the claims the run certainly holds now, on node (any node
// when ""), in ID order.
func heldRecs(h *history, node string) []*claimRec {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	var out []*claimRec
	for _, rec := range h.recs {
		if rec.heldAt(now) && !rec.ambiguousRelease && (node == "" || rec.node == node) {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(x, y *claimRec) int {
		if x.id < y.id {
			return -1
		}
		return 1
	})
	return out
}

// deadMember kills the agent that holds the most claims and keeps it down
// (issue 11, point 6). Once every other agent sees it dead, IDs that never
// existed must still answer not found through every live agent (a client
// retrying on 503 would loop), and its claims must not read as not found.
// It returns the agent it killed.
func deadMember(ctx context.Context, w *workload, rng *rand.Rand, logf func(string, ...any)) *agent {
	var dead *agent
	most := -1
	for _, a := range w.agents {
		if n := len(heldRecs(w.h, a.name)); n > most {
			dead, most = a, n
		}
	}
	logf("dead member: kill -9 of %s (it holds %d claims of the run), kept down", dead.name, most)
	if err := dead.kill9(); err != nil {
		logf("dead member: %v; skipped", err)
		return dead
	}
	var live []*agent
	for _, a := range w.agents {
		if a != dead {
			live = append(live, a)
		}
	}
	if err := waitDead(ctx, live, dead.name, 30*time.Second); err != nil {
		logf("dead member: %v; probing anyway", err)
	}
	strict := fmt.Sprintf("with %s dead (every agent sees it so) and every other fault healed", dead.name)
	probe(w, live, rng, heldRecs(w.h, dead.name), "dead", strict)
	return dead
}

// waitDead waits until every agent of live no longer lists name as alive.
func waitDead(ctx context.Context, live []*agent, name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pending := ""
		for _, a := range live {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			ms, err := a.client.Members(cctx)
			cancel()
			if err != nil {
				pending = fmt.Sprintf("%s: %v", a.name, err)
				break
			}
			for _, m := range ms {
				if m.Name == name && (m.State == "alive" || m.State == "suspect") {
					pending = fmt.Sprintf("%s still sees %s %s", a.name, name, m.State)
				}
			}
			if pending != "" {
				break
			}
		}
		if pending == "" {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not seen dead by every agent within %s (%s)", name, timeout, pending)
		}
		sleep(ctx, 250*time.Millisecond)
	}
}
