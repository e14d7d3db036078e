package names

import (
	"context"
	"fmt"
)

// OpList reads the records that match a Filter. Like OpLookup it is not a
// log entry: a linearizable list is answered by the leader after it has
// confirmed its leadership, a stale one by any server from its own copy.
const OpList Op = "list"

// maxListed bounds one list's answer: an owner holds at most
// Limits.HeldPerOwner names, and the lost names of every removed server
// together are rarely more. A list cut at the bound says so (Truncated).
const maxListed = 10000

// Filter selects records for List. Empty fields match everything.
type Filter struct {
	Kind  Kind   `json:"kind,omitempty"`
	Owner string `json:"owner,omitempty"`
	State State  `json:"state,omitempty"`
}

func (f Filter) match(r Record) bool {
	return (f.Kind == "" || r.Kind == f.Kind) &&
		(f.Owner == "" || r.Owner == f.Owner) &&
		(f.State == "" || r.State == f.State)
}

func (f Filter) validate() error {
	switch f.Kind {
	case "", KindClaim, KindGroup:
	default:
		return fmt.Errorf("list: unknown kind %q", f.Kind)
	}
	switch f.State {
	case "", StatePending, StateHeld, StateLost:
	default:
		return fmt.Errorf("list: no record is in state %q", f.State)
	}
	if f.Owner != "" {
		if err := checkNode("owner", f.Owner); err != nil {
			return fmt.Errorf("list: %w", err)
		}
	}
	return nil
}

// Listing is what List answers.
type Listing struct {
	Records []Record
	// Truncated: more records matched than one answer carries.
	Truncated bool
}

// List returns the live records that match f, sorted by key: an owner's
// names for its anti-entropy pass (Filter{Owner: node}), the names of
// removed servers for the claim list (Filter{State: StateLost}).
func (r *Registry) List(ctx context.Context, f Filter, mode ReadMode) (Listing, error) {
	res, err := r.do(ctx, Request{Op: OpList, Filter: &f, Stale: bool(mode)})
	if err != nil {
		return Listing{}, err
	}
	if res.Code != CodeOK {
		return Listing{}, refused(OpList, Key{}, res)
	}
	return Listing{Records: res.Records, Truncated: res.Truncated}, nil
}

// isRead reports whether op only reads: it is never logged, a stale one
// is answered from any copy, and an unanswered one leaves nothing
// uncertain.
func isRead(op Op) bool { return op == OpLookup || op == OpList }

// readLocal answers a read from this server's copy.
func (r *Registry) readLocal(req Request) (Result, error) {
	if req.Op == OpList {
		return r.listLocal(req.Filter)
	}
	return r.lookupLocal(req.Key)
}

func (r *Registry) listLocal(f *Filter) (Result, error) {
	if f == nil {
		f = &Filter{}
	}
	if err := f.validate(); err != nil {
		return Result{}, &RefusedError{Op: OpList, Code: CodeInvalid, Detail: err.Error()}
	}
	recs, truncated, err := r.fsm.List(*f, maxListed)
	if err != nil {
		return Result{}, &RefusedError{Op: OpList, Code: CodeHalted, Detail: err.Error()}
	}
	return Result{Code: CodeOK, Records: recs, Truncated: truncated}, nil
}

// List returns up to limit live records that match f, sorted by key, and
// whether more matched.
func (f *FSM) List(flt Filter, limit int) ([]Record, bool, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.halted != nil {
		return nil, false, f.halted
	}
	var keys []Key
	for k, r := range f.st.records {
		if r.live(f.st.now) && flt.match(r) {
			keys = append(keys, k)
		}
	}
	sortKeys(keys)
	truncated := len(keys) > limit
	if truncated {
		keys = keys[:limit]
	}
	out := make([]Record, len(keys))
	for i, k := range keys {
		// As a lookup reads it: a move past its deadline is gone.
		out[i] = f.st.records[k].at(f.st.now)
	}
	return out, truncated, nil
}
