package main

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"time"
)

func pctOf(a, b int) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(a)/float64(b))
}

func report(w io.Writer, o options, fl floorResult, rs []*sizeResult, procs *procsResult, mocks []mockResult, took time.Duration) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	floor := fl.floor()
	p("# gpuherd-bench results\n\n")
	p("Machine: %d CPUs, %s/%s, %s. Seed %d. Run took %v.\n\n", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), o.seed, took.Round(time.Second))

	p("## Floor (measured in this run)\n\n")
	t := table{head: []string{"what", "p50 ms", "p99 ms"}}
	t.add("loopback HTTPS round trip, mutual TLS, warm connection", ms(fl.rtt.pct(50)), ms(fl.rtt.pct(99)))
	t.add("one bbolt Update (fsync) on the data disk", ms(fl.fsync.pct(50)), ms(fl.fsync.pct(99)))
	t.add("**floor = 2 round trips + 1 fsync**", ms(floor), "")
	p("%s\n", t.String())

	var focus *sizeResult
	for _, r := range rs {
		if r.n == o.focus {
			focus = r
		}
	}

	p("## Claim latency, unloaded (one claim of 1 GPU at a time; ratio to the floor)\n\n")
	t = table{head: []string{"agents", "GPUs", "system", "p50 ms", "p95 ms", "p99 ms", "p50 / floor", "p99 / floor"}}
	for _, r := range rs {
		if r.meshSkipped {
			t.add(fmt.Sprint(r.n), fmt.Sprint(r.gpus), "gpuherd (Agent.Claim): not run, see the open-file limit note", "", "", "", "", "")
			t.add(fmt.Sprint(r.n), "", "same protocol without the lookup (bench coordinator)", ms(r.seqView.pct(50)), ms(r.seqView.pct(95)), ms(r.seqView.pct(99)), ratioD(r.seqView.pct(50), floor), ratioD(r.seqView.pct(99), floor))
			continue
		}
		t.add(fmt.Sprint(r.n), fmt.Sprint(r.gpus), "gpuherd (Agent.Claim)", ms(r.seqAgent.pct(50)), ms(r.seqAgent.pct(95)), ms(r.seqAgent.pct(99)), ratioD(r.seqAgent.pct(50), floor), ratioD(r.seqAgent.pct(99), floor))
		t.add(fmt.Sprint(r.n), "", "Agent.Get of an unknown ID (the home says absent; every server confirms)", ms(r.lookup.pct(50)), ms(r.lookup.pct(95)), ms(r.lookup.pct(99)), ratioD(r.lookup.pct(50), floor), ratioD(r.lookup.pct(99), floor))
		t.add(fmt.Sprint(r.n), "", "same protocol without the lookup (bench coordinator)", ms(r.seqView.pct(50)), ms(r.seqView.pct(95)), ms(r.seqView.pct(99)), ratioD(r.seqView.pct(50), floor), ratioD(r.seqView.pct(99), floor))
		if r == focus && len(r.etcdSeq) > 0 {
			t.add(fmt.Sprint(r.n), "", "etcd central allocator (range read + txn)", ms(r.etcdSeq.pct(50)), ms(r.etcdSeq.pct(95)), ms(r.etcdSeq.pct(99)), ratioD(r.etcdSeq.pct(50), floor), ratioD(r.etcdSeq.pct(99), floor))
		}
	}
	if procs != nil {
		if procs.err != nil && len(procs.seq) == 0 {
			t.add(fmt.Sprint(procs.n), "", procsLabel+": "+procs.err.Error(), "", "", "", "", "")
		} else {
			t.add(fmt.Sprint(procs.n), "", procsLabel, ms(procs.seq.pct(50)), ms(procs.seq.pct(95)), ms(procs.seq.pct(99)), ratioD(procs.seq.pct(50), floor), ratioD(procs.seq.pct(99), floor))
		}
	}
	p("%s\n", t.String())
	for _, r := range rs {
		if !r.meshSkipped {
			p("Claim-ID lookups of the Agent.Claim phases at %d agents (claims, gets, releases): %s answered by this server or the ID's home, %s asked every server.\n", r.n,
				pctOf(int(r.viaDirectory), int(r.viaDirectory+r.viaEvery)), pctOf(int(r.viaEvery), int(r.viaDirectory+r.viaEvery)))
		}
	}
	p("\n")

	p("## Throughput (%d concurrent clients, claim 1 GPU then release, for %v)\n\n", o.workers, o.tput)
	p("CPU per claim: the CPU time of every process involved (for gpuherd the bench's own, which runs every agent; for etcd the bench's and etcd's) during the test, divided by the claims made; each claim includes its release. gpuherd's includes its agents' idle gossip.\n")
	p("Disk syncs per claim (with its release): fdatasyncs asked of the one disk every process here shares, as log appends (one each: the registry voters' raft logs; etcd's WAL), the agents' ledgers' (one per journal record, two per checkpoint of the journal into bbolt) and bbolt transactions (two each: etcd's backend), from the systems' own counters.\n")
	p("Retries per claim: for gpuherd the owners' stale answers (a server the coordinator's view showed with room refused), for etcd the transactions that lost a race and ran again.\n\n")
	t = table{head: []string{"agents", "system", "claims/s", "vs etcd", "CPU ms/claim", "disk syncs/claim", "retries/claim", "p50 ms", "p99 ms", "errors"}}
	etcdT := 0.0
	if focus != nil {
		etcdT = focus.etcdTput
	}
	for _, r := range rs {
		sys := "gpuherd"
		if r.meshSkipped {
			sys = "bench coordinator (no ID lookup)"
		}
		t.add(fmt.Sprint(r.n), sys, fmt.Sprintf("%.1f", r.tput), ratio(r.tput, etcdT), perClaim(r.tputCPU, len(r.tputLat)), r.tputSyncs.perClaim(len(r.tputLat)), retriesPer(r.tputRetries, len(r.tputLat)), ms(r.tputLat.pct(50)), ms(r.tputLat.pct(99)), fmt.Sprint(r.tputErr))
		if r == focus {
			if r.etcdErr != nil {
				t.add(fmt.Sprint(r.n), "etcd central", "error: "+r.etcdErr.Error(), "", "", "", "", "", "", "")
			} else {
				t.add(fmt.Sprint(r.n), "etcd central", fmt.Sprintf("%.1f", r.etcdTput), "×1.00", perClaim(r.etcdTputCPU, len(r.etcdTputLat)), r.etcdSyncs.perClaim(len(r.etcdTputLat)), retriesPer(r.etcdTputRetries, len(r.etcdTputLat)), ms(r.etcdTputLat.pct(50)), ms(r.etcdTputLat.pct(99)), fmt.Sprint(r.etcdTputErrs))
			}
		}
	}
	if procs != nil {
		if procs.err != nil && len(procs.tputLat) == 0 {
			t.add(fmt.Sprint(procs.n), procsLabel, "error: "+procs.err.Error(), "", "", "", "", "", "", "")
		} else {
			t.add(fmt.Sprint(procs.n), procsLabel, fmt.Sprintf("%.1f", procs.tput), ratio(procs.tput, etcdT), perClaim(procs.tputCPU, len(procs.tputLat)), "", "", ms(procs.tputLat.pct(50)), ms(procs.tputLat.pct(99)), fmt.Sprint(procs.tputErr))
		}
	}
	p("%s\n", t.String())
	if procs != nil {
		p("%s: every agent in a process of its own, as on a platform, reached through its API socket (HTTP, as a client reaches it); its CPU is every agent process's and the bench's (the clients). Its disk syncs and retries are counted inside the agents' processes and not read here.\n\n", procsLabel)
	}

	p("## Placement under a trace (hold %v mean, %v measured after a warm-up fill)\n\n", o.hold, o.traceDur)
	p("Accepted = claims granted among those offered after the warm-up; the oracle replays the same trace on exact, instantaneous state. \"Refused while fit\" = refused although, by the owners' ledgers read right after the refusal, some server could hold it. Retries = not_available answers from owners (stale views) per offered claim.\n\n")
	t = table{head: []string{"agents", "load", "system", "offered", "accepted", "vs oracle", "refused while fit", "retries/claim", "p50 ms", "p99 ms", "errors"}}
	for _, r := range rs {
		for _, load := range o.loads {
			or, ok := r.oracle[load]
			if !ok {
				continue
			}
			off := r.oracleOffer[load]
			t.add(fmt.Sprint(r.n), fmt.Sprintf("%.0f%%", load*100), "oracle: omniscient best fit", fmt.Sprint(off), fmt.Sprint(or[0]), "×1.000", "-", "-", "-", "-", "-")
			if ties, ok := r.oracleTies[load]; ok {
				t.add(fmt.Sprint(r.n), fmt.Sprintf("%.0f%%", load*100), fmt.Sprintf("omniscient best fit, %d other tie-breaks (median)", tieSeeds), fmt.Sprint(off),
					fmt.Sprintf("%d–%d (%d)", ties[0], ties[2], ties[1]), fmt.Sprintf("%s–%s (%s)", ratio3(ties[0], or[0]), ratio3(ties[2], or[0]), ratio3(ties[1], or[0])), "-", "-", "-", "-", "-")
			}
			t.add(fmt.Sprint(r.n), fmt.Sprintf("%.0f%%", load*100), "omniscient first fit", fmt.Sprint(off), fmt.Sprint(or[1]), ratio3(or[1], or[0]), "-", "-", "-", "-", "-")
			t.add(fmt.Sprint(r.n), fmt.Sprintf("%.0f%%", load*100), "omniscient random", fmt.Sprint(off), fmt.Sprint(or[2]), ratio3(or[2], or[0]), "-", "-", "-", "-", "-")
			for _, x := range r.replays {
				if x.load != load {
					continue
				}
				t.add(fmt.Sprint(r.n), fmt.Sprintf("%.0f%%", load*100), x.alloc, fmt.Sprint(x.offered), fmt.Sprint(x.accepted), ratio3(x.accepted, or[0]),
					pctOf(x.refusedWhileFit, x.offered), retriesPer(x.retries, x.offered), ms(x.latency.pct(50)), ms(x.latency.pct(99)), fmt.Sprint(x.errors))
			}
			if r == focus && load == 0.9 && r.etcdReplay != nil {
				x := r.etcdReplay
				t.add(fmt.Sprint(r.n), "90%", "etcd central (best fit)", fmt.Sprint(x.offered), fmt.Sprint(x.accepted), ratio3(x.accepted, or[0]),
					"-", retriesPer(x.retries, x.offered), ms(x.latency.pct(50)), ms(x.latency.pct(99)), fmt.Sprint(x.errors))
			}
		}
	}
	p("%s\n", t.String())

	p("## Gossip convergence: a capacity change seen by 50%% / 99%% / 100%% of the other agents\n\n")
	p("Real agents: memberlist LAN timings over UDP/TCP loopback, polled through Agent.Members every ~2 ms. Median of %d changes (a claim and its release, %d trials).\n\n", 2*o.trials, o.trials)
	t = table{head: []string{"members", "transport", "join (all see all)", "50% ms", "99% ms", "100% ms", "never seen"}}
	for _, r := range rs {
		s := mergeSpreads(r.spreads)
		t.add(fmt.Sprint(r.n), "real agents, loopback", ms(r.converge), ms(s.p50), ms(s.p99), ms(s.all), fmt.Sprint(s.missed))
	}
	for _, m := range mocks {
		s := mergeSpreads(m.changes)
		join := ms(m.join)
		if m.join < 0 {
			join = fmt.Sprintf("not within %v (fewest alive seen: %d)", 60*time.Second, m.minAlive)
		}
		t.add(fmt.Sprint(m.n), "gossip.Cluster, in-memory transport", join, ms(s.p50), ms(s.p99), ms(s.all), fmt.Sprint(s.missed))
	}
	p("%s\n", t.String())
	if len(mocks) > 0 {
		p("Encoded capacity summary of a three-model server: %d bytes.\n\n", mocks[0].metaSize)
	}

	p("## Resources\n\n")
	t = table{head: []string{"agents", "start (all)", "process RSS MiB", "RSS per agent MiB", "idle CPU, whole process", "idle CPU per agent"}}
	for _, r := range rs {
		cpu := float64(r.cpuIdle) / float64(r.idleWin)
		t.add(fmt.Sprint(r.n), r.startup.Round(time.Millisecond).String(), mib(r.rssTotal), mib(r.rssTotal/int64(r.n)),
			fmt.Sprintf("%.2f%% of one core", 100*cpu), fmt.Sprintf("%.3f%% of one core", 100*cpu/float64(r.n)))
	}
	p("%s\n", t.String())
	last := rs[len(rs)-1]
	switch {
	case last.childErr != nil:
		p("One agent in its own process: %v\n\n", last.childErr)
	case last.childWin > 0:
		p("One agent in a process of its own (dgx-h100 profile) joined to the %d: RSS %s MiB, idle CPU %.2f%% of one core over %v.\n\n",
			last.n, mib(last.childRSS), 100*float64(last.childCPU)/float64(last.childWin), last.childWin.Round(time.Second))
	}
}

// procsLabel names the per-process cluster's rows.
const procsLabel = "gpuherd, one process per agent"

func ratio3(a, b int) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("×%.3f", float64(a)/float64(b))
}

// retriesPer is n retries per claim of claims, to three places.
func retriesPer(n int64, claims int) string {
	return fmt.Sprintf("%.3f", float64(n)/math.Max(1, float64(claims)))
}
