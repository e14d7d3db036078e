// Package gossipsim is a seeded, event-driven model of how a capacity
// change spreads through memberlist's broadcast gossip as gpuherd uses it
// (LAN preset, memberlist v0.7.0), for cluster sizes one machine cannot
// run: 1,000 and 10,000 members.
//
// What it models, from memberlist's source:
//
//   - Every member gossips every GossipInterval, at its own phase, to
//     GossipNodes distinct random other members; for each target it takes
//     pending messages from its broadcast queue, fewest transmissions first
//     (the newest first among equals), as many as fit in one
//     UDPBufferSize packet, and counts one transmission for each.
//   - Every ProbeInterval a member pings one random member, which acks;
//     both packets carry pending messages in the room they have left
//     (memberlist's sendMsg piggybacks broadcasts on every message).
//   - A message is dropped from a member's queue after RetransmitMult ×
//     ⌈log10(N+1)⌉ transmissions.
//   - A member that receives a newer summary of a member (a new incarnation
//     of its alive message) queues it itself, which replaces the older one
//     of that member in its queue; an old or duplicate one is ignored.
//   - gpuherd's publisher advertises a change at once (UpdateNode) and again
//     after each delay of Rebroadcast, each time as a new incarnation.
//   - The queue is unbounded (v0.7.0 prunes nothing), at most one message
//     per member.
//
// What it does not model: probes and push/pull are not simulated but
// added as bytes (Traffic); CPU is infinite (a hop takes Latency); nothing
// fails.
package gossipsim

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Params are memberlist's and gpuherd's settings. DefaultParams holds the
// production ones.
type Params struct {
	N              int
	GossipInterval time.Duration
	GossipNodes    int
	// ProbeInterval is memberlist's failure-detector round: a ping to one
	// random member, answered by an ack; both carry pending messages in
	// the room their packet has left (piggybacking). 0: no probes.
	ProbeInterval  time.Duration
	RetransmitMult int
	PacketBytes    int           // UDPBufferSize: a gossip packet's payload at most
	MsgBytes       int           // one alive message: the summary plus name, address, incarnation
	Latency        time.Duration // from a send to the receiver having it
	Rebroadcast    []time.Duration
	Loss           float64 // share of packets lost
	// Background is the rate of other members' changes (per second, the
	// whole cluster), which share the queues with the changes measured.
	Background float64
	// CountFrom leaves the bytes sent before it out of Result's counts (a
	// warm-up, while the background fills the queues); the changes timed
	// start then too. Duration, when longer, is how long the run goes on.
	CountFrom, Duration time.Duration
	Seed                uint64
}

// DefaultParams are the production settings at n members: memberlist's LAN
// preset and gpuherd's summary (94 bytes for a three-model server, 75 more
// for the alive message around it) and rebroadcasts.
func DefaultParams(n int) Params {
	return Params{
		N:              n,
		GossipInterval: 200 * time.Millisecond,
		GossipNodes:    3,
		ProbeInterval:  time.Second,
		RetransmitMult: 4,
		PacketBytes:    1400,
		MsgBytes:       94 + 75,
		Latency:        time.Millisecond,
		Rebroadcast:    []time.Duration{2 * time.Second, 10 * time.Second},
		Seed:           1,
	}
}

// RetransmitLimit is memberlist's retransmitLimit: RetransmitMult ×
// ⌈log10(N+1)⌉.
func (p Params) RetransmitLimit() int {
	return p.RetransmitMult * int(math.Ceil(math.Log10(float64(p.N+1))))
}

// Spread is how long one change took to be seen by 50%, 99% and all of the
// other members, and how many never saw it.
type Spread struct {
	P50, P99, All time.Duration // -1: not reached
	Missed        int
}

// Result is what Run measured.
type Result struct {
	Changes []Spread
	// Sent is everything the gossip sent over the run: packets and bytes
	// (a compound packet's header included), for the measured changes,
	// their rebroadcasts and the background.
	Packets, Bytes int64
	Duration       time.Duration // simulated time they were counted over
	// MaxQueue is the longest broadcast queue any member had.
	MaxQueue int
}

// Median is the median over the changes of each figure.
func (r Result) Median() Spread {
	if len(r.Changes) == 0 {
		return Spread{P50: -1, P99: -1, All: -1}
	}
	med := func(f func(Spread) time.Duration) time.Duration {
		v := make([]time.Duration, len(r.Changes))
		for i, s := range r.Changes {
			v[i] = f(s)
			if v[i] < 0 {
				v[i] = math.MaxInt64
			}
		}
		slices.Sort(v)
		if x := v[len(v)/2]; x != math.MaxInt64 {
			return x
		}
		return -1
	}
	out := Spread{P50: med(func(s Spread) time.Duration { return s.P50 }),
		P99: med(func(s Spread) time.Duration { return s.P99 }),
		All: med(func(s Spread) time.Duration { return s.All })}
	for _, s := range r.Changes {
		out.Missed += s.Missed
	}
	return out
}

// event kinds
const (
	evTick    = iota // a member's gossip round
	evDeliver        // a packet arrives
	evChange         // a member publishes a new summary
	evProbe          // a member pings another
	evAck            // a ping arrives: deliver what it carried, answer
)

type event struct {
	at   time.Duration
	kind int
	node int32
	msgs []msg // evDeliver
	src  int   // evChange: measured, background or rebroadcast
	seq  int64 // tie-break, for a deterministic order
}

// sources of a change
const (
	measured = iota
	background
	rebroadcast
)

type events []event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if e[i].at != e[j].at {
		return e[i].at < e[j].at
	}
	return e[i].seq < e[j].seq
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

// msg is one alive message: a member's summary at an incarnation.
type msg struct {
	owner int32
	inc   int32
}

// queued is a message in a member's broadcast queue.
type queued struct {
	msg
	sent int
	id   int64 // insertion order: newer first among equal transmissions
}

// member is one member's state: the newest incarnation it knows of each
// member, and its broadcast queue, bucketed by transmissions so far (each
// bucket a stack: the newest first).
type member struct {
	known   map[int32]int32 // members that changed during the run only
	buckets [][]*queued
	inHand  map[int32]*queued // owner → its message in the queue
}

// tracked is a measured change: who published it at which incarnation.
type tracked struct {
	owner int32
	inc   int32
	at    time.Duration
	seen  []time.Duration // per member, -1 until seen
	count int
}

// Run simulates changes measured changes, one every spacing, each by a
// different member, and returns how each spread. It runs until the last
// change's last rebroadcast has died out.
func Run(p Params, changes int, spacing time.Duration) Result {
	r := rand.New(rand.NewPCG(p.Seed, uint64(p.N)))
	n := p.N
	limit := p.RetransmitLimit()
	ms := make([]member, n)
	incs := make([]int32, n) // each member's own incarnation
	var h events
	var seq, idGen int64
	push := func(e event) {
		seq++
		e.seq = seq
		heap.Push(&h, e)
	}
	for i := range n {
		ms[i].known = map[int32]int32{}
		ms[i].inHand = map[int32]*queued{}
		push(event{at: time.Duration(r.Int64N(int64(p.GossipInterval))), kind: evTick, node: int32(i)})
		if p.ProbeInterval > 0 {
			push(event{at: time.Duration(r.Int64N(int64(p.ProbeInterval))), kind: evProbe, node: int32(i)})
		}
	}
	var tr []*tracked
	byMsg := map[msg]*tracked{}
	owners := r.Perm(n)
	for k := range changes {
		push(event{at: p.CountFrom + time.Duration(k)*spacing, kind: evChange, node: int32(owners[k%n]), src: measured})
	}
	end := p.CountFrom + time.Duration(max(changes-1, 0))*spacing + lastRebroadcast(p) + 30*p.GossipInterval
	end = max(end, p.Duration)
	if p.Background > 0 {
		for t := time.Duration(0); ; {
			t += time.Duration(r.ExpFloat64() / p.Background * float64(time.Second))
			if t >= end {
				break
			}
			push(event{at: t, kind: evChange, node: int32(r.IntN(n)), src: background})
		}
	}
	var res Result
	enqueue := func(at int32, m msg) {
		mb := &ms[at]
		if old := mb.inHand[m.owner]; old != nil {
			old.sent = -1 // invalidated: skipped and dropped
		}
		idGen++
		q := &queued{msg: m, id: idGen}
		if len(mb.buckets) == 0 {
			mb.buckets = make([][]*queued, limit)
		}
		mb.buckets[0] = append(mb.buckets[0], q)
		mb.inHand[m.owner] = q
		res.MaxQueue = max(res.MaxQueue, len(mb.inHand))
	}
	receive := func(at int32, m msg, t time.Duration) {
		mb := &ms[at]
		if mb.known[m.owner] >= m.inc {
			return
		}
		mb.known[m.owner] = m.inc
		if c := byMsg[m]; c != nil && c.seen[at] < 0 {
			c.seen[at] = t - c.at
			c.count++
		}
		if m.owner != at {
			enqueue(at, m)
		}
	}
	per := (p.PacketBytes - 2) / (p.MsgBytes + 2) // compound: 1+1 header, 2 bytes per message length
	per = max(per, 1)
	// What fits beside a ping or an ack (about 100 bytes with its header).
	pingRoom := max((p.PacketBytes-100)/(p.MsgBytes+2), 1)
	publish := func(node int32, t time.Duration, track bool) {
		incs[node]++
		m := msg{owner: node, inc: incs[node]}
		if track {
			c := &tracked{owner: node, inc: m.inc, at: t, seen: make([]time.Duration, n)}
			for i := range c.seen {
				c.seen[i] = -1
			}
			tr = append(tr, c)
			byMsg[m] = c
		}
		ms[node].known[node] = m.inc
		enqueue(node, m)
	}
	// count adds a packet's messages to the traffic; a piggybacked batch
	// adds no packet of its own (the ping or ack is counted as a probe).
	count := func(at time.Duration, batch []msg, piggy bool) {
		if at < p.CountFrom || len(batch) == 0 {
			return
		}
		b := len(batch) * p.MsgBytes
		if !piggy {
			res.Packets++
			if len(batch) > 1 {
				b += 2 + 2*len(batch)
			}
		} else {
			b += 2 * len(batch)
		}
		res.Bytes += int64(b)
	}
	rebroadcastAt := func(node int32, t time.Duration) {
		for _, d := range p.Rebroadcast {
			push(event{at: t + d, kind: evChange, node: node, src: rebroadcast})
		}
	}
	for h.Len() > 0 {
		e := heap.Pop(&h).(event)
		if e.at > end {
			break
		}
		switch e.kind {
		case evChange:
			publish(e.node, e.at, e.src == measured)
			if e.src != rebroadcast {
				rebroadcastAt(e.node, e.at)
			}
		case evDeliver:
			for _, m := range e.msgs {
				receive(e.node, m, e.at)
			}
		case evProbe:
			push(event{at: e.at + p.ProbeInterval, kind: evProbe, node: e.node})
			to := pickTargets(r, n, int(e.node), 1)[0]
			batch := take(&ms[e.node], pingRoom, limit)
			count(e.at, batch, true)
			push(event{at: e.at + p.Latency, kind: evAck, node: int32(to), msgs: batch, src: int(e.node)})
		case evAck:
			for _, m := range e.msgs {
				receive(e.node, m, e.at)
			}
			batch := take(&ms[e.node], pingRoom, limit)
			count(e.at, batch, true)
			if len(batch) > 0 {
				push(event{at: e.at + p.Latency, kind: evDeliver, node: int32(e.src), msgs: batch})
			}
		case evTick:
			push(event{at: e.at + p.GossipInterval, kind: evTick, node: e.node})
			mb := &ms[e.node]
			if len(mb.inHand) == 0 {
				continue
			}
			// memberlist gossips to up to GossipNodes distinct others and
			// stops at the first target it has nothing for.
			targets := pickTargets(r, n, int(e.node), p.GossipNodes)
			for _, to := range targets {
				batch := take(mb, per, limit)
				if len(batch) == 0 {
					break
				}
				count(e.at, batch, false)
				if p.Loss > 0 && r.Float64() < p.Loss {
					continue
				}
				push(event{at: e.at + p.Latency, kind: evDeliver, node: int32(to), msgs: batch})
			}
		}
	}
	res.Duration = end - min(p.CountFrom, end)
	for _, c := range tr {
		res.Changes = append(res.Changes, spreadOf(c, n))
	}
	return res
}

// take removes up to per messages from mb's queue for one packet, fewest
// transmissions first, counts a transmission for each, and puts back those
// below limit.
func take(mb *member, per, limit int) []msg {
	var out []msg
	var again []*queued
	for t := 0; t < len(mb.buckets) && len(out) < per; t++ {
		b := mb.buckets[t]
		for len(b) > 0 && len(out) < per {
			q := b[len(b)-1]
			b = b[:len(b)-1]
			if q.sent < 0 {
				continue
			}
			out = append(out, q.msg)
			q.sent++
			if q.sent >= limit {
				delete(mb.inHand, q.owner)
				continue
			}
			again = append(again, q)
		}
		mb.buckets[t] = b
	}
	// Back in reverse order, so the newest is on top again.
	for i := len(again) - 1; i >= 0; i-- {
		q := again[i]
		mb.buckets[q.sent] = append(mb.buckets[q.sent], q)
	}
	return out
}

// pickTargets is k distinct members other than self, at random.
func pickTargets(r *rand.Rand, n, self, k int) []int {
	k = min(k, n-1)
	out := make([]int, 0, k)
	for len(out) < k {
		c := r.IntN(n)
		if c != self && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

func lastRebroadcast(p Params) time.Duration {
	var d time.Duration
	for _, x := range p.Rebroadcast {
		d = max(d, x)
	}
	return d
}

// spreadOf is the 50%, 99% and 100% points of a change among the other
// members (the owner excluded).
func spreadOf(c *tracked, n int) Spread {
	var seen []time.Duration
	for i, d := range c.seen {
		if int32(i) != c.owner && d >= 0 {
			seen = append(seen, d)
		}
	}
	slices.Sort(seen)
	others := n - 1
	at := func(q float64) time.Duration {
		k := int(math.Ceil(q*float64(others))) - 1
		if k >= len(seen) || len(seen) == 0 {
			return -1
		}
		return seen[max(k, 0)]
	}
	return Spread{P50: at(0.5), P99: at(0.99), All: at(1), Missed: others - len(seen)}
}
