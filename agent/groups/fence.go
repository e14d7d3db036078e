package groups

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/claim"
	"github.com/gpuherd/gpuherd/agent/names"
)

// One group operation at a time. A group operation runs to its end even
// when its client gives up (groupContext), so that a create, resize or
// delete never stops half-way because a connection dropped. But a client
// that gave up retries, through another agent, and goes on to its next
// operation: an operation whose agent was frozen or cut off, and that
// wakes up later, would otherwise go on acting on the group behind the
// newer operations' backs — place a node of a group deleted meanwhile, or
// put back a node that a newer resize changed.
//
// So every operation that changes a group's nodes stamps the group's
// registry record as it begins (names.Registry.Stamp: the record's Index
// becomes that write's raft index), and reads the record again before
// each node it changes: a record that is gone, granted anew, or stamped
// by another operation means this one was overtaken. It then stops where
// it is and leaves the group to the newer operation; nodes it placed for
// a group deleted meanwhile are released, since nobody else will. The
// window left is one node's step: an operation that read its stamp just
// before it was overtaken still finishes the step it began.

// Stamper is what fencing needs of the name authority beyond Names
// (*names.Registry has it).
type Stamper interface {
	Stamp(ctx context.Context, key names.Key, token uint64) (names.Record, error)
}

var _ Stamper = (*names.Registry)(nil)

// groupFence is one group operation's claim to act on the group: the
// group's token, and the Index of the record as this operation last wrote
// it. A zero index fences nothing (groups kept in record files, or a name
// authority that cannot stamp).
type groupFence struct {
	gs    *Groups
	name  string
	token uint64
	index uint64
}

// fenceOf is the fence of an operation that wrote e's record itself (a
// create, which confirmed the name): its Index is the operation's own.
func (gs *Groups) fenceOf(e groupEntry) *groupFence {
	return &groupFence{gs: gs, name: e.rec.Name, token: e.token, index: e.index}
}

// beginGroupOp stamps group e for an operation that begins now, and
// returns the group as the stamped record has it, with the operation's
// fence. Every older operation on the group stops at its next step.
func (gs *Groups) beginGroupOp(ctx context.Context, e groupEntry) (groupEntry, *groupFence, error) {
	st, ok := gs.names().(Stamper)
	if !ok || e.token == 0 {
		return e, &groupFence{gs: gs, name: e.rec.Name}, nil
	}
	r, err := st.Stamp(ctx, names.Group(e.rec.Name), e.token)
	var re *names.RefusedError
	switch {
	case errors.As(err, &re) && (re.Code == names.CodeNotFound || re.Code == names.CodeStale):
		return groupEntry{}, nil, &api.Error{Code: api.CodeNotFound,
			Message: fmt.Sprintf("group %s not found: it was deleted as this operation began (group create %s makes it again)", e.rec.Name, e.rec.Name)}
	case err != nil:
		return groupEntry{}, nil, claim.RegistryError(err, "group "+e.rec.Name)
	}
	fresh, err := groupEntryOf(r)
	if err != nil {
		return groupEntry{}, nil, err
	}
	fresh.where, fresh.kubernetes = e.where, e.kubernetes
	return fresh, &groupFence{gs: gs, name: e.rec.Name, token: r.Token, index: r.Index}, nil
}

// startGroupOp reads group name, stamps it for an operation that begins
// now and reads its nodes: the start of a resize or a delete.
func (gs *Groups) startGroupOp(ctx context.Context, name string) (groupState, *groupFence, error) {
	if err := validateGroupName(name); err != nil {
		return groupState{}, nil, err
	}
	e, err := gs.readGroup(ctx, name)
	if err != nil {
		return groupState{}, nil, err
	}
	e, f, err := gs.beginGroupOp(ctx, e)
	if err != nil {
		return groupState{}, nil, err
	}
	s, err := gs.readNodes(ctx, e)
	return s, f, err
}

// groupOvertaken is the error of an operation that found its group
// changed by a newer operation (or deleted) between two of its steps.
type groupOvertaken struct {
	name string
	// gone: the group was deleted (or deleted and created again).
	gone bool
}

func (e *groupOvertaken) Error() string {
	if e.gone {
		return fmt.Sprintf("group %s was deleted while this operation ran", e.name)
	}
	return fmt.Sprintf("group %s was changed by a newer operation (through another agent, as a client's retry does) while this one ran", e.name)
}

// check reads the group's record, linearizably, and reports whether this
// operation may take its next step: nil, a *groupOvertaken, or the
// registry's failure to answer (the operation cannot know, and stops).
func (f *groupFence) check(ctx context.Context) error {
	if f == nil || f.index == 0 {
		return nil
	}
	r, err := f.gs.names().Lookup(ctx, names.Group(f.name), names.Linearizable)
	switch {
	case errors.Is(err, names.ErrNotFound):
		return &groupOvertaken{name: f.name, gone: true}
	case err != nil:
		return claim.RegistryError(err, "group "+f.name)
	case r.Token != f.token:
		return &groupOvertaken{name: f.name, gone: true}
	case r.Index != f.index:
		return &groupOvertaken{name: f.name}
	}
	return nil
}

// stopped is the answer of an operation that stops at a failed check
// (err), having placed placed itself. Nodes placed for a group deleted
// meanwhile are released: the delete could not see them, and nobody else
// will release them. For a group a newer operation took over they stay,
// for that operation to count on.
func (f *groupFence) stopped(ctx context.Context, err error, done string, placed []api.Claim) error {
	var ov *groupOvertaken
	if !errors.As(err, &ov) {
		return api.Annotate(err, "group %[2]s: %[1]s; this operation stopped (%[3]s): see group get %[2]s, then retry", f.name, done)
	}
	if !ov.gone {
		f.gs.log.Warn("group operation overtaken by a newer one; stopping", "group", f.name, "done", done)
		return &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("%v; this one stopped (%s) and left the group to it: see group get %s", ov, done, f.name)}
	}
	var kept []string
	for _, c := range placed {
		if _, rerr := f.gs.claims.Release(context.WithoutCancel(ctx), c.ID); rerr != nil && !api.IsCode(rerr, api.CodeNotFound) {
			kept = append(kept, fmt.Sprintf("%s on %s (%v)", c.ID, c.Node, rerr))
		}
	}
	f.gs.log.Warn("group deleted while an operation on it ran; stopping", "group", f.name, "done", done, "released", len(placed)-len(kept))
	msg := fmt.Sprintf("%v; this one stopped (%s)", ov, done)
	if len(placed) > 0 {
		msg += "; the nodes it had placed were released"
	}
	if len(kept) > 0 {
		return &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("%v; this one stopped (%s), and these nodes it placed could not be released: %s; release them with gpuherd release ID", ov, done, strings.Join(kept, "; "))}
	}
	return &api.Error{Code: api.CodeNotFound, Message: msg}
}
