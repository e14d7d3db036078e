// Package dst is a deterministic simulation of the claim protocol with the
// name registry (docs/names.md, "Simulation"): seeded random schedules of
// claims, gets, releases and resizes through random agents, under kills,
// restarts, pauses past a lease, partitions and message loss, checked
// against the protocol's safety properties.
//
// The agents are the real roles: each server runs agent/claim's
// coordinator, agent/owner's owner with its anti-entropy pass and notices,
// agent/home and agent/host on a simulated machine (vfio/fakekernel), with
// its real ledger on disk. The registry is the real state machine without
// raft (names.NewLocal), reached through one front per server
// (names.Registry.Front). Every peer call and registry call is a message
// in this package's network, and the whole schedule runs in a
// testing/synctest bubble: time is the bubble's virtual clock, and after
// every step the simulation waits until every goroutine is blocked, then
// delivers the next message the seed picks.
package dst

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing/synctest"
	"time"
)

// answerText describes an answer, the same way in every run (no
// pointers): it orders answers and draws their fate.
func answerText(a any) string {
	switch a := a.(type) {
	case regAnswer:
		return fmt.Sprintf("%s %s %v", a.res.Code, recText(a.res.Record), a.err)
	case interface{ text() string }:
		return a.text()
	case notSent:
		return "refused"
	}
	panic(fmt.Sprintf("no text for answer %T", a))
}

// noReply is what a handler answers when its answer is never sent (a
// registry without a leader, an answer lost with its leader).
type noReply struct{}

// message is one request or answer on the network. from and to index the
// nodes; client is -1 for a client's request, and len(nodes) is the
// registry.
type message struct {
	from, to int
	gen      int    // the sender's generation when sent
	desc     string // what it is, for the canonical order and the trace
	// handle runs at the receiver, for a request: its answer goes back.
	handle func(ctx context.Context) any
	// reply receives the answer; answer is set on an answer.
	reply  chan any
	answer any
	isAns  bool
	// gaveUp: the caller stopped waiting for the answer (its deadline
	// passed, or its own caller went). The receiver's handler then has
	// its context cancelled, as the peer API's is when the caller resets
	// its stream: from the start when the request was delivered after
	// that, else through cancel once the caller goes on in its turn.
	// Both guarded by the world's mu.
	gaveUp bool
	cancel context.CancelFunc
}

type delivery struct {
	at  time.Time
	seq uint64
	m   *message
}

type deliveries []*delivery

func (q deliveries) Len() int { return len(q) }
func (q deliveries) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q deliveries) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *deliveries) Push(x any)   { *q = append(*q, x.(*delivery)) }
func (q *deliveries) Pop() any {
	old := *q
	d := old[len(old)-1]
	*q = old[:len(old)-1]
	return d
}

// timed is something the driver does at a virtual time: a fault, a heal,
// a gossip round.
type timed struct {
	at time.Time
	fn func()
}

// world is one schedule: nodes, the registry, the network and the driver.
type world struct {
	cfg    Config
	rng    *rand.Rand // the network's and the faults' choices, driver only
	start  time.Time
	nodes  []*node
	reg    *registry
	gossip *gossip

	mu     sync.Mutex // guards parked, the nodes' liveness, cut and down
	parked []*message
	closed bool
	wake   chan struct{}
	// ended is closed at the teardown, once closed is set: a goroutine
	// waiting for its turn (resumeInTurn) then goes on at once.
	ended chan struct{}

	seen  map[uint64]uint64 // fate: messages sent, by content
	q     deliveries
	seq   uint64
	plans []timed
	// cut[a][b]: messages from a to b are dropped; index len(nodes) is
	// the registry.
	cut    [][]bool
	loss   float64
	faulty atomic.Bool

	// checked and lateSkipped count the final checks of acknowledged
	// answers made and left out; revived, the released IDs left out that
	// a claim whose client gave up (not a hasty one) brought back.
	checked, lateSkipped, revived int
	// clientOps and acked count the clients' calls and acknowledged
	// answers, from their goroutines.
	clientOps, acked atomic.Int64
	// awaitingKept and awaitingUndone count the owners' decisions on
	// commits awaiting their name (a crash between the ledger's commit
	// and the hold's answer: Config.KillAtHold).
	awaitingKept, awaitingUndone atomic.Int64
	// killedAtRelease and releasesLost count Config.KillAtRelease's
	// kills and the releases they lost; the driver's alone.
	killedAtRelease, releasesLost int

	traceMu sync.Mutex
	trace   []string
	fail    []string
	known   []string
}

func (w *world) ms() int64 { return time.Since(w.start).Milliseconds() }

func (w *world) logf(format string, args ...any) {
	if !w.cfg.Trace {
		return
	}
	w.traceMu.Lock()
	defer w.traceMu.Unlock()
	w.trace = append(w.trace, fmt.Sprintf("%8dms ", w.ms())+fmt.Sprintf(format, args...))
}

func (w *world) violation(format string, args ...any) {
	msg := fmt.Sprintf("at %dms: ", w.ms()) + fmt.Sprintf(format, args...)
	w.traceMu.Lock()
	w.fail = append(w.fail, msg)
	w.traceMu.Unlock()
	w.logf("VIOLATION %s", msg)
}

// knownDefect notes a violation of the open defect Outcome.Known names.
func (w *world) knownDefect(format string, args ...any) {
	msg := fmt.Sprintf("at %dms: ", w.ms()) + fmt.Sprintf(format, args...)
	w.traceMu.Lock()
	w.known = append(w.known, msg)
	w.traceMu.Unlock()
	w.logf("KNOWN DEFECT %s", msg)
}

func (w *world) name(i int) string {
	switch {
	case i < 0:
		return "client"
	case i == len(w.nodes):
		return "registry"
	}
	return w.nodes[i].name
}

// at plans fn on the driver after d.
func (w *world) at(d time.Duration, fn func()) {
	w.plans = append(w.plans, timed{at: time.Now().Add(d), fn: fn})
}

// send parks m for the driver and wakes it.
func (w *world) send(m *message) {
	w.mu.Lock()
	w.parked = append(w.parked, m)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// call sends a request from node from (gen: its generation) to to and
// waits for its answer, or ctx. The answer is nil, false when none came.
func (w *world) call(ctx context.Context, from, gen, to int, desc string, handle func(context.Context) any) (any, bool) {
	if !w.current(from, gen) {
		return nil, false // a killed process sends nothing
	}
	m := &message{from: from, to: to, gen: gen, desc: desc, handle: handle, reply: make(chan any, 1)}
	w.send(m)
	select {
	case a := <-m.reply:
		return a, true
	case <-ctx.Done():
	}
	w.mu.Lock()
	m.gaveUp = true
	cancel := m.cancel
	w.mu.Unlock()
	w.resumeInTurn(from, gen, "no answer to "+desc)
	if cancel != nil {
		cancel() // in this goroutine's turn: the handler's wake is in the schedule
	}
	return nil, false
}

// resumeInTurn holds a goroutine of node from (gen; a client: -1) that
// woke without the driver, its call's deadline passed or its caller gone,
// until the driver lets it go on. Deadlines of one length started in one
// step (a delivery whose handler made two calls, each with its own
// timeout) pass at one instant, and the goroutines they wake ran side by
// side in no fixed order: seed 45 ran two schedules from there. Each goes
// on in turn instead, as an in-process message, in absorb's canonical
// order, with the others blocked. A process that is dead, or dies
// meanwhile, and the world's end let it go at once.
func (w *world) resumeInTurn(from, gen int, desc string) {
	var died <-chan struct{}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	if from >= 0 && from < len(w.nodes) {
		nd := w.nodes[from]
		if !nd.alive || nd.gen != gen {
			w.mu.Unlock()
			return
		}
		died = nd.ctx.Done()
	}
	w.mu.Unlock()
	turn := make(chan any, 1)
	w.send(&message{from: from, to: from, gen: gen, desc: desc, reply: turn, isAns: true})
	select {
	case <-turn:
	case <-died:
	case <-w.ended:
	}
}

// current reports whether node i is alive in generation gen (a client,
// -1, always is).
func (w *world) current(i, gen int) bool {
	if i < 0 || i == len(w.nodes) {
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.closed && w.nodes[i].alive && w.nodes[i].gen == gen
}

// absorb takes the messages parked since the last step, in a canonical
// order (the goroutines that parked them ran in no fixed order), and
// decides each one's fate: lost, or delivered after a network delay.
func (w *world) absorb() {
	w.mu.Lock()
	ms := w.parked
	w.parked = nil
	w.mu.Unlock()
	slices.SortStableFunc(ms, func(a, b *message) int {
		return cmp.Or(cmp.Compare(a.from, b.from), cmp.Compare(a.to, b.to), cmp.Compare(a.desc, b.desc))
	})
	now := time.Now()
	for _, m := range ms {
		if m.from == m.to {
			w.push(now, m) // in-process
			continue
		}
		r := w.fate(m)
		if w.isCut(m.from, m.to) || (w.loss > 0 && r.Float64() < w.loss) {
			w.logf("lost %s -> %s: %s", w.name(m.from), w.name(m.to), m.desc)
			continue
		}
		// A delay to the nanosecond: a delivery never falls on the same
		// instant as a process's timer, whose goroutines would then run
		// side by side in no fixed order.
		at := now.Add(time.Millisecond + time.Duration(r.Int64N(int64(w.cfg.MaxDelay)*int64(time.Millisecond))))
		if m.from >= 0 && m.from < len(w.nodes) {
			if p := w.nodes[m.from].pausedUntil; p.After(now) {
				at = p.Add(at.Sub(now)) // a paused process sends when it resumes
			}
		}
		w.push(at, m)
	}
}

// fate is the source of a message's fortune on the network (lost or not,
// its delay): a function of the seed, the message, and how many like it
// were sent before, not of the order in which goroutines sent it. Where
// the roles' goroutines race (a notice batch taking one notice or two), the
// schedule differs by what the race changed, not in every later message.
func (w *world) fate(m *message) *rand.Rand {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d>%d:%s", m.from, m.to, m.desc)
	k := h.Sum64()
	w.seen[k]++
	return rand.New(rand.NewPCG(w.cfg.Seed^k, w.seen[k]))
}

func (w *world) isCut(from, to int) bool {
	// A client reaches an agent, and hears from it, unless the agent is
	// cut from everyone.
	if from < 0 {
		from = to
	}
	if to < 0 {
		to = from
	}
	return w.cut[from][to]
}

func (w *world) push(at time.Time, m *message) {
	w.seq++
	heap.Push(&w.q, &delivery{at: at, seq: w.seq, m: m})
}

// deliver hands m to its receiver: a request runs its handler there in a
// goroutine of the receiver's process, an answer wakes its caller.
func (w *world) deliver(d *delivery) {
	m := d.m
	if m.to >= 0 && m.to < len(w.nodes) {
		nd := w.nodes[m.to]
		if p := nd.pausedUntil; p.After(d.at) {
			w.push(p, m) // a paused process reads it when it resumes
			return
		}
		if !nd.alive {
			w.logf("refused %s -> %s: %s", w.name(m.from), w.name(m.to), m.desc)
			if !m.isAns {
				w.send(&message{from: m.to, to: m.from, desc: "refusal of " + m.desc + ": refused", reply: m.reply, answer: notSent{}, isAns: true})
			}
			return
		}
	}
	if m.isAns {
		m.reply <- m.answer
		return
	}
	if w.killAtNameWrite(m) {
		return
	}
	ctx, gen := context.Background(), 0
	if m.to >= 0 && m.to < len(w.nodes) {
		ctx, gen = w.nodes[m.to].ctx, w.nodes[m.to].gen
	}
	ctx, cancel := context.WithCancel(ctx)
	w.mu.Lock()
	gaveUp := m.gaveUp
	m.cancel = cancel
	w.mu.Unlock()
	if gaveUp {
		w.logf("%s -> %s: %s (its caller gave up)", w.name(m.from), w.name(m.to), m.desc)
		cancel()
	} else {
		w.logf("%s -> %s: %s", w.name(m.from), w.name(m.to), m.desc)
	}
	// A registry that applied a command may lose its answer with its
	// leader: drawn here, by the driver, so the schedule stays the seed's.
	lost := m.to == len(w.nodes) && w.faulty.Load() && w.fate(m).Float64() < w.cfg.RegUncertain
	go func() {
		a := m.handle(ctx)
		cancel()
		if _, none := a.(noReply); none || lost {
			return
		}
		if !w.current(m.to, gen) {
			return // its process died before it answered
		}
		w.send(&message{from: m.to, to: m.from, gen: gen, desc: "answer to " + m.desc + ": " + answerText(a), reply: m.reply, answer: a, isAns: true})
	}()
}

// killAtNameWrite kills, by the schedule's draw, the node whose hold
// (Config.KillAtHold) or release (Config.KillAtRelease) of a claim ID m
// is as it reaches the registry, and reports whether that write is lost
// with it (never applied).
func (w *world) killAtNameWrite(m *message) bool {
	if m.to != len(w.nodes) || m.from < 0 || m.from >= len(w.nodes) || !w.faulty.Load() {
		return false
	}
	chance, release := 0.0, false
	switch {
	case strings.HasPrefix(m.desc, "registry hold "):
		chance = w.cfg.KillAtHold
	case strings.HasPrefix(m.desc, "registry release "):
		chance, release = w.cfg.KillAtRelease, true
	}
	if chance == 0 {
		return false
	}
	f := w.fate(m)
	nd := w.nodes[m.from]
	if f.Float64() >= chance || !nd.alive || !w.current(m.from, m.gen) {
		return false
	}
	lost := f.IntN(2) == 0
	dur := time.Duration(500+f.Int64N(5_000)) * time.Millisecond
	w.logf("FAULT kill %s as its %s reaches the registry (lost: %v), for %v", nd.name, m.desc, lost, dur)
	if release {
		w.killedAtRelease++
		if lost {
			w.releasesLost++
		}
	}
	w.killFor(nd, dur)
	return lost
}

// runUntil drives the schedule up to end: after every step it waits until
// every goroutine of the bubble is blocked, takes what they sent, and
// delivers the earliest message or runs the earliest plan, letting the
// virtual clock run to it.
func (w *world) runUntil(end time.Time) {
	for {
		synctest.Wait()
		w.absorb()
		slices.SortStableFunc(w.plans, func(a, b timed) int { return a.at.Compare(b.at) })
		next := end
		if len(w.q) > 0 && w.q[0].at.Before(next) {
			next = w.q[0].at
		}
		if len(w.plans) > 0 && w.plans[0].at.Before(next) {
			next = w.plans[0].at
		}
		if now := time.Now(); next.After(now) {
			t := time.NewTimer(next.Sub(now))
			select {
			case <-t.C:
			case <-w.wake:
				t.Stop()
				continue // something was sent meanwhile: take it first
			}
		}
		now := time.Now()
		switch {
		case len(w.plans) > 0 && !w.plans[0].at.After(now):
			p := w.plans[0]
			w.plans = w.plans[1:]
			p.fn()
		case len(w.q) > 0 && !w.q[0].at.After(now):
			w.deliver(heap.Pop(&w.q).(*delivery))
		case !now.Before(end):
			return
		}
	}
}

func (w *world) traceText() string {
	w.traceMu.Lock()
	defer w.traceMu.Unlock()
	return strings.Join(w.trace, "\n")
}
