package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// meanMax is the mean and the largest of one figure over a sample.
type meanMax struct {
	mean float64
	max  int
}

func (x meanMax) String() string { return fmt.Sprintf("%.2f (%d)", x.mean, x.max) }

func figure(ss []opSample, f func(opSample) int) meanMax {
	var out meanMax
	for _, s := range ss {
		v := f(s)
		out.mean += float64(v)
		out.max = max(out.max, v)
	}
	if len(ss) > 0 {
		out.mean /= float64(len(ss))
	}
	return out
}

// costFigures are the figures of one operation kind at one size.
type costFigures struct {
	peer, redirects, appends, ledger, store, fsyncs meanMax
	p50                                             time.Duration
}

func (r *costResult) figures(k opKind) costFigures { return figuresOf(r.ops[k]) }

func figuresOf(ss []opSample) costFigures {
	var took durations
	for _, s := range ss {
		took = append(took, s.took)
	}
	return costFigures{
		peer:      figure(ss, func(s opSample) int { return s.peer }),
		redirects: figure(ss, func(s opSample) int { return s.redirects }),
		appends:   figure(ss, func(s opSample) int { return s.appends }),
		ledger:    figure(ss, func(s opSample) int { return s.ledger }),
		store:     figure(ss, func(s opSample) int { return s.store }),
		fsyncs:    figure(ss, opSample.fsyncs),
		p50:       took.pct(50),
	}
}

// reportCost prints the cost per operation: the table of figures per size,
// the requests by path, and the background.
func reportCost(w io.Writer, cc costConfig, rs []*costResult) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("## Cost per operation\n\n")
	p("Full agents in one process on the in-memory peer network and gossip; the name registry with three voters (raft over mutual TLS on loopback, logs on disk), every other agent forwarding to the leader over the peer API. %d claims of 1 GPU, each followed by a get and a release of its ID, every operation through a random agent and measured alone until nothing it caused moved for %v. Mean per operation, the largest in parentheses; an operation answered a retryable 503 is retried (through a random agent again, as a client would) and the retry shown on a row of its own. Peer API requests and raft RPCs are those naming the operation's claim ID; fsyncs are every committed write transaction of every ledger and every voter's raft store. Gossip, raft heartbeats and the owners' anti-entropy passes are not per operation and not counted here (background below).\n\n", cc.ops, cc.quiet)
	t := table{head: []string{"servers", "operation", "peer API requests", "of which redirects", "raft AppendEntries", "fsyncs: ledgers", "fsyncs: registry", "fsyncs: all", "p50 ms"}}
	for k := range opKinds {
		s := stated[k]
		t.add("stated", k.String(), fmt.Sprintf("≤ %d", s.peer), "0", fmt.Sprint(s.appends), fmt.Sprint(s.ledger), fmt.Sprint(s.store), fmt.Sprint(s.fsyncs()), "")
	}
	for _, r := range rs {
		if r.err != nil {
			t.add(fmt.Sprint(r.n), "not measured: "+r.err.Error(), "", "", "", "", "", "", "")
			continue
		}
		for k := range opKinds {
			f := r.figures(k)
			t.add(fmt.Sprint(r.n), k.String(), f.peer.String(), f.redirects.String(), f.appends.String(), f.ledger.String(), f.store.String(), f.fsyncs.String(), ms(f.p50))
		}
		for k := range opKinds {
			if rt := r.retried[k]; len(rt) > 0 {
				f := figuresOf(rt)
				t.add(fmt.Sprint(r.n), fmt.Sprintf("%s retried after a 503 (%d)", k, len(rt)), f.peer.String(), f.redirects.String(), f.appends.String(), f.ledger.String(), f.store.String(), f.fsyncs.String(), ms(f.p50))
			}
		}
	}
	p("%s\n", t.String())

	var ok []*costResult
	for _, r := range rs {
		if r.err == nil {
			ok = append(ok, r)
		}
	}
	if len(ok) == 0 {
		return
	}
	p("Peer API requests per operation, by request (mean):\n\n")
	head := []string{"operation", "request"}
	for _, r := range ok {
		head = append(head, fmt.Sprintf("%d servers", r.n))
	}
	t = table{head: head}
	for k := range opKinds {
		paths := map[string]bool{}
		for _, r := range ok {
			for path := range r.paths[k] {
				paths[path] = true
			}
		}
		for _, path := range slices.Sorted(maps.Keys(paths)) {
			row := []string{k.String(), "`" + path + "`"}
			for _, r := range ok {
				row = append(row, fmt.Sprintf("%.2f", float64(r.paths[k][path])/float64(max(1, len(r.ops[k])))))
			}
			t.add(row...)
		}
	}
	p("%s\n", t.String())

	p("Background: what ran beside the operations, per second over the measuring phase (not per operation, and not in the figures above):\n\n")
	t = table{head: []string{"servers", "registry voters", "gossip and raft timers", "agents started in", "all saw all after", "process RSS MiB", "measuring phase", "peer API requests/s naming no measured ID", "raft AppendEntries/s without entries", "windows closed at 5 s", "raft appends not naming the ID", "operations left out: registry election, or a 503 retried"}}
	for _, r := range ok {
		t.add(fmt.Sprint(r.n), strings.Join(r.voters, " "), fmt.Sprintf("×%d", r.scale), r.startup.Round(time.Millisecond).String(), r.converge.Round(time.Millisecond).String(),
			fmt.Sprintf("%.0f", float64(r.rss)/(1<<20)), r.phase.Round(time.Second).String(), fmt.Sprintf("%.1f", r.bg.peer), fmt.Sprintf("%.1f", r.bg.beats),
			fmt.Sprint(r.unsettled), fmt.Sprint(r.strayAppends), fmt.Sprint(r.leftOut))
	}
	p("%s\n", t.String())

	p("Background requests by request, per second over the measuring phase:\n\n")
	head = []string{"request"}
	paths := map[string]bool{}
	for _, r := range ok {
		head = append(head, fmt.Sprintf("%d servers", r.n))
		for path := range r.bgPaths {
			paths[path] = true
		}
	}
	t = table{head: head}
	for _, path := range slices.Sorted(maps.Keys(paths)) {
		row := []string{"`" + path + "`"}
		for _, r := range ok {
			row = append(row, fmt.Sprintf("%.2f", float64(r.bgPaths[path])/r.phase.Seconds()))
		}
		t.add(row...)
	}
	p("%s\n", t.String())
}
