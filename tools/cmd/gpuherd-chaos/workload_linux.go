package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// Deadlines of the claimers' calls: longer than the coordinator's own
// (20 s for a reserve, which binds, then 5 s per owner call), so that an
// answer the agent does give is seen.
const (
	claimTimeout   = 30 * time.Second
	releaseTimeout = 15 * time.Second
	getTimeout     = 10 * time.Second
	groupTimeout   = 45 * time.Second // a create places its nodes one after the other
)

// outcome classifies an answer. Only "ok" and the definitive refusals say
// what happened; anything else (a timeout, a dead agent, a 5xx) leaves the
// claim's fate unknown, and the checks treat it so.
type outcome string

const (
	outOK           outcome = "ok"
	outNotAvailable outcome = "not_available"
	outNotFound     outcome = "not_found"
	outRefused      outcome = "refused"  // invalid, lease_expired, in_use: nothing was committed
	outConflict     outcome = "conflict" // the ID is held under another request
	outAmbiguous    outcome = "ambiguous"
)

// claimRec is what the run knows about one claim ID. IDs are never reused
// after a release: each claim gets a fresh ID, and a client retries an
// attempt whose fate is unknown with the same ID and request, through the
// other agents (retry_linux.go).
type claimRec struct {
	id    string
	items []api.Item

	ambiguousClaim bool // some claim attempt's fate is unknown
	refused        bool // an attempt was definitively refused
	committed      bool // an attempt answered "claimed"
	node           string
	gpus           []string  // sorted PCI addresses
	ackAt          time.Time // when the first committed answer arrived
	lastTryEnd     time.Time // when the last attempt with rec's request ended (answered or timed out)

	releaseSentAt    time.Time // first release attempt began (zero: none)
	released         bool      // a release was acknowledged
	releaseAckAt     time.Time // when (zero: never)
	ambiguousRelease bool      // a release's fate is unknown
}

// heldAt reports whether the claimer certainly held rec at t: acknowledged
// before t, and no release sent yet.
func (rec *claimRec) heldAt(t time.Time) bool {
	return rec.committed && !rec.ackAt.After(t) && (rec.releaseSentAt.IsZero() || rec.releaseSentAt.After(t))
}

// releasedBefore reports whether an acknowledged release of rec came back
// before t, after every claim attempt had ended: from then on no server may
// hold GPUs under rec's ID.
func (rec *claimRec) releasedBefore(t time.Time) bool {
	return rec.released && rec.releaseAckAt.Before(t) && !rec.lastTryEnd.After(rec.releaseAckAt)
}

// history is shared by the claimers and read by the checks.
type history struct {
	mu   sync.Mutex
	seed uint64 // printed with every violation, to replay it
	recs map[string]*claimRec
	// groups are the node groups the group client made (groups_linux.go).
	groups map[string]*groupRec
	ops    map[string]map[outcome]int // op kind → outcome → count
	// notes are expected effects of faults that the report counts but that
	// are not violations (see docs/protocol.md).
	notes map[string]int
	// violations of the invariants, by kind, with their details.
	violations map[string]int
	details    []string
	reported   map[string]bool // keys of violations reported once (violateOnce)
	logf       func(format string, args ...any)
	// resizeLeftMixed reports whether an agent logged that a resize of
	// the group failed and left nodes changed (mixedAsReported); nil
	// reports nothing. Called with mu held.
	resizeLeftMixed func(group string) bool
}

// violate records a violation; h.mu must not be held.
func (h *history) violate(kind, format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.violateLocked(kind, format, args...)
}

// violateOnce records a violation the first time key is seen: a state
// that the monitor finds again at every sample is one violation.
func (h *history) violateOnce(key, kind, format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.reported[key] {
		return
	}
	h.reported[key] = true
	h.violateLocked(kind, format, args...)
}

func (h *history) violateLocked(kind, format string, args ...any) {
	h.violations[kind]++
	d := fmt.Sprintf("VIOLATION %s (seed %d): %s", kind, h.seed, fmt.Sprintf(format, args...))
	h.details = append(h.details, d)
	h.logf("%s", d)
}

func newHistory(logf func(format string, args ...any)) *history {
	return &history{recs: map[string]*claimRec{}, groups: map[string]*groupRec{}, ops: map[string]map[outcome]int{}, notes: map[string]int{},
		violations: map[string]int{}, reported: map[string]bool{}, logf: logf}
}

func (h *history) count(op string, o outcome) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ops[op] == nil {
		h.ops[op] = map[outcome]int{}
	}
	h.ops[op][o]++
}

// classify turns an API error into an outcome.
func classify(err error) outcome {
	if err == nil {
		return outOK
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case api.CodeNotAvailable:
			return outNotAvailable
		case api.CodeNotFound:
			return outNotFound
		case api.CodeConflict:
			return outConflict
		case api.CodeInvalid, api.CodeUnknownModel, api.CodeLeaseExpired, api.CodeInUse:
			return outRefused
		}
	}
	return outAmbiguous
}

// classifyCLI maps the CLI's answer by its exit code: 0 ok, 2 usage,
// 3 not available, 4 not found, 6 conflict or in use (the error's code
// tells which); 5 (a server did not answer) and 1 are ambiguous unless the
// error's code, which `-o json` writes on stderr, says the answer is
// definitive (a message's wording never decides).
func classifyCLI(code int, stdout, stderr string, err error) outcome {
	switch {
	case err != nil:
		return outAmbiguous
	case code == 0:
		return outOK
	case code == 3:
		return outNotAvailable
	case code == 4:
		return outNotFound
	case code == 2:
		return outRefused
	case code == 6:
		var eb api.ErrorBody
		if json.Unmarshal([]byte(stderr), &eb) == nil && eb.Error != nil && eb.Error.Code != api.CodeConflict {
			return outRefused
		}
		return outConflict
	}
	var eb api.ErrorBody
	if json.Unmarshal([]byte(stderr), &eb) == nil && eb.Error != nil {
		return classify(eb.Error)
	}
	_ = stdout
	return outAmbiguous
}

// answerMsg is what an API answer said, for the evidence of a violation.
func answerMsg(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// cliMsg is what a CLI answer said: the error's message (from `-o json`
// on stderr) with its exit code.
func cliMsg(code int, stderr string, err error) string {
	if err != nil {
		return err.Error()
	}
	var eb api.ErrorBody
	if json.Unmarshal([]byte(stderr), &eb) == nil && eb.Error != nil {
		return fmt.Sprintf("exit %d: %s: %s", code, eb.Error.Code, eb.Error.Message)
	}
	return fmt.Sprintf("exit %d: %s", code, strings.TrimSpace(stderr))
}

// workload is the set of concurrent claimers.
type workload struct {
	h        *history
	agents   []*agent
	models   []modelSpec
	cliShare float64 // share of operations that go through the CLI
	stop     chan struct{}
	logf     func(format string, args ...any)
	maxHeld  int
}

type modelSpec struct {
	name   string // as users type it
	weight int    // total units in the cluster
	maxOne int    // most units on one server
}

// claimer is one client of the platform: it claims, reads and releases its
// own VMs' GPUs through random agents until told to stop. Like a real
// client it retries an answer that leaves the outcome open (a 503, a
// timeout, a dead agent) with the same ID and request through other agents
// (retrying); now and then it re-sends the claim of a VM it holds, sends
// another request under a held VM's ID (which must be refused as a
// conflict), and reads or releases IDs that never existed.
func (w *workload) claimer(k int, rng *rand.Rand, wg *sync.WaitGroup) {
	defer wg.Done()
	var held, uncertain []*claimRec
	next, unknown := 0, 0
	for {
		if w.stopped() {
			return
		}
		a := w.agents[rng.IntN(len(w.agents))]
		viaCLI := rng.Float64() < w.cliShare
		r := rng.IntN(100)
		switch {
		case len(held) > 0 && (len(held) >= w.maxHeld || r < 28):
			i := rng.IntN(len(held))
			rec := held[i]
			if w.releaseRetrying(rng, a, "", rec, viaCLI, retryBudget) {
				held = slices.Delete(held, i, i+1)
			}
		case len(held) > 0 && r < 34:
			w.get(a, held[rng.IntN(len(held))], viaCLI)
		case len(held) > 0 && r < 38:
			rec := held[rng.IntN(len(held))]
			other := w.otherRequest(rng, rec.items)
			w.retrying(rng, a, "", retryBudget, func(a *agent) outcome { return w.claim(a, rec, other, viaCLI) })
		case len(held) > 0 && r < 42:
			rec := held[rng.IntN(len(held))]
			w.retrying(rng, a, "", retryBudget, func(a *agent) outcome { return w.claim(a, rec, rec.items, viaCLI) })
		case r < 45:
			unknown++
			id := fmt.Sprintf("nx-c%d-%d", k, unknown)
			if rng.IntN(3) == 0 {
				w.releaseUnknown(a, id, viaCLI, "")
			} else {
				w.getUnknown(a, id, viaCLI, "")
			}
		case len(uncertain) > 0 && r < 52:
			i := rng.IntN(len(uncertain))
			rec := uncertain[i]
			switch w.retrying(rng, a, "", retryBudget, func(a *agent) outcome { return w.claim(a, rec, rec.items, viaCLI) }) {
			case outOK:
				uncertain = slices.Delete(uncertain, i, i+1)
				held = append(held, rec)
			case outRefused, outConflict:
				uncertain = slices.Delete(uncertain, i, i+1)
			}
		default:
			next++
			rec := w.newRec(fmt.Sprintf("vm-c%d-%d", k, next), w.request(rng))
			switch w.retrying(rng, a, "", retryBudget, func(a *agent) outcome { return w.claim(a, rec, rec.items, viaCLI) }) {
			case outOK:
				held = append(held, rec)
			case outAmbiguous:
				uncertain = append(uncertain, rec)
			}
		}
		select {
		case <-w.stop:
			return
		case <-time.After(time.Duration(50+rng.IntN(350)) * time.Millisecond):
		}
	}
}

func (w *workload) stopped() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// newRec registers a claim ID the run is about to ask for.
func (w *workload) newRec(id string, items []api.Item) *claimRec {
	rec := &claimRec{id: id, items: items}
	w.h.mu.Lock()
	w.h.recs[rec.id] = rec
	w.h.mu.Unlock()
	return rec
}

// request is a random request: mostly one model, 1 to 3 units (up to 4 of
// the H100 that two servers have), sometimes two models at once.
func (w *workload) request(rng *rand.Rand) []api.Item {
	pick := func() modelSpec {
		total := 0
		for _, m := range w.models {
			total += m.weight
		}
		x := rng.IntN(total)
		for _, m := range w.models {
			if x < m.weight {
				return m
			}
			x -= m.weight
		}
		return w.models[0]
	}
	m := pick()
	items := []api.Item{{Model: m.name, Count: 1 + rng.IntN(min(m.maxOne, 4))}}
	if rng.IntN(10) == 0 {
		if m2 := pick(); m2.name != m.name {
			items = append(items, api.Item{Model: m2.name, Count: 1})
		}
	}
	return items
}

// otherRequest is a request that differs from items and that the cluster
// could hold: one GPU fewer or more of the first model, or another model.
func (w *workload) otherRequest(rng *rand.Rand, items []api.Item) []api.Item {
	out := slices.Clone(items)
	most := 1
	for _, m := range w.models {
		if m.name == out[0].Model {
			most = m.maxOne
		}
	}
	switch {
	case out[0].Count > 1:
		out[0].Count--
	case out[0].Count < most:
		out[0].Count++
	default:
		for _, k := range rng.Perm(len(w.models)) {
			if m := w.models[k]; m.name != out[0].Model {
				out[0] = api.Item{Model: m.name, Count: 1}
				break
			}
		}
	}
	if slices.Equal(out, items) { // a cluster of one model of one unit per server
		out = append(out, api.Item{Model: out[0].Model, Count: 1})
	}
	return out
}

func gpuArgs(items []api.Item) []string {
	var args []string
	for _, it := range items {
		args = append(args, "--gpu", it.Model+":"+strconv.Itoa(it.Count))
	}
	return args
}

func claimAddrs(c api.Claim) []string {
	out := make([]string, 0, len(c.GPUs))
	for _, g := range c.GPUs {
		out = append(out, g.PCIAddress)
	}
	slices.Sort(out)
	return out
}

// claim asks a for rec's ID with items: rec's own request (a first attempt,
// a retry, or a re-send of a held claim) or another one, which must be
// refused as a conflict. It records what it learnt and judges the answer.
func (w *workload) claim(a *agent, rec *claimRec, items []api.Item, viaCLI bool) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
	defer cancel()
	var (
		c   api.Claim
		o   outcome
		msg string
	)
	start := time.Now()
	if viaCLI {
		out, stderr, code, err := a.cli(ctx, append([]string{"claim", rec.id, "-o", "json"}, gpuArgs(items)...)...)
		o, msg = classifyCLI(code, out, stderr, err), cliMsg(code, stderr, err)
		if o == outOK {
			if err := json.Unmarshal([]byte(out), &c); err != nil {
				o = outAmbiguous
			}
		}
	} else {
		var err error
		c, err = a.client.Claim(ctx, rec.id, api.ClaimRequest{GPUs: items})
		o, msg = classify(err), answerMsg(err)
	}
	end := time.Now()
	if o == outNotFound {
		o = outAmbiguous // a claim is never "not found"
	}
	if o == outOK && c.State != api.StateClaimed {
		w.logf("claim %s through %s answered state %q, want claimed", rec.id, a.name, c.State)
		o = outAmbiguous
	}
	same := slices.Equal(items, rec.items)
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	kind := "claim"
	switch {
	case !same:
		kind = "claim-other" // another request under a held ID
	case rec.committed:
		kind = "claim-again" // a re-send of a held claim
	case rec.ambiguousClaim:
		kind = "claim-retry"
	}
	if w.h.ops[kind] == nil {
		w.h.ops[kind] = map[outcome]int{}
	}
	w.h.ops[kind][o]++
	w.h.judgeClaimLocked(rec, a.name, items, start, o, msg, c)
	if !same {
		return o
	}
	rec.lastTryEnd = end
	switch o {
	case outOK:
		if !rec.committed {
			rec.committed, rec.node, rec.gpus, rec.ackAt = true, c.Node, claimAddrs(c), end
		}
	case outAmbiguous:
		rec.ambiguousClaim = true
	case outRefused, outConflict:
		rec.refused = true
	}
	return o
}

// release frees rec; it reports whether rec should leave the held list
// (released, or its fate unknown: the final check accepts either).
func (w *workload) release(a *agent, rec *claimRec, viaCLI bool) (outcome, bool) {
	start := time.Now()
	w.h.mu.Lock()
	if rec.releaseSentAt.IsZero() {
		rec.releaseSentAt = start
	}
	w.h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	var (
		o   outcome
		msg string
	)
	if viaCLI {
		out, stderr, code, err := a.cli(ctx, "release", rec.id, "-o", "json")
		o, msg = classifyCLI(code, out, stderr, err), cliMsg(code, stderr, err)
	} else {
		_, err := a.client.Release(ctx, rec.id)
		o, msg = classify(err), answerMsg(err)
	}
	end := time.Now()
	w.h.count("release", o)
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	switch o {
	case outOK:
		if !rec.released {
			rec.released, rec.releaseAckAt = true, end
		}
		return o, true
	case outNotFound:
		if rec.ambiguousRelease || rec.released || !rec.committed {
			// An earlier release whose answer was lost did it.
			if !rec.released {
				rec.released, rec.releaseAckAt = true, end
			}
			return o, true
		}
		w.h.violateLocked("held-id-not-found", "release %s through %s answered not_found at %s (%s); it was acknowledged on %s %v at %s and never released before",
			rec.id, a.name, end.Format(timeFmt), msg, rec.node, rec.gpus, rec.ackAt.Format(timeFmt))
	case outAmbiguous:
		rec.ambiguousRelease = true // retried; the final check accepts either fate
	}
	return o, false
}

// releaseRetrying releases rec through a and, while the answer leaves the
// outcome open, through other agents (never avoid) for up to budget. It
// reports whether rec should leave the held list.
func (w *workload) releaseRetrying(rng *rand.Rand, a *agent, avoid string, rec *claimRec, viaCLI bool, budget time.Duration) bool {
	done := false
	w.retrying(rng, a, avoid, budget, func(a *agent) outcome {
		o, d := w.release(a, rec, viaCLI)
		done = d
		return o
	})
	if !done {
		w.h.mu.Lock()
		done = rec.ambiguousRelease // its fate is unknown: the final check accepts either
		w.h.mu.Unlock()
	}
	return done
}

// get reads rec back through any agent; a claim with one definitive history
// must come back as it was committed, a held one must not be "not found",
// and a released one must be gone.
func (w *workload) get(a *agent, rec *claimRec, viaCLI bool) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), getTimeout)
	defer cancel()
	var (
		c   api.Claim
		o   outcome
		msg string
	)
	start := time.Now()
	if viaCLI {
		out, stderr, code, err := a.cli(ctx, "get", rec.id, "-o", "json")
		o, msg = classifyCLI(code, out, stderr, err), cliMsg(code, stderr, err)
		if o == outOK {
			if err := json.Unmarshal([]byte(out), &c); err != nil {
				o = outAmbiguous
			}
		}
	} else {
		var err error
		c, err = a.client.Get(ctx, rec.id)
		o, msg = classify(err), answerMsg(err)
	}
	w.h.count("get", o)
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	w.h.judgeGetLocked(rec, a.name, start, o, msg, c)
	return o
}

// getUnknown reads an ID that no client ever claimed: it must never be
// found, and when strict says why it must (every fault healed; one member
// dead, all else healed) it must be "not found", not a retryable 503.
func (w *workload) getUnknown(a *agent, id string, viaCLI bool, strict string) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), getTimeout)
	defer cancel()
	var (
		o   outcome
		msg string
	)
	if viaCLI {
		out, stderr, code, err := a.cli(ctx, "get", id, "-o", "json")
		o, msg = classifyCLI(code, out, stderr, err), cliMsg(code, stderr, err)
	} else {
		_, err := a.client.Get(ctx, id)
		o, msg = classify(err), answerMsg(err)
	}
	w.h.count("get-unknown", o)
	w.h.judgeUnknown("get", id, a.name, o, msg, strict)
	return o
}

// releaseUnknown releases an ID that no client ever claimed: the same rules
// as getUnknown.
func (w *workload) releaseUnknown(a *agent, id string, viaCLI bool, strict string) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	var (
		o   outcome
		msg string
	)
	if viaCLI {
		out, stderr, code, err := a.cli(ctx, "release", id, "-o", "json")
		o, msg = classifyCLI(code, out, stderr, err), cliMsg(code, stderr, err)
	} else {
		_, err := a.client.Release(ctx, id)
		o, msg = classify(err), answerMsg(err)
	}
	w.h.count("release-unknown", o)
	w.h.judgeUnknown("release", id, a.name, o, msg, strict)
	return o
}
