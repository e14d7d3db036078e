package dst

import (
	"fmt"
	"time"

	"github.com/gpuherd/gpuherd/agent/names"
)

// registry is the name registry as the agents see it: the real state
// machine behind raft's guarantees, which the simulation injects. A call
// is answered; or unavailable without being applied (no leader, the
// registry's majority cut off: regDownUntil, or its request lost); or
// applied with its answer lost (a leader that committed the entry and
// died before answering, or the answer dropped on the way).
type registry struct {
	w            *world
	m            *names.Machine
	downUntil    int64
	history      []regOp
	lookups, ops int
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
	Now     int64
	Lease   int64
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

func (r *registry) record(in regIn) int {
	r.w.seq++
	r.history = append(r.history, regOp{In: in, Call: r.w.seq, Unknown: true})
	return len(r.history) - 1
}

// do runs in on behalf of node n and hands cont its answer, or ok false
// when n cannot know whether it took effect.
func (r *registry) do(n int, in regIn, cont func(res names.Result, found, ok bool)) {
	w := r.w
	h := r.record(in)
	in.Now = w.now
	r.history[h].In.Now = w.now
	w.call(n, len(w.nodes), w.cfg.RegTimeout, func(reply func(any)) {
		if w.now < r.downUntil {
			return // no leader: nothing applied, no answer
		}
		res, found := r.apply(in)
		if in.Op != "list" {
			w.logf("registry %s %s by %s (token %d, req %s): %s %s", in.Op, in.Key, w.name(n), in.Token, in.Request, res.Code, recText(res.Record))
		}
		if w.faulty && w.rng.Float64() < w.cfg.RegUncertain {
			return // committed, but the answer is lost with its leader
		}
		reply(regAnswer{res, found})
	}, func(ans any, ok bool) {
		if !ok {
			cont(names.Result{}, false, false)
			return
		}
		a := ans.(regAnswer)
		w.seq++
		r.history[h].Out, r.history[h].Found, r.history[h].Unknown, r.history[h].Return = a.res, a.found, false, w.seq
		cont(a.res, a.found, true)
	})
}

type regAnswer struct {
	res   names.Result
	found bool
}

func (r *registry) apply(in regIn) (names.Result, bool) {
	key := names.Claim(in.Key)
	now := epoch0.Add(time.Duration(in.Now) * time.Millisecond)
	switch in.Op {
	case "acquire":
		r.ops++
		return r.m.Acquire(key, in.Caller, in.Request, now, time.Duration(in.Lease)*time.Millisecond), true
	case "confirm":
		r.ops++
		return r.m.Confirm(key, in.Token, in.Node, now), true
	case "hold":
		r.ops++
		return r.m.Hold(key, in.Caller, in.Node, in.Request, false, now), true
	case "release":
		r.ops++
		return r.m.Release(key, in.Token, in.Node), true
	case "move":
		r.ops++
		return r.m.Move(key, in.Token, in.Node, in.To, in.Caller, now, time.Duration(in.Lease)*time.Millisecond), true
	case "lookup":
		r.lookups++
		// A linearizable read sees the registry's clock as of its last
		// write; the leader's expiry pass collects lapsed pending names.
		r.m.Expire(now)
		rec, ok := r.m.Lookup(key)
		if !ok {
			return names.Result{Code: names.CodeNotFound}, false
		}
		return names.Result{Code: names.CodeOK, Record: &rec}, true
	case "list":
		// The anti-entropy pass's linearizable list of the claim names
		// held on one server.
		r.m.Expire(now)
		var out []names.Record
		for _, rec := range r.m.Records() {
			if rec.Kind == names.KindClaim && rec.Owner == in.Node && rec.State == names.StateHeld {
				out = append(out, rec)
			}
		}
		return names.Result{Code: names.CodeOK, Records: out}, true
	}
	panic("unknown registry op " + in.Op)
}

func recText(r *names.Record) string {
	if r == nil {
		return ""
	}
	return fmt.Sprintf("[%s owner=%s caller=%s token=%d]", r.State, r.Owner, r.Caller, r.Token)
}
