package main

import (
	"math/rand/v2"
	"time"
)

// retryBudget bounds how long a client keeps retrying one operation after
// answers that leave its outcome open; longer than a reservation lease and
// a freeze past it, so that retries outlast most faults.
const retryBudget = 20 * time.Second

// Backoff between retries: doubling from the first to the last, each wait
// drawn from its upper half.
const (
	backoffFirst = 250 * time.Millisecond
	backoffLast  = 3 * time.Second
)

// retrying runs try through first and then, while the answer leaves the
// outcome open (a 503, a timeout, a dead or frozen agent), through other
// agents chosen at random — never the one that just failed, nor the node
// named avoid — with backoff, until a definitive answer, budget has passed
// since the first try, or the run stops. It returns the last answer.
// This is what the platform's clients do: the same ID and the same
// request through whichever agent answers.
func (w *workload) retrying(rng *rand.Rand, first *agent, avoid string, budget time.Duration, try func(a *agent) outcome) outcome {
	end := time.Now().Add(budget)
	a, wait := first, backoffFirst
	for {
		o := try(a)
		if o != outAmbiguous || time.Now().After(end) || w.stopped() {
			return o
		}
		d := wait/2 + time.Duration(rng.Int64N(int64(wait/2)+1))
		select {
		case <-w.stop:
			return o
		case <-time.After(d):
		}
		wait = min(2*wait, backoffLast)
		a = w.another(rng, a.name, avoid)
	}
}

// another is a random agent other than not and avoid (not itself when
// there is no other choice).
func (w *workload) another(rng *rand.Rand, not, avoid string) *agent {
	var pool []*agent
	for _, a := range w.agents {
		if a.name != not && a.name != avoid {
			pool = append(pool, a)
		}
	}
	if len(pool) == 0 {
		return w.agents[rng.IntN(len(w.agents))]
	}
	return pool[rng.IntN(len(pool))]
}
