package main

import (
	"fmt"
	"io"
	"slices"
)

// reportScaleCost puts a claim's cost side by side at every size measured
// or modelled: the requests, raft appends and fsyncs measured with full
// agents (constant in N, so the largest size measured stands for the sizes
// beyond), and the gossip its capacity change costs the whole cluster — a
// claim and its release are two changes of the owner's summary, each
// advertised three times (at once, after 2 s and after 10 s) — measured on
// the in-memory members where they ran, modelled elsewhere.
func reportScaleCost(w io.Writer, costs []*costResult, models []modelResult, mocks []mockResult) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	type row struct {
		n                     int
		peer, appends, fsyncs float64
		counted               string
		gossip, gossipPer     float64
		gossipFrom            string
		haveCount, haveGossip bool
	}
	rows := map[int]*row{}
	get := func(n int) *row {
		if rows[n] == nil {
			rows[n] = &row{n: n}
		}
		return rows[n]
	}
	largest := -1
	for i, c := range costs {
		ops := c.ops[opClaim]
		if c.err != nil || len(ops) == 0 {
			continue
		}
		r := get(c.n)
		for _, o := range ops {
			r.peer += float64(o.peer)
			r.appends += float64(o.appends)
			r.fsyncs += float64(o.ledger + o.store)
		}
		k := float64(len(ops))
		r.peer, r.appends, r.fsyncs = r.peer/k, r.appends/k, r.fsyncs/k
		r.counted, r.haveCount = "measured", true
		if largest < 0 || c.n > costs[largest].n {
			largest = i
		}
	}
	for _, m := range mocks {
		if b := m.changeBytes(); b > 0 {
			r := get(m.n)
			r.gossipPer, r.gossip, r.gossipFrom, r.haveGossip = 2*b, 2*b*float64(m.n), "measured (in-memory members)", true
		}
	}
	for _, mr := range models {
		r := get(mr.n)
		if !r.haveGossip {
			r.gossipPer, r.gossip, r.gossipFrom, r.haveGossip = 2*mr.perChg, 2*mr.perChg*float64(mr.n), "model", true
		}
	}
	var ns []int
	for n := range rows {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	p("## Cost of a claim at scale\n\n")
	p("Per claim and its release: peer API requests, raft AppendEntries and fsyncs of the claim (measured with full agents, see the cost table; constant in N, so sizes beyond the largest measured take its figures, marked \"as at N\"), and the gossip of the owner's two capacity changes (claim and release), each advertised three times, summed over all members.\n\n")
	t := table{head: []string{"servers", "peer requests", "AppendEntries", "fsyncs", "counts", "gossip bytes, whole cluster", "gossip bytes per server", "gossip"}}
	for _, n := range ns {
		r := rows[n]
		if !r.haveCount && largest >= 0 && n > costs[largest].n {
			src := rows[costs[largest].n]
			r.peer, r.appends, r.fsyncs, r.counted, r.haveCount = src.peer, src.appends, src.fsyncs, fmt.Sprintf("as at %d", costs[largest].n), true
		}
		if !r.haveCount && !r.haveGossip {
			continue
		}
		cnt := []string{"-", "-", "-", "-"}
		if r.haveCount {
			cnt = []string{fmt.Sprintf("%.2f", r.peer), fmt.Sprintf("%.2f", r.appends), fmt.Sprintf("%.2f", r.fsyncs), r.counted}
		}
		g := []string{"-", "-", "-"}
		if r.haveGossip {
			g = []string{fmt.Sprintf("%.0f", r.gossip), fmt.Sprintf("%.0f", r.gossipPer), r.gossipFrom}
		}
		t.add(append(append([]string{fmt.Sprint(n)}, cnt...), g...)...)
	}
	p("%s\n", t.String())
}
