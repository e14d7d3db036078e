package dst

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/names"
)

// registry is the name registry as the agents see it: one state machine
// without raft (names.NewLocal), behind raft's guarantees, with raft's
// faults injected around it. A call is answered; or unavailable without
// being applied (no leader: downUntil, or its request lost); or applied
// with its answer lost (a leader that committed the entry and died before
// answering, RegUncertain in world.deliver, or the answer dropped on the
// way).
type registry struct {
	w    *world
	base *names.Registry

	mu        sync.Mutex
	downUntil time.Time
	history   []regOp
	calls     uint64 // the history's clock: calls and returns, in order
	ops       int
}

// regIn is one registry operation as the porcupine model reads it.
type regIn struct {
	Op      string // acquire, confirm, hold, release, lookup, move, list
	Key     string
	Caller  string
	Request string
	Token   uint64
	Node    string // the owner, holder, or a move's From
	To      string // a move's target
	// Now is the registry's time when it applied the call, since the
	// schedule's start, to the nanosecond as its clock reads it: a
	// rounded time puts two commands of one millisecond in no order (a
	// hold refused a little before the remembered run it hit ends reads
	// as one at its end).
	Now   time.Duration
	Lease time.Duration
	// Recall (hold) and Remember (release): remembered runs.
	Recall   bool
	Remember time.Duration
}

// regOp is one operation in the registry's history: called at Call, its
// answer seen at Return (or never: Unknown).
type regOp struct {
	In           regIn
	Out          names.Result
	Found        bool
	Unknown      bool
	Call, Return uint64
}

func (r *registry) down() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Now().Before(r.downUntil)
}

// front is node i's handle on the registry: each call a message to it.
func (r *registry) front(i, gen int) *names.Registry {
	return r.base.Front(func(ctx context.Context, req names.Request, apply func(names.Request) (names.Result, error)) (names.Result, error) {
		return r.call(ctx, i, gen, req, apply)
	})
}

type regAnswer struct {
	res names.Result
	err error
}

func (r *registry) call(ctx context.Context, i, gen int, req names.Request, apply func(names.Request) (names.Result, error)) (names.Result, error) {
	w := r.w
	h := r.record(req)
	// A raft client gives up on a call after Timing.Hold whatever its
	// context: so does the simulation's.
	ctx, cancel := context.WithTimeout(ctx, names.LANTiming().Hold)
	defer cancel()
	desc := fmt.Sprintf("registry %s %s caller=%s owner=%s node=%s token=%d req=%s", req.Op, req.Key.Name, req.Caller, req.Owner, req.Node, req.Token, req.Request)
	ans, ok := w.call(ctx, i, gen, len(w.nodes), desc, func(context.Context) any {
		if r.down() {
			return noReply{} // no leader: nothing applied, no answer
		}
		r.mu.Lock()
		r.history[h].In.Now = time.Since(w.start) // the registry's clock (sim.go)
		r.ops++
		r.mu.Unlock()
		if w.cfg.BrokenGrants && (req.Op == names.OpConfirm || req.Op == names.OpHold) {
			return brokenGrant(req, apply)
		}
		res, err := apply(req)
		w.logf("registry %s %s by %s (token %d, req %s): %s %s %v", req.Op, req.Key.Name, w.name(i), req.Token, req.Request, res.Code, recText(res.Record), err)
		return regAnswer{res, err}
	})
	if !ok {
		return names.Result{}, &names.UnavailableError{Op: req.Op, Key: req.Key, Uncertain: true,
			Reason: "no answer from the registry (simulated network)"}
	}
	a := ans.(regAnswer)
	r.mu.Lock()
	r.calls++
	op := &r.history[h]
	op.Out, op.Unknown, op.Return = a.res, false, r.calls
	op.Found = a.res.Code == names.CodeOK && a.res.Record != nil
	r.mu.Unlock()
	return a.res, a.err
}

// record notes a call in the history, open until its answer comes.
func (r *registry) record(req names.Request) int {
	in := regIn{Op: string(req.Op), Key: req.Key.Name, Caller: req.Caller, Request: req.Request, Token: req.Token,
		Lease: time.Duration(r.w.cfg.NameLease) * time.Millisecond, Recall: req.Recall, Remember: req.Remember}
	switch req.Op {
	case names.OpConfirm, names.OpHold:
		in.Node = req.Owner
	case names.OpRelease:
		in.Node = req.Node
	case names.OpMove:
		in.Node, in.To = req.Owner, req.To
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	r.history = append(r.history, regOp{In: in, Call: r.calls, Unknown: true})
	return len(r.history) - 1
}

// expire is the leader's expiry of lapsed pending names, every second
// while the registry has a leader.
func (r *registry) expire(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !r.down() {
				_, _ = r.base.ExpirePending(ctx)
			}
		}
	}
}

func recText(r *names.Record) string {
	if r == nil {
		return ""
	}
	return fmt.Sprintf("[%s owner=%s caller=%s token=%d]", r.State, r.Owner, r.Caller, r.Token)
}

// brokenGrant acknowledges a hold or a confirm without applying it: the
// registry of Config.BrokenGrants.
func brokenGrant(req names.Request, apply func(names.Request) (names.Result, error)) any {
	rec := names.Record{Kind: req.Key.Kind, Name: req.Key.Name, State: names.StateHeld, Owner: req.Owner,
		Caller: req.Caller, Request: req.Request, Token: req.Token}
	if res, err := apply(names.Request{Op: names.OpLookup, Key: req.Key}); err == nil && res.Record != nil {
		rec = *res.Record
		rec.State, rec.Owner = names.StateHeld, req.Owner
	}
	if rec.Token == 0 {
		rec.Token = 1 << 40 // a token no grant had
	}
	return regAnswer{names.Result{Code: names.CodeOK, Record: &rec}, nil}
}

// handedBack reports whether a server moved claim id's name back to
// another on its own (a move whose caller is the name's holder: the
// anti-entropy pass handing a moved name back to the server it came from).
func (r *registry) handedBack(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, op := range r.history {
		if op.In.Op == string(names.OpMove) && op.In.Key == id && op.In.Caller == op.In.Node {
			return true
		}
	}
	return false
}
