package dst

import (
	"fmt"
	"math"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/gpuherd/gpuherd/agent/names"
)

// The porcupine model of one claim name's register, checked over the
// registry calls of a schedule (answered or not). It is written from
// docs/names.md's rules, not from state.go: a grant's token is above every
// token seen before it, a live name is answered to its own request only,
// a hold makes a free name held on its owner in one step,
// a pending name lapses at its deadline by the registry's time (which
// is within slack of the command's), a confirm needs the current token, a release the
// current token and holder. A grant whose answer was lost has an unknown
// token (0) until an answer shows it.
type nameReg struct {
	Exists   bool
	Held     bool
	Req      string
	Caller   string
	Owner    string
	Token    uint64
	Deadline time.Duration
	Last     uint64 // the highest token seen
	// RanOn and RanUntil: a release that remembered where the claim ran
	// (docs/names.md, remembered runs): until RanUntil a hold with recall
	// on another server is refused.
	RanOn    string
	RanUntil time.Duration
}

type modelOut struct {
	Unknown bool
	Code    names.Code
	Found   bool
	Rec     names.Record
}

// slack bounds how far the registry's time can be ahead of the time a
// command carries: it applies it within a network delay of sending, and
// its time is the latest any command carried.
const slack = time.Second

// lapsed says whether the pending name has surely lapsed for in, and
// whether it may have (the registry's clock is between the command's
// time and slack past it; a release carries no time at all).
func (s nameReg) lapsed(in regIn) (surely, maybe bool) {
	if !s.Exists || s.Held {
		return false, false
	}
	return in.Op != "release" && s.Deadline <= in.Now, s.Deadline <= in.Now+slack
}

// learn checks a token an answer shows for the current grant, and takes
// it when the grant's token was not known yet.
func (s nameReg) learn(t uint64) (nameReg, bool) {
	if s.Token == 0 {
		if t <= s.Last {
			return s, false
		}
		s.Token, s.Last = t, t
		return s, true
	}
	return s, t == s.Token
}

// shows checks that rec is the current record.
func (s nameReg) shows(rec names.Record) (nameReg, bool) {
	want := names.StatePending
	if s.Held {
		want = names.StateHeld
		if rec.Owner != s.Owner {
			return s, false
		}
	}
	if rec.State != want || rec.Request != s.Req || rec.Caller != s.Caller {
		return s, false
	}
	return s.learn(rec.Token)
}

func (s nameReg) gone() nameReg { return nameReg{Last: s.Last, RanOn: s.RanOn, RanUntil: s.RanUntil} }

// grant checks the answer to an acquire or a hold that makes s the state
// (from was the state before): want, showing s, or never seen.
func (s nameReg) grant(from nameReg, out modelOut, want names.Code) (bool, nameReg) {
	if out.Unknown {
		return true, s
	}
	if out.Code != want {
		return false, from
	}
	s2, ok := s.shows(out.Rec)
	return ok, s2
}

func stepName(s nameReg, in regIn, out modelOut) (bool, nameReg) {
	code := func(c names.Code) bool { return out.Unknown || out.Code == c }
	surely, maybe := s.lapsed(in)
	// A pending name that may have lapsed is taken as lapsed when the
	// answer says so (or must be, for an answer never seen).
	if surely || (maybe && !out.Unknown && lapseShown(in, out)) {
		if in.Op == "confirm" && s.Token != 0 && s.Token != in.Token {
			return code(names.CodeStale), s
		}
		if in.Op == "confirm" {
			return out.Unknown || out.Code == names.CodeExpired || out.Code == names.CodeNotFound, s.gone()
		}
		s = s.gone()
	}
	if s.Exists && !out.Unknown && (out.Code == names.CodeStale || out.Code == names.CodeConflict) && out.Rec.Token != 0 {
		// A refusal shows the current token: one of a grant whose
		// answer was lost is learnt from it.
		var ok bool
		if s, ok = s.learn(out.Rec.Token); !ok {
			return false, s
		}
	}
	switch in.Op {
	case "lookup":
		if !s.Exists {
			return out.Unknown || !out.Found, s
		}
		if out.Unknown {
			return true, s
		}
		if !out.Found {
			return false, s
		}
		s2, ok := s.shows(out.Rec)
		return ok, s2
	case "acquire":
		if s.Exists {
			if s.Req != in.Request {
				return code(names.CodeConflict), s
			}
			return s.grant(s, out, names.CodeSame)
		}
		n := nameReg{Exists: true, Req: in.Request, Caller: in.Caller, Deadline: in.Now + in.Lease, Last: s.Last, RanOn: s.RanOn, RanUntil: s.RanUntil}
		return n.grant(s, out, names.CodeOK)
	case "hold":
		if s.Exists {
			if s.Req != in.Request || !s.Held || s.Owner != in.Node {
				return code(names.CodeConflict), s
			}
			return s.grant(s, out, names.CodeSame)
		}
		if in.Recall && s.RanOn != "" && s.RanOn != in.Node && in.Now < s.RanUntil {
			return code(names.CodeRecalled), s
		}
		// A new hold forgets where the claim ran: its next release says.
		n := nameReg{Exists: true, Held: true, Req: in.Request, Caller: in.Caller, Owner: in.Node, Last: s.Last}
		return n.grant(s, out, names.CodeOK)
	case "confirm":
		switch {
		case !s.Exists:
			return code(names.CodeNotFound), s
		case s.Token != 0 && s.Token != in.Token:
			return code(names.CodeStale), s
		case !s.Held:
			if s.Token == 0 && in.Token <= s.Last {
				return code(names.CodeStale), s
			}
			s.Token, s.Last = in.Token, max(s.Last, in.Token)
			s.Held, s.Owner = true, in.Node
			return code(names.CodeOK), s
		case s.Owner != in.Node:
			return code(names.CodeConflict), s
		}
		return code(names.CodeSame), s
	case "release":
		holder := s.Caller
		if s.Held {
			holder = s.Owner
		}
		switch {
		case !s.Exists:
			return code(names.CodeNotFound), s
		case s.Token != 0 && in.Token != 0 && in.Token != s.Token:
			return code(names.CodeStale), s
		case in.Node != "" && in.Node != holder:
			return code(names.CodeConflict), s
		}
		s.Last = max(s.Last, in.Token)
		wasHeld := s.Held
		s = s.gone()
		s.RanOn, s.RanUntil = "", 0
		if in.Remember > 0 && wasHeld {
			s.RanOn, s.RanUntil = holder, in.Now+in.Remember
		}
		return code(names.CodeOK), s
	}
	return false, s
}

// lapseShown reports whether an answer shows its pending name lapsed.
func lapseShown(in regIn, out modelOut) bool {
	switch in.Op {
	case "lookup":
		return !out.Found
	case "acquire", "hold":
		return out.Code == names.CodeOK
	case "confirm":
		return out.Code == names.CodeExpired || out.Code == names.CodeNotFound
	case "release":
		return out.Code == names.CodeNotFound
	}
	return false
}

var nameModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(regIn).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return nameReg{} },
	Step: func(st, in, out any) (bool, any) {
		return stepName(st.(nameReg), in.(regIn), out.(modelOut))
	},
	DescribeOperation: func(in, out any) string {
		i, o := in.(regIn), out.(modelOut)
		if o.Unknown {
			return fmt.Sprintf("%s %s by %s%s token %d: unknown", i.Op, i.Key, i.Caller, i.Node, i.Token)
		}
		return fmt.Sprintf("%s %s by %s%s token %d: %s %s", i.Op, i.Key, i.Caller, i.Node, i.Token, o.Code, recText(&o.Rec))
	},
}

// checkHistory checks a schedule's registry history against the model.
func checkHistory(h []regOp, timeout time.Duration) (porcupine.CheckResult, []string) {
	// The model has no moves: a name that was moved is left out.
	moved := map[string]bool{}
	for _, op := range h {
		if op.In.Op == "move" {
			moved[op.In.Key] = true
		}
	}
	ops := make([]porcupine.Operation, 0, len(h))
	for i, op := range h {
		if op.In.Op == "list" || moved[op.In.Key] {
			continue // a list reads many names; its expiry pass the model allows for
		}
		out := modelOut{Unknown: op.Unknown, Code: op.Out.Code, Found: op.Found}
		if op.Out.Record != nil {
			out.Rec = *op.Out.Record
		}
		ret := int64(op.Return)
		if op.Unknown {
			ret = math.MaxInt64
		}
		ops = append(ops, porcupine.Operation{ClientId: i, Input: op.In, Call: int64(op.Call), Output: out, Return: ret})
	}
	res := porcupine.CheckOperationsTimeout(nameModel, ops, timeout)
	if res == porcupine.Illegal {
		return res, []string{"the registry's history is not linearizable against the name-register model"}
	}
	return res, nil
}
