package claim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/home"
)

// How a coordinator finds a claim ID already placed: through the ID's home
// (one request), or by asking every server of its view.

// findClaim finds the claim for get and resize: through its ID's home when
// the home knows, otherwise by asking every server.
func (co *Coordinator) findClaim(ctx context.Context, targets []Target, id string) (api.Claim, Target, error) {
	lookup := func(ctx context.Context, t Target) (api.Claim, error) { return t.owner.Lookup(ctx, id) }
	if co.names() != nil {
		if c, t, _, handled, err := co.findNamed(ctx, targets, id, lookup); handled {
			return c, t, err
		}
	}
	h, err := co.askHome(ctx, targets, id, lookup)
	if h.done {
		return h.claim, h.on, err
	}
	return co.findOnEveryServer(ctx, targets, id, true, h.unseen)
}

// homeAnswer is what asking a claim ID's home (askHome) led to.
type homeAnswer struct {
	// done: op ran on the owner the home named (or on this server, which
	// holds the claim), and claim and the error are its answer. Otherwise
	// the caller asks every server.
	done  bool
	claim api.Claim
	on    Target
	// unseen are the owners the home named that the caller's view lacks.
	unseen []string
}

// askHome asks the home of claim id where it is and runs op on the owner it
// names. done is false when the home cannot say, or says the ID is held
// nowhere, or the owner it names does not hold the claim: the caller then
// asks every server. A "not found" is never taken from the home alone: a
// caller that believes a claim gone takes its GPUs for free, and a home can
// miss an owner's notice (an owner it cannot reach while the membership
// changes); a new claim may go ahead on the home's word, a release may not.
func (co *Coordinator) askHome(ctx context.Context, targets []Target, id string, op func(context.Context, Target) (api.Claim, error)) (homeAnswer, error) {
	if !co.servers.Clustered() {
		return homeAnswer{}, nil
	}
	if c, err := co.ledger.Get(id); err == nil && c.Named() {
		// This server holds it: no need to ask where.
		self := targets[0]
		octx, cancel := context.WithTimeout(ctx, api.OwnerOpTimeout)
		c, err := op(octx, self)
		cancel()
		if err == nil || !api.IsCode(err, api.CodeNotFound) {
			co.rec.ClaimLookup(events.LookupLocal)
			return homeAnswer{done: true, claim: c, on: self}, unanswered(ctx, id, self.name, err)
		}
	}
	var unseen []string
	home := home.Of(id, targets, targetName)
	dir, ok := home.owner.(api.Directory)
	if ok {
		lctx, cancel := context.WithTimeout(ctx, api.LookupTimeout)
		ans, err := dir.LookupDirectory(lctx, id)
		cancel()
		switch {
		case err != nil:
		case ans.State == api.DirHeld:
			for _, o := range ans.Owners {
				if _, ok := targetNamed(targets, o); !ok {
					unseen = append(unseen, o)
				}
			}
			if len(ans.Owners) != 1 {
				break
			}
			if t, ok := targetNamed(targets, ans.Owners[0]); ok {
				octx, cancel := context.WithTimeout(ctx, api.OwnerOpTimeout)
				c, err := op(octx, t)
				cancel()
				if err == nil || !api.IsCode(err, api.CodeNotFound) {
					co.rec.ClaimLookup(events.LookupDirectory)
					return homeAnswer{done: true, claim: c, on: t}, unanswered(ctx, id, t.name, err)
				}
			}
		}
	}
	co.rec.ClaimLookup(events.LookupEveryServer)
	return homeAnswer{unseen: unseen}, nil
}

// unanswered is an owner's failure to answer an operation on claim id as
// the client sees it: a retryable 503 naming the owner (whether the
// operation took effect there is unknown), unless it is the owner's own
// answer or the caller gave up.
func unanswered(ctx context.Context, id, node string, err error) error {
	var e *api.Error
	switch {
	case err == nil, errors.As(err, &e) && !e.ServerFault():
		return err
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return &api.Error{Code: api.CodeUnavailable,
		Message: fmt.Sprintf("claim %s is held on %s, and %s did not answer (%v); retry when it is back (if it will not come back, gpuherd members remove %s makes its claims lost)", id, node, node, err, node)}
}

// findOnEveryServer looks claim id up on every server of targets and
// returns the copy to use, wherever it is held. When no server has it but
// some did not answer, strict callers (get, release) get a retryable 503
// rather than a "not found" that would let them believe the GPUs are free;
// a new claim (not strict) goes ahead. unseen are owners the ID's home
// named that targets lack (this agent's gossip has not brought them yet,
// as after many servers started at once): for a strict caller, a claim
// held there is not "not found" either.
func (co *Coordinator) findOnEveryServer(ctx context.Context, targets []Target, id string, strict bool, unseen []string) (api.Claim, Target, error) {
	hits, unanswered := co.allCopies(ctx, targets, id)
	if len(hits) == 0 {
		if strict && len(unanswered) > 0 {
			return api.Claim{}, Target{}, &api.Error{Code: api.CodeUnavailable,
				Message: fmt.Sprintf("claim %s: no server that answered holds it, and %s did not answer, so it may be held there; retry when they are back (a server that will not come back: gpuherd members remove NODE)", id, strings.Join(unanswered, ", "))}
		}
		names := make([]string, len(targets))
		for i, t := range targets {
			names[i] = t.name
		}
		if strict {
			// Rare, and worth seeing: a caller is about to believe the GPUs free.
			co.log.Info("claim not found on any server", "claim", id, "asked", names, "members", co.memberStates())
		}
		if strict && len(unseen) > 0 {
			return api.Claim{}, Target{}, &api.Error{Code: api.CodeUnavailable,
				Message: fmt.Sprintf("claim %s: its home says %s holds it, a server this agent does not see (stopped, or not in its gossip view yet); retry, or ask through another agent", id, strings.Join(unseen, ", "))}
		}
		return api.Claim{}, Target{}, &api.Error{Code: api.CodeNotFound,
			Message: fmt.Sprintf("claim %s not found on any server", id)}
	}
	if len(hits) > 1 {
		var nodes []string
		for _, h := range hits {
			nodes = append(nodes, h.t.name+"="+h.c.State)
		}
		co.log.Warn("claim held on several servers", "claim", id, "copies", nodes)
	}
	return hits[0].c, hits[0].t, nil
}

// allCopies looks for the claim on every server of the view, in parallel,
// and returns every copy, the one to keep first, and the servers that did
// not answer: those of the view whose lookup failed, and the members gossip
// knows now (except those that left) that were not asked.
func (co *Coordinator) allCopies(ctx context.Context, targets []Target, id string) ([]copyOf, []string) {
	var (
		mu         sync.Mutex
		hits       []copyOf
		unanswered []string
		wg         sync.WaitGroup
	)
	for _, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lctx, cancel := context.WithTimeout(ctx, api.LookupTimeout)
			defer cancel()
			c, err := t.owner.Lookup(lctx, id)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				hits = append(hits, copyOf{c, t})
			case !api.IsCode(err, api.CodeNotFound):
				co.log.Debug("lookup failed", "claim", id, "node", t.name, "err", err)
				unanswered = append(unanswered, t.name)
			}
		}()
	}
	wg.Wait()
	if co.servers.Clustered() {
		asked := make([]string, len(targets))
		for i, t := range targets {
			asked[i] = t.name
		}
		unanswered = append(unanswered, co.servers.Unasked(asked)...)
	}
	slices.SortFunc(hits, before)
	slices.Sort(unanswered)
	return hits, unanswered
}

// copyOf is one server's copy of a claim.
type copyOf struct {
	c api.Claim
	t Target
}

// before orders the copies of one claim ID so that every agent picks the
// same one: a committed copy before a reservation, then the earliest
// commit, then the server name.
func before(x, y copyOf) int {
	if xc, yc := x.c.State == api.StateClaimed, y.c.State == api.StateClaimed; xc != yc {
		if xc {
			return -1
		}
		return 1
	}
	if c := x.c.CommittedAt.Compare(y.c.CommittedAt); c != 0 {
		return c
	}
	return strings.Compare(x.t.name, y.t.name)
}

// memberStates is the gossip view in one line, for logs.
func (co *Coordinator) memberStates() string { return co.servers.MemberStates() }
