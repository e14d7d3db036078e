package main

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// Each check of the retrying clients must fire on a history that breaks
// it, and stay quiet on the answers the protocol allows.

var (
	h100x2 = []api.Item{{Model: "H100 80GB", Count: 2}}
	h100x1 = []api.Item{{Model: "H100 80GB", Count: 1}}
)

// heldRec is vm-1, claimed with 2×H100 on n1, acknowledged at t0.
func heldRec() *claimRec {
	return &claimRec{id: "vm-1", items: h100x2, committed: true, node: "n1", gpus: []string{"0000:18:00.0", "0000:2a:00.0"}, ackAt: t0, lastTryEnd: t0}
}

func quietHistory() *history { return newHistory(func(string, ...any) {}) }

// only fails unless h holds exactly the violation want ("" for none).
func only(t *testing.T, h *history, want string) {
	t.Helper()
	total := 0
	for _, n := range h.violations {
		total += n
	}
	switch {
	case want == "" && total != 0:
		t.Fatalf("violations %v, want none: %s", h.violations, strings.Join(h.details, "\n"))
	case want != "" && (h.violations[want] == 0 || total != h.violations[want]):
		t.Fatalf("violations %v, want only %s: %s", h.violations, want, strings.Join(h.details, "\n"))
	case want != "" && !strings.Contains(h.details[0], "seed 7"):
		t.Fatalf("the violation does not name the seed: %s", h.details[0])
	}
}

func TestJudgeClaim(t *testing.T) {
	onN1 := claimOn("n1", "vm-1", api.StateClaimed, "0000:18:00.0", "0000:2a:00.0")
	onN2 := claimOn("n2", "vm-1", api.StateClaimed, "0000:3b:00.0", "0000:4c:00.0")
	later := t0.Add(5 * time.Second)
	cases := []struct {
		name  string
		rec   func() *claimRec
		items []api.Item
		o     outcome
		c     api.Claim
		want  string
	}{
		{"a re-send answered with the held claim", heldRec, h100x2, outOK, onN1, ""},
		{"a re-send placed a second copy while the owner was down", heldRec, h100x2, outOK, onN2, "second-copy"},
		{"another request answered conflict", heldRec, h100x1, outConflict, api.Claim{}, ""},
		{"another request answered 503", heldRec, h100x1, outAmbiguous, api.Claim{}, ""},
		{"another request accepted", heldRec, h100x1, outOK, claimOn("n2", "vm-1", api.StateClaimed, "0000:3b:00.0"), "other-request-accepted"},
		{"another request under a held ID answered not available", heldRec, h100x1, outNotAvailable, api.Claim{}, "held-id-not-conflict"},
		{"a held claim's own request answered not available", heldRec, h100x2, outNotAvailable, api.Claim{}, "not-available-for-held"},
		{"a held claim's own request answered 503", heldRec, h100x2, outAmbiguous, api.Claim{}, ""},
		{"not available before anything was acknowledged", func() *claimRec {
			return &claimRec{id: "vm-1", items: h100x2, ambiguousClaim: true}
		}, h100x2, outNotAvailable, api.Claim{}, ""},
		{"not available once the release was sent", func() *claimRec {
			r := heldRec()
			r.releaseSentAt = t0.Add(time.Second)
			return r
		}, h100x2, outNotAvailable, api.Claim{}, ""},
		{"not available with a release sent while it was on its way", func() *claimRec {
			r := heldRec()
			r.releaseSentAt = later.Add(time.Second)
			return r
		}, h100x2, outNotAvailable, api.Claim{}, ""},
		{"its own request answered conflict", func() *claimRec {
			return &claimRec{id: "vm-1", items: h100x2, ambiguousClaim: true}
		}, h100x2, outConflict, api.Claim{}, "false-conflict"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := quietHistory()
			h.seed = 7
			h.judgeClaimLocked(tc.rec(), "n3", tc.items, later, tc.o, "the agent's message", tc.c)
			only(t, h, tc.want)
		})
	}
}

func TestJudgeGet(t *testing.T) {
	released := func() *claimRec {
		r := heldRec()
		r.releaseSentAt, r.released, r.releaseAckAt = t0.Add(time.Second), true, t0.Add(2*time.Second)
		return r
	}
	onN1 := claimOn("n1", "vm-1", api.StateClaimed, "0000:18:00.0", "0000:2a:00.0")
	cases := []struct {
		name string
		rec  func() *claimRec
		at   time.Time
		o    outcome
		c    api.Claim
		want string
	}{
		{"held, read back", heldRec, t0.Add(time.Second), outOK, onN1, ""},
		{"held, read back elsewhere", heldRec, t0.Add(time.Second), outOK, claimOn("n2", "vm-1", api.StateClaimed, "0000:18:00.0", "0000:2a:00.0"), "get-mismatch"},
		{"held, owner down: 503", heldRec, t0.Add(time.Second), outAmbiguous, api.Claim{}, ""},
		{"held, read as not found", heldRec, t0.Add(time.Second), outNotFound, api.Claim{}, "held-id-not-found"},
		{"not found while the release is on its way", released, t0.Add(1500 * time.Millisecond), outNotFound, api.Claim{}, ""},
		{"found while the release is on its way", released, t0.Add(1500 * time.Millisecond), outOK, onN1, ""},
		{"not found, with a release sent while the get was on its way", released, t0.Add(500 * time.Millisecond), outNotFound, api.Claim{}, ""},
		{"released, gone", released, t0.Add(3 * time.Second), outNotFound, api.Claim{}, ""},
		{"released, still found", released, t0.Add(3 * time.Second), outOK, onN1, "released-id-still-held"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := quietHistory()
			h.seed = 7
			h.judgeGetLocked(tc.rec(), "n3", tc.at, tc.o, "the agent's message", tc.c)
			only(t, h, tc.want)
		})
	}
}

func TestJudgeUnknown(t *testing.T) {
	const healed = "with every fault healed"
	cases := []struct {
		name   string
		o      outcome
		strict string
		want   string
		notes  int
	}{
		{"not found during faults", outNotFound, "", "", 0},
		{"503 during faults: counted", outAmbiguous, "", "", 1},
		{"found", outOK, "", "unknown-id-found", 0},
		{"not found once healed", outNotFound, healed, "", 0},
		{"503 once healed", outAmbiguous, healed, "unknown-id-not-404", 0},
		{"503 with one member dead", outAmbiguous, "with n1 dead", "unknown-id-not-404", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := quietHistory()
			h.seed = 7
			h.judgeUnknown("get", "nx-1", "n2", tc.o, "n1 did not answer", tc.strict)
			only(t, h, tc.want)
			if h.notes[noteUnknown503] != tc.notes {
				t.Fatalf("notes %v, want %d of %q", h.notes, tc.notes, noteUnknown503)
			}
		})
	}
}

func TestCheckOneServerPerID(t *testing.T) {
	h := quietHistory()
	h.seed = 7
	round := map[string][]api.Claim{
		"n1": {claimOn("n1", "vm-1", api.StateClaimed, "0000:18:00.0"), claimOn("n1", "g1.node-0", api.StateClaimed, "0000:2a:00.0")},
		"n2": {claimOn("n2", "vm-2", api.StateClaimed, "0000:18:00.0"), claimOn("n2", "g1.node-0", api.StateClaimed, "0000:3b:00.0"),
			claimOn("n2", "vm-3", api.StateReserved, "0000:4c:00.0")},
		"n3": {claimOn("n3", "vm-3", api.StateClaimed, "0000:18:00.0")},
	}
	checkOneServerPerID(h, round)
	only(t, h, "") // a group node moving, a reservation: not two copies
	round["n2"] = append(round["n2"], claimOn("n2", "vm-1", api.StateClaimed, "0000:5d:00.0"))
	checkOneServerPerID(h, round)
	checkOneServerPerID(h, round) // the same copies again: reported once
	only(t, h, "id-on-two-servers")
	if h.violations["id-on-two-servers"] != 1 || !strings.Contains(h.details[0], "n1 [0000:18:00.0] and n2 [0000:5d:00.0]") {
		t.Fatalf("want one report naming both copies: %s", strings.Join(h.details, "\n"))
	}
}

// The final state: the new checks of the whole cluster after the heal.
func TestFinalCheckNames(t *testing.T) {
	end := t0.Add(time.Minute)
	addClaim := func(fs *finalState, c api.Claim) {
		fs.claims[c.Node] = append(fs.claims[c.Node], c)
		fs.byID[c.ID] = append(fs.byID[c.ID], c)
		st := fs.status[c.Node]
		for _, g := range c.GPUs {
			st.GPUs = append(st.GPUs, gpu(g.PCIAddress, api.StateClaimed, c.ID, vfioDriver))
		}
		fs.status[c.Node] = st
		for node := range fs.views {
			fs.views[node][c.ID+"@"+c.Node] = true
		}
	}
	withN2 := func(fs *finalState) {
		fs.status["n2"] = api.Status{Node: "n2"}
		fs.views["n2"] = map[string]bool{"vm-1@n1": true}
	}
	cases := []struct {
		name   string
		mutate func(fs *finalState, h *history)
		want   string
	}{
		{"an ID on two servers", func(fs *finalState, h *history) {
			withN2(fs)
			h.recs["vm-1"].ambiguousClaim = true // even when an answer was lost
			addClaim(fs, claimOn("n2", "vm-1", api.StateClaimed, "0000:3b:00.0"))
		}, "id-on-two-servers"},
		{"a copy left after an acknowledged release", func(fs *finalState, h *history) {
			// vm-2's release was acknowledged, but a copy on another
			// server than the acknowledged one stayed.
			withN2(fs)
			h.recs["vm-2"].ambiguousClaim = true
			h.recs["vm-2"].lastTryEnd = t0
			addClaim(fs, claimOn("n2", "vm-2", api.StateClaimed, "0000:3b:00.0"))
		}, "released-claim-present"},
		{"a group missing a node", func(fs *finalState, h *history) {
			h.groups["g1"] = &groupRec{name: "g1", nodes: 2, want: [][]api.Item{h100x1}, created: true}
			addClaim(fs, withModel(claimOn("n1", "g1.node-0", api.StateClaimed, "0000:3b:00.0"), "H100 80GB"))
		}, "group-not-all-or-nothing"},
		{"a group half resized", func(fs *finalState, h *history) {
			h.groups["g1"] = &groupRec{name: "g1", nodes: 2, want: [][]api.Item{h100x1, h100x2}, created: true}
			addClaim(fs, withModel(claimOn("n1", "g1.node-0", api.StateClaimed, "0000:3b:00.0"), "H100 80GB"))
			addClaim(fs, withModel(claimOn("n1", "g1.node-1", api.StateClaimed, "0000:4c:00.0", "0000:5d:00.0"), "H100 80GB"))
		}, "group-not-all-or-nothing"},
		{"a refused group create that kept a node", func(fs *finalState, h *history) {
			h.groups["g1"] = &groupRec{name: "g1", nodes: 2, want: [][]api.Item{h100x1}, createRefused: true}
			addClaim(fs, withModel(claimOn("n1", "g1.node-0", api.StateClaimed, "0000:3b:00.0"), "H100 80GB"))
		}, "group-not-all-or-nothing"},
		{"a deleted group that kept a node", func(fs *finalState, h *history) {
			h.groups["g1"] = &groupRec{name: "g1", nodes: 2, want: [][]api.Item{h100x1}, created: true, deleted: true}
			addClaim(fs, withModel(claimOn("n1", "g1.node-1", api.StateClaimed, "0000:3b:00.0"), "H100 80GB"))
		}, "group-claims-left"},
		{"a group whose only create was never answered, half placed", func(fs *finalState, h *history) {
			h.groups["g1"] = &groupRec{name: "g1", nodes: 2, want: [][]api.Item{h100x1}, created: true, createAmbiguous: true}
			addClaim(fs, withModel(claimOn("n1", "g1.node-0", api.StateClaimed, "0000:3b:00.0"), "H100 80GB"))
		}, ""},
		{"a group answered created, then half placed after an ambiguous retry", func(fs *finalState, h *history) {
			h.groups["g1"] = &groupRec{name: "g1", nodes: 2, want: [][]api.Item{h100x1}, created: true, createAmbiguous: true, createAcked: true}
			addClaim(fs, withModel(claimOn("n1", "g1.node-0", api.StateClaimed, "0000:3b:00.0"), "H100 80GB"))
		}, "group-not-all-or-nothing"},
		{"a group half resized, as a failed resize's coordinator logged", func(fs *finalState, h *history) {
			h.groups["g1"] = &groupRec{name: "g1", nodes: 2, want: [][]api.Item{h100x1, h100x2}, created: true}
			h.resizeLeftMixed = func(g string) bool { return g == "g1" }
			addClaim(fs, withModel(claimOn("n1", "g1.node-0", api.StateClaimed, "0000:3b:00.0"), "H100 80GB"))
			addClaim(fs, withModel(claimOn("n1", "g1.node-1", api.StateClaimed, "0000:4c:00.0", "0000:5d:00.0"), "H100 80GB"))
		}, ""},
		{"a group half resized, another group's resize logged", func(fs *finalState, h *history) {
			h.groups["g1"] = &groupRec{name: "g1", nodes: 2, want: [][]api.Item{h100x1, h100x2}, created: true}
			h.resizeLeftMixed = func(g string) bool { return g == "g11" }
			addClaim(fs, withModel(claimOn("n1", "g1.node-0", api.StateClaimed, "0000:3b:00.0"), "H100 80GB"))
			addClaim(fs, withModel(claimOn("n1", "g1.node-1", api.StateClaimed, "0000:4c:00.0", "0000:5d:00.0"), "H100 80GB"))
		}, "group-not-all-or-nothing"},
		{"a logged half resize holding GPUs nobody asked for", func(fs *finalState, h *history) {
			h.groups["g1"] = &groupRec{name: "g1", nodes: 2, want: [][]api.Item{h100x1, h100x2}, created: true}
			h.resizeLeftMixed = func(string) bool { return true }
			addClaim(fs, withModel(claimOn("n1", "g1.node-0", api.StateClaimed, "0000:3b:00.0"), "H100 80GB"))
			addClaim(fs, withModel(claimOn("n1", "g1.node-1", api.StateClaimed, "0000:4c:00.0", "0000:5d:00.0", "0000:6e:00.0"), "H100 80GB"))
		}, "group-not-all-or-nothing"},
		{"a whole group, resized", func(fs *finalState, h *history) {
			h.groups["g1"] = &groupRec{name: "g1", nodes: 2, want: [][]api.Item{h100x2, h100x1}, created: true}
			addClaim(fs, withModel(claimOn("n1", "g1.node-0", api.StateClaimed, "0000:3b:00.0", "0000:4c:00.0"), "H100 80GB"))
			addClaim(fs, withModel(claimOn("n1", "g1.node-1", api.StateClaimed, "0000:5d:00.0", "0000:6e:00.0"), "H100 80GB"))
		}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs, h := consistent()
			h.seed = 7
			tc.mutate(fs, h)
			finalCheck(fs, h, end)
			only(t, h, tc.want)
		})
	}
}

func withModel(c api.Claim, model string) api.Claim {
	for i := range c.GPUs {
		c.GPUs[i].Model = model
	}
	return c
}

// Agent log lines as the text handler writes them.
const (
	fenceCancelled = `time=2026-12-02T00:45:16.780Z level=ERROR msg="GPU fenced off: no new claims until it is fixed and the agent restarts" pci_address=0000:3b:00.0 reason="could not be put on the idle driver nvidia (release vm-o1-2): writing driver_override: context canceled"`
	fenceStuck     = `time=2026-12-02T00:45:17.000Z level=ERROR msg="GPU fenced off: no new claims until it is fixed and the agent restarts" pci_address=0000:4c:00.0 reason="bind to vfio-pci failed (claim vm-2): unbind from nvidia: stuck"`
)

func TestCheckFenceLogs(t *testing.T) {
	log := []byte(startMarker + "#1 of n1\n" + fenceCancelled + "\n" + startMarker + "#2 of n1\nlevel=INFO msg=\"claim committed\"\n" + fenceStuck + "\n")
	evs := fenceEvents(log)
	if len(evs) != 2 || evs[0].addr != "0000:3b:00.0" || evs[1].addr != "0000:4c:00.0" {
		t.Fatalf("fence events %+v", evs)
	}

	h := quietHistory()
	h.seed = 7
	checkFenceCancelled(h, "n1", log)
	only(t, h, "fenced-by-cancelled-context")
	if h.violations["fenced-by-cancelled-context"] != 1 || !strings.Contains(h.details[0], "0000:3b:00.0") {
		t.Fatalf("want the cancelled fence only: %s", strings.Join(h.details, "\n"))
	}

	// Since the last start only 0000:4c:00.0 is fenced: shown unhealthy
	// it is fine, shown free it is offered to the next claim.
	st := api.Status{Node: "n1", GPUs: []api.GPU{gpu("0000:3b:00.0", api.StateFree, "", "nvidia"), gpu("0000:4c:00.0", api.StateUnhealthy, "", "nvidia")}}
	h = quietHistory()
	h.seed = 7
	checkFencedNotFree(h, "n1", sinceLastStart(log), st)
	only(t, h, "")
	st.GPUs[1].State = api.StateFree
	checkFencedNotFree(h, "n1", sinceLastStart(log), st)
	only(t, h, "fenced-gpu-offered")
}

func TestLastRaftState(t *testing.T) {
	for _, tc := range []struct {
		log, want string
	}{
		{"", ""},
		{`level=INFO msg="entering follower state" component=raft` + "\n" + `level=INFO msg="entering leader state" component=raft`, "leader"},
		{`level=INFO msg="entering leader state" component=raft` + "\n" + `level=INFO msg="entering follower state" component=raft`, "follower"},
		// A leader before the last restart leads no more.
		{`level=INFO msg="entering leader state" component=raft` + "\n" + startMarker + "#2\n", ""},
	} {
		if got := lastRaftState([]byte(tc.log)); got != tc.want {
			t.Errorf("lastRaftState(%q) = %q, want %q", tc.log, got, tc.want)
		}
	}
}

// retrying sends a retryable answer's retry to another agent, never to the
// one to avoid, and stops at the first definitive answer.
func TestRetrying(t *testing.T) {
	var agents []*agent
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		agents = append(agents, &agent{name: n})
	}
	w := &workload{agents: agents, stop: make(chan struct{})}
	var asked []string
	answers := []outcome{outAmbiguous, outAmbiguous, outConflict, outOK}
	o := w.retrying(rand.New(rand.NewPCG(1, 2)), agents[0], "n2", time.Minute, func(a *agent) outcome {
		asked = append(asked, a.name)
		return answers[len(asked)-1]
	})
	if o != outConflict || len(asked) != 3 {
		t.Fatalf("answer %s after asking %v; want conflict after 3", o, asked)
	}
	for i, n := range asked {
		if n == "n2" || (i > 0 && n == asked[i-1]) {
			t.Fatalf("asked %v: a retry went to the avoided node or to the agent that just failed", asked)
		}
	}
	// A stopped run makes no retry.
	close(w.stop)
	asked = nil
	w.retrying(rand.New(rand.NewPCG(1, 2)), agents[0], "", time.Minute, func(a *agent) outcome {
		asked = append(asked, a.name)
		return outAmbiguous
	})
	if len(asked) != 1 {
		t.Fatalf("asked %v after the run stopped", asked)
	}
}

func TestOtherRequest(t *testing.T) {
	w := &workload{models: []modelSpec{{name: "H100 80GB", weight: 12, maxOne: 8}, {name: "L40S", weight: 4, maxOne: 4}, {name: "A100 80GB", weight: 1, maxOne: 1}}}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, items := range [][]api.Item{h100x1, h100x2, {{Model: "H100 80GB", Count: 8}}, {{Model: "A100 80GB", Count: 1}}} {
		got := w.otherRequest(rng, items)
		if slices.Equal(got, items) {
			t.Errorf("otherRequest(%v) = the same request", items)
		}
		for _, it := range got {
			if it.Count < 1 || it.Count > w.mostOf(it.Model) {
				t.Errorf("otherRequest(%v) = %v: no server could hold it", items, got)
			}
		}
	}
}
