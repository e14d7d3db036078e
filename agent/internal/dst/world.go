// Package dst is a deterministic simulation of the claim protocol with the
// name registry (docs/names.md, "Simulation"): seeded random schedules of
// claims, gets and releases through random agents, under kills, restarts,
// pauses past a lease, partitions and message loss, on a virtual clock,
// checked against the protocol's safety properties. The registry is the
// real state machine (names.Machine) and every owner's ledger the real
// ledger.Ledger; the coordinator, owner and anti-entropy steps are
// modelled here after agent/namedclaim.go, agent/attempt.go,
// agent/owner.go, agent/ownernames.go and agent/antientropy.go.
package dst

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// epoch0 is virtual time zero.
var epoch0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type event struct {
	at   int64 // virtual milliseconds
	seq  uint64
	node int // -1: runs whatever the nodes' states
	gen  int // the node's generation when scheduled
	fn   func()
}

type queue []*event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// world is one schedule: nodes, the registry, the network and the clock.
type world struct {
	cfg   Config
	rng   *rand.Rand
	now   int64
	seq   uint64
	q     queue
	nodes []*node
	reg   *registry
	// cut[a][b]: messages from a to b are dropped; index len(nodes) is
	// the registry.
	cut  [][]bool
	loss float64
	// faulty is false once the schedule heals for its final checks.
	faulty bool
	trace  []string
	// checked and lateSkipped count the final checks of acknowledged
	// answers made and left out.
	checked, lateSkipped int
	// copies counts commits made while another server held the ID
	// committed; known the violations of open defects (docs/names.md,
	// "Simulation").
	copies int
	known  []string
	fail   []string
}

func (w *world) time() time.Time { return epoch0.Add(time.Duration(w.now) * time.Millisecond) }

func (w *world) logf(format string, args ...any) {
	if w.cfg.Trace {
		w.trace = append(w.trace, fmt.Sprintf("%8dms ", w.now)+fmt.Sprintf(format, args...))
	}
}

func (w *world) violation(format string, args ...any) {
	msg := fmt.Sprintf("at %dms: ", w.now) + fmt.Sprintf(format, args...)
	w.fail = append(w.fail, msg)
	w.logf("VIOLATION %s", msg)
}

// at schedules fn after delay ms; fn runs on node n (n >= 0) only if n
// was not killed since, and waits while n is paused.
func (w *world) at(n int, delay int64, fn func()) {
	gen := 0
	if n >= 0 {
		gen = w.nodes[n].gen
	}
	w.seq++
	heap.Push(&w.q, &event{at: w.now + delay, seq: w.seq, node: n, gen: gen, fn: fn})
}

func (w *world) step() bool {
	if len(w.q) == 0 {
		return false
	}
	e := heap.Pop(&w.q).(*event)
	w.now = e.at
	if e.node >= 0 {
		nd := w.nodes[e.node]
		if !nd.alive || nd.gen != e.gen {
			return true // the process that would have run it is gone
		}
		if nd.pausedUntil > w.now {
			e.at = nd.pausedUntil
			w.seq++
			e.seq = w.seq
			heap.Push(&w.q, e)
			return true
		}
	}
	e.fn()
	return true
}

// runUntil runs events up to virtual time t.
func (w *world) runUntil(t int64) {
	for len(w.q) > 0 && w.q[0].at <= t {
		w.step()
	}
	if w.now < t {
		w.now = t
	}
}

// send delivers fn on node to after a network delay, unless the link
// from -> to is cut or the message is lost. to == len(nodes) is the
// registry, which runs fn whatever the nodes do.
func (w *world) send(from, to int, fn func()) {
	if from == to {
		w.at(to, 0, fn) // in-process: nothing to lose
		return
	}
	if w.cut[from][to] || (w.loss > 0 && w.rng.Float64() < w.loss) {
		return
	}
	d := 1 + w.rng.Int64N(w.cfg.MaxDelay)
	if to == len(w.nodes) {
		w.at(-1, d, fn)
		return
	}
	w.at(to, d, fn)
}

// call is one request from node from to node to: handler runs there and
// replies; cont runs on from with the answer, or with ok false once
// timeout passes without one. Exactly one of the two runs, on from, and
// neither if from dies first.
func (w *world) call(from, to int, timeout int64, handler func(reply func(any)), cont func(ans any, ok bool)) {
	done := false
	w.at(from, timeout, func() {
		if !done {
			done = true
			cont(nil, false)
		}
	})
	w.send(from, to, func() {
		handler(func(ans any) {
			w.send(to, from, func() {
				if !done {
					done = true
					cont(ans, true)
				}
			})
		})
	})
}

func (w *world) name(n int) string {
	if n == len(w.nodes) {
		return "registry"
	}
	return w.nodes[n].name
}

func (w *world) traceText() string { return strings.Join(w.trace, "\n") }
