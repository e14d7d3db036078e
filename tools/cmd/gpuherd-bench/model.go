package main

import (
	"fmt"
	"io"
	"math"
	"time"

	"github.com/gpuherd/gpuherd/tools/internal/gossipsim"
)

// modelConfig is the -model phase: tools/internal/gossipsim at each size.
type modelConfig struct {
	sizes   []int
	changes int           // measured changes per size
	churn   time.Duration // mean time between two capacity changes of one server
	seed    uint64
}

// modelResult is the model at one size.
type modelResult struct {
	n        int
	unloaded gossipsim.Spread // one change at a time
	loaded   gossipsim.Spread // with every server changing once per churn
	limit    int              // retransmissions per message
	perChg   float64          // gossip bytes per member per change, rebroadcasts included
	gossipBs float64          // bytes/s per member of the churn's gossip (loaded run)
	probeBs  float64          // bytes/s per member of probes (computed)
	pushBs   float64          // bytes/s per member of push/pull (computed)
	maxQueue int              // longest broadcast queue in the loaded run
}

// Wire sizes the traffic model adds to the simulated gossip, from
// memberlist's encoding (msgpack) of its messages with gpuherd's names and
// summaries: a ping (sequence number, target name, source address, port
// and name) and its ack; and one member's entry in a push/pull exchange
// (name, address, port, summary, incarnation, state, versions).
const (
	pingBytes      = 80
	ackBytes       = 20
	pushEntryExtra = 80 // beside the summary
)

// pushPullEvery is memberlist's pushPullScale of the LAN's 30 s.
func pushPullEvery(n int) time.Duration {
	const base, threshold = 30 * time.Second, 32
	if n <= threshold {
		return base
	}
	return time.Duration(math.Ceil(math.Log2(float64(n))-math.Log2(threshold))+1) * base
}

func runModel(c modelConfig, metaSize int) []modelResult {
	var out []modelResult
	for _, n := range c.sizes {
		progress("gossip model: %d members", n)
		p := gossipsim.DefaultParams(n)
		p.Seed = c.seed
		if metaSize > 0 {
			p.MsgBytes = metaSize + 75
		}
		r := modelResult{n: n, limit: p.RetransmitLimit()}
		un := gossipsim.Run(p, c.changes, 15*time.Second)
		r.unloaded = un.Median()
		r.perChg = float64(un.Bytes) / float64(n) / float64(max(c.changes, 1))
		if c.churn > 0 {
			lp := p
			lp.Background = float64(n) / c.churn.Seconds()
			// Warm-up as long as the last rebroadcast, then long enough for
			// about 200 background changes (30 s at least); the changes
			// timed are in it too (a few percent of the bytes).
			lp.CountFrom = 12 * time.Second
			lp.Duration = lp.CountFrom + max(30*time.Second, time.Duration(200/lp.Background*float64(time.Second)))
			ld := gossipsim.Run(lp, c.changes, 5*time.Second)
			r.loaded = ld.Median()
			r.maxQueue = ld.MaxQueue
			r.gossipBs = float64(ld.Bytes) / float64(n) / ld.Duration.Seconds()
		}
		r.probeBs = pingBytes + ackBytes
		r.pushBs = 2 * float64(n) * float64(p.MsgBytes-75+pushEntryExtra) / pushPullEvery(n).Seconds()
		out = append(out, r)
	}
	return out
}

// reportModel prints the model against the in-memory runs of the same
// sizes, then the model alone.
func reportModel(w io.Writer, c modelConfig, rs []modelResult, mocks []mockResult) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	byN := map[int]mockResult{}
	for _, m := range mocks {
		byN[m.n] = m
	}
	p("## Gossip model against the in-memory runs\n\n")
	p("Model: tools/internal/gossipsim, memberlist's LAN settings (a gossip round every 200 ms to 3 members, each message sent RetransmitMult × ⌈log10(N+1)⌉ times, 1,400-byte packets, fewest transmissions first) and gpuherd's publisher (at once, again after 2 s and 10 s), a hop taking 1 ms, infinite CPU. Measured: gossip.Cluster members on the in-memory transport, median of the changes. Error = (model − measured) / measured.\n\n")
	t := table{head: []string{"members", "50% model ms", "50% measured", "error", "99% model ms", "99% measured", "error", "100% model ms", "100% measured", "error", "bytes/member/change model", "measured"}}
	errOf := func(model, meas time.Duration) string {
		if model < 0 || meas <= 0 {
			return "-"
		}
		e := math.Round(100 * (float64(model) - float64(meas)) / float64(meas))
		if e == 0 {
			return "0%" // not "-0%"
		}
		return fmt.Sprintf("%+.0f%%", e)
	}
	for _, r := range rs {
		m, ok := byN[r.n]
		if !ok {
			continue
		}
		s := mergeSpreads(m.changes)
		t.add(fmt.Sprint(r.n), ms1(r.unloaded.P50), ms(s.p50), errOf(r.unloaded.P50, s.p50),
			ms1(r.unloaded.P99), ms(s.p99), errOf(r.unloaded.P99, s.p99),
			ms1(r.unloaded.All), ms(s.all), errOf(r.unloaded.All, s.all),
			fmt.Sprintf("%.0f", r.perChg), fmt.Sprintf("%.0f", m.changeBytes()))
	}
	p("%s\n", t.String())

	p("## Gossip model: 1,000 and 10,000 servers\n\n")
	p("Unloaded: one change at a time. Loaded: every server's capacity changes once per %v on average (Poisson, each change rebroadcast at 2 s and 10 s), sharing the broadcast queues with the changes timed (after a 12 s warm-up). \"never\": some members had not seen the change when its last rebroadcast had run out (they get it from push/pull). Bytes per second per server, sent (received is the same on average): gossip simulated under that load; probes (%d-byte ping, %d-byte ack, once a second) and push/pull (every member's entry, %d bytes of it beside the summary, both ways, every %s) computed.\n\n",
		c.churn, pingBytes, ackBytes, pushEntryExtra, "30 s × (⌈log2 N − 5⌉ + 1)")
	t = table{head: []string{"members", "retransmits", "push/pull every", "50% ms", "99% ms", "100% ms", "loaded 50% / 99% / 100% ms", "longest queue", "gossip B/s", "probes B/s", "push/pull B/s", "total B/s per server", "bytes per change per server"}}
	for _, r := range rs {
		loaded := "-"
		if c.churn > 0 {
			loaded = fmt.Sprintf("%s / %s / %s", ms1(r.loaded.P50), ms1(r.loaded.P99), ms1(r.loaded.All))
		}
		t.add(fmt.Sprint(r.n), fmt.Sprint(r.limit), pushPullEvery(r.n).String(), ms1(r.unloaded.P50), ms1(r.unloaded.P99), ms1(r.unloaded.All),
			loaded, fmt.Sprint(r.maxQueue), fmt.Sprintf("%.0f", r.gossipBs), fmt.Sprintf("%.0f", r.probeBs), fmt.Sprintf("%.0f", r.pushBs),
			fmt.Sprintf("%.0f", r.gossipBs+r.probeBs+r.pushBs), fmt.Sprintf("%.0f", r.perChg))
	}
	p("%s\n", t.String())
}

// ms1 is a model's duration in ms; "never" when it did not get there.
func ms1(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return fmt.Sprintf("%.0f", float64(d)/1e6)
}

// reportMock prints what the in-memory clusters cost: formation, traffic
// idle and per change, CPU and memory per member.
func reportMock(w io.Writer, mocks []mockResult) {
	if len(mocks) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("## Gossip at scale: gossip.Cluster members on the in-memory transport\n\n")
	p("All members in this one process on 2 shared cores, memberlist's LAN timings; they joined in waves of %d (each through a member already in, the next wave once the receive queues drained). Bytes are what the members sent each other (datagrams and push/pull streams; no IP/UDP headers), per member. Per change: the traffic from the first timed change until its last rebroadcast, less the idle rate, per change. Memory: the process's live heap and RSS after a GC, divided by the members.\n\n", joinWave)
	t := table{head: []string{"members", "formed in", "CPU to form", "50% ms", "99% ms", "100% ms", "never seen", "idle B/s per member", "of it push/pull", "idle CPU per member", "bytes per change per member", "heap KiB per member", "RSS KiB per member"}}
	for _, m := range mocks {
		s := mergeSpreads(m.changes)
		join := m.join.Round(time.Millisecond).String()
		switch {
		case m.formedUpTo > 0:
			t.add(fmt.Sprint(m.n), fmt.Sprintf("not formed: gave up at %d members (two waves did not drain)", m.formedUpTo), m.joinCPU.Round(time.Second).String(), "", "", "", "", "", "", "", "", "", "")
			continue
		case m.join < 0:
			join = fmt.Sprintf("not formed (fewest alive seen: %d)", m.minAlive)
		}
		cpu := "-"
		if m.idleWin > 0 {
			cpu = fmt.Sprintf("%.3f%% of a core", 100*m.idleCPU.Seconds()/m.idleWin.Seconds()/float64(m.n))
		}
		t.add(fmt.Sprint(m.n), join, m.joinCPU.Round(time.Second).String(), ms(s.p50), ms(s.p99), ms(s.all), fmt.Sprint(s.missed),
			fmt.Sprintf("%.0f", perMember(m.idle, m.n, m.idleWin)),
			fmt.Sprintf("%.0f", perMember(traffic{streamBytes: m.idle.streamBytes}, m.n, m.idleWin)), cpu,
			fmt.Sprintf("%.0f", m.changeBytes()), fmt.Sprintf("%.0f", float64(m.heap)/1024/float64(m.n)), fmt.Sprintf("%.0f", float64(m.rss)/1024/float64(m.n)))
	}
	p("%s\n", t.String())
}

// plotScale writes scale-convergence.png (measured in-memory runs and the
// model, against log10 of the members) and scale-bytes.png (bytes per
// second per server).
func plotScale(o options, mocks []mockResult, models []modelResult) error {
	if len(mocks) == 0 && len(models) == 0 {
		return nil
	}
	lg := func(n int) float64 { return math.Log10(float64(n)) }
	var cs []curve
	for _, q := range []struct {
		label string
		f     func(spread) time.Duration
	}{{"50% measured", func(s spread) time.Duration { return s.p50 }}, {"99% measured", func(s spread) time.Duration { return s.p99 }}, {"100% measured", func(s spread) time.Duration { return s.all }}} {
		c := curve{label: q.label + " (in-memory)"}
		for _, m := range mocks {
			if d := q.f(mergeSpreads(m.changes)); d >= 0 {
				c.x, c.y = append(c.x, lg(m.n)), append(c.y, float64(d)/1e6)
			}
		}
		cs = append(cs, c)
	}
	for _, q := range []struct {
		label string
		f     func(gossipsim.Spread) time.Duration
	}{{"50% model", func(s gossipsim.Spread) time.Duration { return s.P50 }}, {"99% model", func(s gossipsim.Spread) time.Duration { return s.P99 }}, {"100% model", func(s gossipsim.Spread) time.Duration { return s.All }}} {
		c := curve{label: q.label}
		for _, r := range models {
			if d := q.f(r.unloaded); d >= 0 {
				c.x, c.y = append(c.x, lg(r.n)), append(c.y, float64(d)/1e6)
			}
		}
		cs = append(cs, c)
	}
	if err := plotCurves(pngPath(o.out, "scale-convergence.png"), "Capacity change seen by the members: measured and modelled", "members (log10)", "time (ms)", cs, false); err != nil {
		return err
	}
	meas := curve{label: "idle, measured (in-memory)"}
	for _, m := range mocks {
		if m.idleWin > 0 {
			meas.x, meas.y = append(meas.x, lg(m.n)), append(meas.y, perMember(m.idle, m.n, m.idleWin)/1024)
		}
	}
	idle := curve{label: "idle, model (probes + push/pull)"}
	total := curve{label: fmt.Sprintf("model, a change per server every %v", o.model.churn)}
	for _, r := range models {
		idle.x, idle.y = append(idle.x, lg(r.n)), append(idle.y, (r.probeBs+r.pushBs)/1024)
		total.x, total.y = append(total.x, lg(r.n)), append(total.y, (r.gossipBs+r.probeBs+r.pushBs)/1024)
	}
	return plotCurves(pngPath(o.out, "scale-bytes.png"), "Gossip traffic sent per server", "members (log10)", "KiB/s per server", []curve{meas, idle, total}, true)
}
