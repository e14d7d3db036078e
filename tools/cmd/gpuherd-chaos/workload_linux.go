package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
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
)

// outcome classifies an answer. Only "ok" and the definitive refusals say
// what happened; anything else (a timeout, a dead agent, a 5xx) leaves the
// claim's fate unknown, and the checks treat it so.
type outcome string

const (
	outOK           outcome = "ok"
	outNotAvailable outcome = "not_available"
	outNotFound     outcome = "not_found"
	outRefused      outcome = "refused" // invalid, conflict, lease_expired: nothing was committed
	outAmbiguous    outcome = "ambiguous"
)

// claimRec is what the run knows about one claim ID. IDs are never reused:
// each claim attempt gets a fresh ID, and only an attempt whose fate is
// unknown is retried, with the same ID and request.
type claimRec struct {
	id    string
	items []api.Item

	ambiguousClaim bool // some claim attempt's fate is unknown
	refused        bool // an attempt was definitively refused
	committed      bool // an attempt answered "claimed"
	node           string
	gpus           []string  // sorted PCI addresses
	ackAt          time.Time // when the committed answer arrived

	releaseSentAt    time.Time // first release attempt began (zero: none)
	released         bool      // a release answered ok
	ambiguousRelease bool      // a release's fate is unknown
}

// noteRelease404: `release` of a claim this run holds answered "not found",
// which callers take for "already released". An unreachable owner gives a
// retryable 503 instead; a rare case under loss and partitions still answers
// 404 and is under investigation. Counted and printed, not failed: it cannot
// break an invariant (the claim stays held, and the final check finds it).
const noteRelease404 = "FINDING release of a held claim answered not_found"

// history is shared by the claimers and read by the checks.
type history struct {
	mu   sync.Mutex
	recs map[string]*claimRec
	ops  map[string]map[outcome]int // op kind → outcome → count
	// notes are expected effects of faults that the report counts but that
	// are not violations (see docs/protocol.md).
	notes map[string]int
	// violations of the invariants, by kind, with their details.
	violations map[string]int
	details    []string
	logf       func(format string, args ...any)
}

// violate records a violation; h.mu must not be held.
func (h *history) violate(kind, format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.violateLocked(kind, format, args...)
}

func (h *history) violateLocked(kind, format string, args ...any) {
	h.violations[kind]++
	d := fmt.Sprintf("VIOLATION %s: %s", kind, fmt.Sprintf(format, args...))
	h.details = append(h.details, d)
	h.logf("%s", d)
}

func newHistory(logf func(format string, args ...any)) *history {
	return &history{recs: map[string]*claimRec{}, ops: map[string]map[outcome]int{}, notes: map[string]int{},
		violations: map[string]int{}, logf: logf}
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
		case api.CodeInvalid, api.CodeUnknownModel, api.CodeConflict, api.CodeLeaseExpired:
			return outRefused
		}
	}
	return outAmbiguous
}

// classifyCLI maps the CLI's answer by its exit code: 0 ok, 2 usage,
// 3 not available, 4 not found, 6 conflict; 5 (a server did not answer)
// and 1 are ambiguous unless the error's code, which `-o json` writes on
// stderr, says the answer is definitive (a message's wording never decides).
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
	case code == 2, code == 6:
		return outRefused
	}
	var eb api.ErrorBody
	if json.Unmarshal([]byte(stderr), &eb) == nil && eb.Error != nil {
		return classify(eb.Error)
	}
	_ = stdout
	return outAmbiguous
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
// own VMs' GPUs through random agents until told to stop.
func (w *workload) claimer(k int, rng *rand.Rand, wg *sync.WaitGroup) {
	defer wg.Done()
	var held, uncertain []*claimRec
	next := 0
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		a := w.agents[rng.IntN(len(w.agents))]
		viaCLI := rng.Float64() < w.cliShare
		r := rng.IntN(100)
		switch {
		case len(held) > 0 && (len(held) >= w.maxHeld || r < 30):
			i := rng.IntN(len(held))
			rec := held[i]
			if w.release(a, rec, viaCLI) {
				held = slices.Delete(held, i, i+1)
			}
		case len(held) > 0 && r < 40:
			w.get(a, held[rng.IntN(len(held))], viaCLI)
		case len(uncertain) > 0 && r < 50:
			i := rng.IntN(len(uncertain))
			rec := uncertain[i]
			switch w.claim(a, rec, viaCLI) {
			case outOK:
				uncertain = slices.Delete(uncertain, i, i+1)
				held = append(held, rec)
			case outRefused:
				uncertain = slices.Delete(uncertain, i, i+1)
			}
		default:
			next++
			rec := &claimRec{id: fmt.Sprintf("vm-c%d-%d", k, next), items: w.request(rng)}
			w.h.mu.Lock()
			w.h.recs[rec.id] = rec
			w.h.mu.Unlock()
			switch w.claim(a, rec, viaCLI) {
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

// claim places rec (a first attempt or a retry) and records what it learnt.
func (w *workload) claim(a *agent, rec *claimRec, viaCLI bool) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
	defer cancel()
	var (
		c api.Claim
		o outcome
	)
	if viaCLI {
		out, stderr, code, err := a.cli(ctx, append([]string{"claim", rec.id, "-o", "json"}, gpuArgs(rec.items)...)...)
		o = classifyCLI(code, out, stderr, err)
		if o == outOK {
			if err := json.Unmarshal([]byte(out), &c); err != nil {
				o = outAmbiguous
			}
		}
	} else {
		var err error
		c, err = a.client.Claim(ctx, rec.id, api.ClaimRequest{GPUs: rec.items})
		o = classify(err)
	}
	if o == outNotFound {
		o = outAmbiguous // a claim is never "not found"
	}
	if o == outOK && c.State != api.StateClaimed {
		w.logf("claim %s through %s answered state %q, want claimed", rec.id, a.name, c.State)
		o = outAmbiguous
	}
	kind := "claim"
	if rec.ambiguousClaim {
		kind = "claim-retry"
	}
	w.h.count(kind, o)
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	switch o {
	case outOK:
		rec.committed, rec.node, rec.gpus, rec.ackAt = true, c.Node, claimAddrs(c), time.Now()
	case outAmbiguous:
		rec.ambiguousClaim = true
	case outRefused:
		rec.refused = true
	}
	return o
}

// release frees rec; it reports whether rec should leave the held list
// (released, or its fate unknown: the final check accepts either).
func (w *workload) release(a *agent, rec *claimRec, viaCLI bool) bool {
	w.h.mu.Lock()
	if rec.releaseSentAt.IsZero() {
		rec.releaseSentAt = time.Now()
	}
	w.h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	var o outcome
	if viaCLI {
		out, stderr, code, err := a.cli(ctx, "release", rec.id, "-o", "json")
		o = classifyCLI(code, out, stderr, err)
	} else {
		_, err := a.client.Release(ctx, rec.id)
		o = classify(err)
	}
	w.h.count("release", o)
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	switch o {
	case outOK:
		rec.released = true
		return true
	case outNotFound:
		if rec.ambiguousRelease {
			return true // an earlier release whose answer was lost did it
		}
		// The agent asked could not find a claim this run holds.
		w.h.notes[noteRelease404]++
		w.logf("FINDING release %s through %s answered not_found; it is committed on %s and was never released", rec.id, a.name, rec.node)
	case outAmbiguous:
		rec.ambiguousRelease = true // retried later; the final check accepts either fate
	}
	return false
}

// get reads rec back through any agent; a claim with one definitive history
// must come back as it was committed.
func (w *workload) get(a *agent, rec *claimRec, viaCLI bool) {
	ctx, cancel := context.WithTimeout(context.Background(), getTimeout)
	defer cancel()
	var (
		c api.Claim
		o outcome
	)
	if viaCLI {
		out, stderr, code, err := a.cli(ctx, "get", rec.id, "-o", "json")
		o = classifyCLI(code, out, stderr, err)
		if o == outOK {
			if err := json.Unmarshal([]byte(out), &c); err != nil {
				o = outAmbiguous
			}
		}
	} else {
		var err error
		c, err = a.client.Get(ctx, rec.id)
		o = classify(err)
	}
	w.h.count("get", o)
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	switch o {
	case outOK:
		if !rec.ambiguousClaim && !rec.ambiguousRelease && (c.Node != rec.node || !slices.Equal(claimAddrs(c), rec.gpus) || c.State != api.StateClaimed) {
			w.h.violateLocked("get-mismatch", "get %s through %s: %s on %s %v, committed as %s %v", rec.id, a.name, c.State, c.Node, claimAddrs(c), rec.node, rec.gpus)
		}
	case outNotFound:
		w.h.notes["get answered not_found for a held claim (owner unreachable)"]++
	}
}
