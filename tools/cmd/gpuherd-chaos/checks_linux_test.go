package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// The checks must fire: each case below breaks one invariant in an
// otherwise consistent final state and history, and expects exactly that
// violation. These run without root or agents.

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func claimOn(node, id, state string, addrs ...string) api.Claim {
	c := api.Claim{ID: id, Node: node, State: state}
	for _, a := range addrs {
		c.GPUs = append(c.GPUs, api.ClaimGPU{PCIAddress: a})
	}
	return c
}

func gpu(addr, state, claim, driver string) api.GPU {
	return api.GPU{PCIAddress: addr, State: state, Claim: claim, Driver: driver}
}

// consistent is a final state with one claim, vm-1 on n1 0000:18:00.0, that
// the history committed and never released, and vm-2, released.
func consistent() (*finalState, *history) {
	h := newHistory(func(string, ...any) {})
	h.recs["vm-1"] = &claimRec{id: "vm-1", committed: true, node: "n1", gpus: []string{"0000:18:00.0"}, ackAt: t0}
	h.recs["vm-2"] = &claimRec{id: "vm-2", committed: true, node: "n1", gpus: []string{"0000:2a:00.0"}, ackAt: t0,
		releaseSentAt: t0.Add(time.Second), released: true, releaseAckAt: t0.Add(time.Second)}
	c := claimOn("n1", "vm-1", api.StateClaimed, "0000:18:00.0")
	fs := &finalState{
		status: map[string]api.Status{"n1": {Node: "n1", GPUs: []api.GPU{
			gpu("0000:18:00.0", api.StateClaimed, "vm-1", vfioDriver),
			gpu("0000:2a:00.0", api.StateFree, "", "nvidia"),
		}}},
		claims: map[string][]api.Claim{"n1": {c}},
		byID:   map[string][]api.Claim{"vm-1": {c}},
		views:  map[string]map[string]bool{"n1": {"vm-1@n1": true}},
	}
	return fs, h
}

func TestFinalCheck(t *testing.T) {
	end := t0.Add(time.Minute)
	cases := []struct {
		name   string
		mutate func(fs *finalState, h *history)
		want   string // violation kind; "" for none
	}{
		{"consistent", func(*finalState, *history) {}, ""},
		{"lost commit", func(fs *finalState, h *history) {
			fs.claims["n1"], fs.byID = nil, map[string][]api.Claim{}
			fs.status["n1"].GPUs[0] = gpu("0000:18:00.0", api.StateFree, "", "nvidia")
		}, "lost-commit"},
		{"commit moved to other GPUs", func(fs *finalState, h *history) {
			h.recs["vm-1"].gpus = []string{"0000:3a:00.0"}
		}, "lost-commit"},
		{"claimed GPU not on vfio-pci", func(fs *finalState, h *history) {
			fs.status["n1"].GPUs[0].Driver = "nvidia"
		}, "claimed-not-on-vfio"},
		{"reservation left", func(fs *finalState, h *history) {
			r := claimOn("n1", "vm-9", api.StateReserved, "0000:2a:00.0")
			r.ExpiresAt = t0
			fs.claims["n1"] = append(fs.claims["n1"], r)
			fs.byID["vm-9"] = []api.Claim{r}
			fs.status["n1"].GPUs[1] = gpu("0000:2a:00.0", api.StateReserved, "vm-9", vfioDriver)
			h.recs["vm-9"] = &claimRec{id: "vm-9", ambiguousClaim: true}
		}, "reservation-outlived-lease"},
		{"GPU in two claims", func(fs *finalState, h *history) {
			c := claimOn("n1", "vm-3", api.StateClaimed, "0000:18:00.0")
			fs.claims["n1"] = append(fs.claims["n1"], c)
			fs.byID["vm-3"] = []api.Claim{c}
			h.recs["vm-3"] = &claimRec{id: "vm-3", committed: true, node: "n1", gpus: []string{"0000:18:00.0"}, ackAt: t0.Add(time.Second)}
		}, "gpu-in-two-claims"},
		{"released claim back", func(fs *finalState, h *history) {
			c := claimOn("n1", "vm-2", api.StateClaimed, "0000:2a:00.0")
			fs.claims["n1"] = append(fs.claims["n1"], c)
			fs.byID["vm-2"] = []api.Claim{c}
			fs.status["n1"].GPUs[1] = gpu("0000:2a:00.0", api.StateClaimed, "vm-2", vfioDriver)
			fs.views["n1"]["vm-2@n1"] = true
		}, "released-claim-present"},
		{"phantom claim", func(fs *finalState, h *history) {
			c := claimOn("n1", "vm-4", api.StateClaimed, "0000:2a:00.0")
			fs.claims["n1"] = append(fs.claims["n1"], c)
			fs.byID["vm-4"] = []api.Claim{c}
			fs.status["n1"].GPUs[1] = gpu("0000:2a:00.0", api.StateClaimed, "vm-4", vfioDriver)
			fs.views["n1"]["vm-4@n1"] = true
			h.recs["vm-4"] = &claimRec{id: "vm-4", refused: true}
		}, "phantom-claim"},
		{"double allocation in the history", func(fs *finalState, h *history) {
			// vm-5 was acknowledged on vm-1's GPU while vm-1 was held.
			h.recs["vm-5"] = &claimRec{id: "vm-5", committed: true, node: "n1", gpus: []string{"0000:18:00.0"},
				ackAt: t0.Add(10 * time.Second), releaseSentAt: t0.Add(20 * time.Second), released: true}
		}, "double-allocation"},
		{"status and ledger disagree", func(fs *finalState, h *history) {
			fs.status["n1"].GPUs[1] = gpu("0000:2a:00.0", api.StateClaimed, "vm-7", vfioDriver)
		}, "status-ledger-mismatch"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs, h := consistent()
			tc.mutate(fs, h)
			finalCheck(fs, h, end)
			if tc.want == "" {
				if len(h.violations) != 0 {
					t.Fatalf("violations %v in a consistent state: %s", h.violations, strings.Join(h.details, "\n"))
				}
				return
			}
			if h.violations[tc.want] == 0 {
				t.Fatalf("no %s violation; got %v: %s", tc.want, h.violations, strings.Join(h.details, "\n"))
			}
		})
	}
}

// A released GPU handed to the next claim is not a double allocation, nor
// is an attempt with a lost answer that committed too (a duplicate the
// protocol allows); both are only notes.
func TestFinalCheckAllowed(t *testing.T) {
	fs, h := consistent()
	h.recs["vm-6"] = &claimRec{id: "vm-6", committed: true, node: "n1", gpus: []string{"0000:2a:00.0"},
		ackAt: t0.Add(2 * time.Second), releaseSentAt: t0.Add(3 * time.Second), released: true}
	h.recs["vm-8"] = &claimRec{id: "vm-8", ambiguousClaim: true}
	c := claimOn("n1", "vm-8", api.StateClaimed, "0000:2a:00.0")
	fs.claims["n1"] = append(fs.claims["n1"], c)
	fs.byID["vm-8"] = []api.Claim{c}
	fs.status["n1"].GPUs[1] = gpu("0000:2a:00.0", api.StateClaimed, "vm-8", vfioDriver)
	fs.views["n1"]["vm-8@n1"] = true
	finalCheck(fs, h, t0.Add(time.Minute))
	if len(h.violations) != 0 {
		t.Fatalf("violations %v: %s", h.violations, strings.Join(h.details, "\n"))
	}
	if len(h.notes) != 1 {
		t.Fatalf("notes %v, want the lost-answer commit", h.notes)
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want outcome
	}{
		{nil, outOK},
		{&api.Error{Code: api.CodeNotAvailable}, outNotAvailable},
		{&api.Error{Code: api.CodeNotFound}, outNotFound},
		{&api.Error{Code: api.CodeLeaseExpired}, outRefused},
		{&api.Error{Code: api.CodeConflict}, outConflict},
		{&api.Error{Code: api.CodeInUse}, outRefused},
		{&api.Error{Code: api.CodeUnavailable}, outAmbiguous},
		{api.ErrAgentDown, outAmbiguous},
	} {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("classify(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
	if got := classifyCLI(3, "", "", nil); got != outNotAvailable {
		t.Errorf("exit 3 = %s", got)
	}
	for _, tc := range []struct {
		code   int
		stderr string
		want   outcome
	}{
		{4, "", outNotFound},
		{6, "", outConflict},
		{6, `{"error":{"code":"conflict","message":"held under another request"}}`, outConflict},
		{6, `{"error":{"code":"in_use","message":"a VM uses it"}}`, outRefused},
		{2, "", outRefused},
		{5, `{"error":{"code":"unreachable","message":"agent not reachable"}}`, outAmbiguous},
		{5, "gpuherd: agent not reachable", outAmbiguous},
		{1, `{"error":{"code":"lease_expired","message":"expired"}}`, outRefused},
		{1, "gpuherd: something", outAmbiguous},
	} {
		if got := classifyCLI(tc.code, "", tc.stderr, nil); got != tc.want {
			t.Errorf("exit %d, stderr %q = %s, want %s", tc.code, tc.stderr, got, tc.want)
		}
	}
}

// The agent's own line for a failed group resize that left nodes changed
// (agent/groups, restoreGroup) names its group exactly: g1's line is not
// g11's.
func TestResizeLeftMixedIn(t *testing.T) {
	log := []byte(`time=2026-12-06T14:17:56.917Z level=ERROR msg="group resize failed and left nodes changed" group=g1 node=g1.node-2 cause="The following GPUs are not available: 2x NVIDIA L40S" changed="[g1.node-0 had 1x NVIDIA L40S on n7 and has 2x NVIDIA L40S on n2]"
time=2026-12-06T14:17:58.190Z level=INFO msg="group deleted" group=g2
`)
	// The message is the agent's: a changed wording there would make the
	// checker flag what the agent reported.
	src, err := os.ReadFile(filepath.Join("..", "..", "..", "agent", "groups", "resize.go"))
	if err != nil {
		t.Fatal(err)
	}
	if msg := strings.TrimPrefix(resizeLeftMixedMsg, "msg="); !strings.Contains(string(src), "gs.log.Error("+msg+",") {
		t.Errorf("agent/groups/resize.go no longer logs %s", msg)
	}
	for group, want := range map[string]bool{"g1": true, "g11": false, "g2": false, "g": false} {
		if got := resizeLeftMixedIn(log, group); got != want {
			t.Errorf("resizeLeftMixedIn(%s) = %v, want %v", group, got, want)
		}
	}
}
