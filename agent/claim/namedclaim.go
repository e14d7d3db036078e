package claim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/home"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/owner"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// The coordinator's side of the claim path through the name registry
// (docs/protocol.md, "Placing a claim"; docs/names.md): a claim ID is
// acquired before anything is reserved under it, so a retry through any
// agent finds the first grant instead of placing a second copy, and a get
// or release asks the registry where the ID is held instead of every
// server. Used whenever the agent has a registry (Agent.names); without
// one, the home directory and the every-server lookups do the job.

// api.NameTimeout bounds one call to the registry; the registry itself waits
// up to its Timing.Hold for a leader before it answers unavailable.

// placeNamed places a claim on the registry path. The owner that commits
// it holds the ID in the registry, in one write beside its ledger's commit
// (owner.commitWhileHolding), and that write is the check: most claims are of new IDs, so the claim is
// placed at once, without reading the registry before. When the ID is held
// or being placed already (a retry of a placed claim, through whichever
// agent), the owner's hold is refused, the owner drops its reservation
// without having moved a driver for it (owner.awaitHoldBeforeMoves), and
// the ID is read, linearizably: held, it is answered from its holder;
// being placed, it is waited for.
//
// While this agent's registry knows no leader, or shortly after a placement
// through this agent could not be confirmed (readNameFirst), the ID is read
// before anything is reserved instead, as a retry's first step always is:
// an unavailable registry is then a 503 naming its servers at once, not a
// reservation left waiting for a hold that cannot happen.
func (at *attempt) placeNamed(ctx context.Context) (api.Claim, error) {
	digest := owner.RequestDigest(at.rr)
	// Where the ID last ran: without any_node (and no server named), the
	// registry refuses to hold it anywhere else (owner.awaitHold with
	// recall), and the owner sends the claim back there: nothing to wait
	// for here. With any_node, that server is only tried first, a hint
	// kept by the ID's home (memory only), asked while the name is looked
	// up.
	at.rr.Recall = !at.anyNode && at.prefer == ""
	lastCh := make(chan string, 1)
	if at.rr.Recall {
		lastCh <- ""
	} else {
		go func() { lastCh <- at.lastOwner(ctx) }()
	}
	var (
		last    string
		gotLast bool
	)
	at.awaitFounding(ctx) // a new cluster's first claims wait for its registry
	readFirst := at.readNameFirst()
	for round := 0; ; round++ {
		if round > 0 || readFirst {
			c, done, err := at.lookUpName(ctx, digest, round > 0)
			if done {
				return c, err
			}
		} else {
			at.rec.ClaimLookup(events.LookupRegistry) // the owner's hold reads it
		}
		if !gotLast {
			select {
			case last = <-lastCh:
			case <-ctx.Done():
			}
			gotLast = true
		}
		at.rr.Token = 0 // the owner holds the ID at commit
		at.named = true
		c, err := at.placeRemembered(ctx, last)
		if !readFirst && (errors.Is(err, errCommitUnknown) || api.IsCode(err, api.CodeUnavailable)) {
			at.readNamesFirst()
		}
		var gb *goBack
		if err == nil || errors.Is(err, errCommitUnknown) || errors.Is(err, errRegistryDown) || errors.As(err, &gb) || ctx.Err() != nil {
			return c, err
		}
		// Before a refusal stands, the ID is read again, linearizably:
		// held or placed meanwhile (a retry through another agent that
		// took the GPUs this placement found taken), or held all along
		// (the stale read lagged), the answer is that claim or its
		// conflict, never "not available".
		if c2, done, err2 := at.lookUpName(ctx, digest, true); done {
			return c2, err2
		}
		if round == 0 && api.IsCode(err, api.CodeConflict) {
			at.log.Debug("claim ID reserved elsewhere under another placement; placing it again", "claim", at.id, "err", err)
			continue
		}
		return c, err
	}
}

// placeRemembered places the claim, sending it back to last, the server
// its ID last ran on, when one is remembered (lifecycle.go): without
// any_node the claim goes there or nowhere (coordinator.claimWhere places
// it there after the *goBack); with it, that server is tried first.
func (at *attempt) placeRemembered(ctx context.Context, last string) (api.Claim, error) {
	last = recalled(at.prefer, last)
	if last != "" && !at.anyNode {
		return api.Claim{}, &goBack{node: last}
	}
	p := *at
	if last != "" {
		p.prefer = last
	}
	c, err := p.place(ctx)
	return at.notePlaced(last, c, err)
}

// heldOn returns the claim when node holds it, committed, under this
// attempt's request.
func (at *attempt) heldOn(ctx context.Context, node string) (api.Claim, error) {
	t, ok := targetNamed(at.servers.Targets(), node)
	if !ok {
		return api.Claim{}, fmt.Errorf("claim %s: %s is not in this agent's view", at.id, node)
	}
	lctx, cancel := context.WithTimeout(ctx, api.LookupTimeout)
	defer cancel()
	c, err := t.owner.Lookup(lctx, at.id)
	if err != nil || c.State != api.StateClaimed || !at.asks(c) {
		return api.Claim{}, fmt.Errorf("claim %s is not held on %s under this request", at.id, node)
	}
	return c, nil
}

// lastOwner asks the claim ID's home which server it was last released on
// (within remember_released), or "" when it does not know or does not
// answer.
func (at *attempt) lastOwner(ctx context.Context) string {
	if at.prefer != "" || !at.servers.Clustered() {
		return ""
	}
	home := home.Of(at.id, at.view, targetName)
	dir, ok := home.owner.(api.Directory)
	if !ok {
		return ""
	}
	lctx, cancel := context.WithTimeout(ctx, api.LookupTimeout)
	defer cancel()
	ans, err := dir.LookupDirectory(lctx, at.id)
	if err != nil || ans.State == api.DirHeld {
		return ""
	}
	return ans.LastOwner
}

// lookUpName reads the claim ID in the registry. done is false when it
// is free: this attempt places it. Otherwise the answer is known: the claim
// as its holder has it (a retry of a placed claim, through any agent), or
// an error: held under another request (conflict), lost, or no answer
// (503, naming the registry servers or the holder). A name being placed by
// another coordinator (a group's, or an older agent's two-step grant) is
// waited for, as long as its lease, rather than placed a second time.
//
// A stale read, from this server's copy or the leader's, comes first: most
// claims are of free IDs, and for those a read that lags is harmless (the
// owner's hold decides). A name found there is read again linearizably
// before it is acted on, and so is every name when fresh (after an owner
// found the ID held elsewhere: a stale "free" may be what lagged).
func (at *attempt) lookUpName(ctx context.Context, digest string, fresh bool) (c api.Claim, done bool, err error) {
	key := names.Claim(at.id)
	deadline := clock.NewDeadline(at.clk, at.pendingTTL())
	defer deadline.Stop()
	mode := names.Stale
	if fresh || at.registryLeaderless() {
		// Without a known leader (a registry being founded or electing
		// one), a linearizable read waits for one before anything is
		// reserved: the owner's hold must not have to wait past the
		// reservation's lease.
		mode = names.Linearizable
	}
	for {
		lctx, cancel := context.WithTimeout(ctx, api.NameTimeout)
		rec, err := at.names().Lookup(lctx, key, mode)
		cancel()
		if !fresh && mode == names.Stale && !names.IsUnavailable(err) {
			at.rec.ClaimLookup(events.LookupRegistry) // once per claim
		}
		switch {
		case errors.Is(err, names.ErrNotFound):
			return api.Claim{}, false, nil
		case err != nil:
			return api.Claim{}, true, claimNameError(at.id, err)
		case mode == names.Stale:
			mode = names.Linearizable
			continue
		}
		switch {
		case rec.State == names.StateHeld && rec.Request != digest:
			// Held under another digest: the claim may have been
			// resized in place since, to what this request asks.
			if c, herr := at.heldOn(ctx, rec.Owner); herr == nil {
				return c, true, nil
			}
			return api.Claim{}, true, claimNameError(at.id, &names.RefusedError{Op: names.OpHold, Key: key, Code: names.CodeConflict, Record: &rec})
		case rec.State == names.StateHeld:
			c, err := at.fromHolder(ctx, rec)
			return c, true, err
		case rec.State == names.StateLost:
			return api.Claim{}, true, claimNameError(at.id, &names.RefusedError{Op: names.OpHold, Key: key, Code: names.CodeLost, Record: &rec})
		case rec.Request != digest:
			return api.Claim{}, true, claimNameError(at.id, &names.RefusedError{Op: names.OpHold, Key: key, Code: names.CodeConflict, Record: &rec})
		}
		// Being placed by another coordinator: wait for it to be held,
		// or to go (released, or lapsed), then look again.
		if _, err := at.awaitPlacement(ctx, rec, deadline); err != nil {
			return api.Claim{}, true, err
		}
	}
}

// awaitPlacement polls the registry while rec, a grant pending under
// another coordinator, stays pending: it returns the record once it is
// held, or a zero record once the name is free again (acquire again).
func (at *attempt) awaitPlacement(ctx context.Context, rec names.Record, deadline *clock.Deadline) (names.Record, error) {
	key := names.Claim(at.id)
	wait := 10 * time.Millisecond
	for {
		if deadline.Passed() {
			return names.Record{}, &api.Error{Code: api.CodeUnavailable,
				Message: fmt.Sprintf("claim %s is being placed by %s, which has not finished; retry", at.id, rec.Caller)}
		}
		select {
		case <-ctx.Done():
			return names.Record{}, ctx.Err()
		case <-clock.After(at.clk, wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
		lctx, cancel := context.WithTimeout(ctx, api.NameTimeout)
		cur, err := at.names().Lookup(lctx, key, names.Linearizable)
		cancel()
		switch {
		case errors.Is(err, names.ErrNotFound):
			return names.Record{}, nil
		case err != nil:
			return names.Record{}, claimNameError(at.id, err)
		case cur.State != names.StatePending || cur.Token != rec.Token:
			return cur, nil
		}
	}
}

// fromHolder answers a claim whose ID the registry says is held on
// rec.Owner under this request: the claim as that owner holds it. An
// owner that does not answer is a retryable 503 naming it: the claim is
// never placed a second time elsewhere.
func (at *attempt) fromHolder(ctx context.Context, rec names.Record) (api.Claim, error) {
	t, c, err := lookupHolder(ctx, at.Coordinator, at.servers.Targets(), at.id, rec.Owner, func(ctx context.Context, t Target) (api.Claim, error) {
		return t.owner.Lookup(ctx, at.id)
	})
	if err != nil {
		return api.Claim{}, err
	}
	if !at.asks(c) {
		return api.Claim{}, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("claim %s already exists on %s with a different request (%s); release it first or use another ID", at.id, c.Node, api.DescribeItems(c.Items))}
	}
	if c.State == api.StateClaimed {
		return c, nil
	}
	// Confirmed, the owner's ledger commit still to come (or its
	// coordinator gone in between): finish it.
	return at.commit(ctx, t)
}

// lookupHolder runs op on owner, the server the registry says holds claim
// id. Not in this agent's view, no answer, or no such claim in its ledger
// (a commit in progress there, or a release whose name it has not let go
// yet) are retryable 503s naming the owner; op's own refusals pass.
func lookupHolder(ctx context.Context, co *Coordinator, targets []Target, id, owner string, op func(context.Context, Target) (api.Claim, error)) (Target, api.Claim, error) {
	t, ok := targetNamed(targets, owner)
	if !ok {
		return Target{}, api.Claim{}, &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s is held on %s, which this agent does not see now (down, or not in its view yet); retry when it is back", id, owner)}
	}
	octx, cancel := context.WithTimeout(ctx, api.OwnerOpTimeout)
	c, err := op(octx, t)
	cancel()
	switch {
	case err == nil:
		return t, c, nil
	case api.IsCode(err, api.CodeNotFound):
		co.log.Warn("claim held on a server by the name registry but not in its ledger", "claim", id, "node", owner)
		return t, api.Claim{}, &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s is held on %s by the name registry, but %s's ledger does not hold it (a commit in progress, or a release whose name %s has not let go yet); retry", id, owner, owner, owner)}
	}
	return t, api.Claim{}, unanswered(ctx, id, owner, err)
}

// findNamed runs op on the server the registry says holds claim id, for
// get and release. handled is false when the registry did not answer: the
// caller then asks the owners' ledgers, as without a registry. The
// registry's "no such name" is a definite 404: no server is asked, so a
// dead member cannot turn an unknown ID into a 503.
func (co *Coordinator) findNamed(ctx context.Context, targets []Target, id string, op func(context.Context, Target) (api.Claim, error)) (c api.Claim, t Target, rec names.Record, handled bool, err error) {
	lctx, cancel := context.WithTimeout(ctx, api.NameTimeout)
	rec, err = co.names().Lookup(lctx, names.Claim(id), names.Linearizable)
	cancel()
	if names.IsUnavailable(err) {
		co.log.Info("name registry unavailable; looking the claim up on the servers", "claim", id, "err", err)
		return api.Claim{}, Target{}, rec, false, nil
	}
	co.rec.ClaimLookup(events.LookupRegistry)
	switch {
	case errors.Is(err, names.ErrNotFound):
		return api.Claim{}, Target{}, rec, true, &api.Error{Code: api.CodeNotFound,
			Message: fmt.Sprintf("claim %s not found: the name registry holds no such claim ID", id)}
	case err != nil:
		return api.Claim{}, Target{}, rec, true, claimNameError(id, err)
	}
	switch rec.State {
	case names.StatePending:
		return api.Claim{}, Target{}, rec, true, &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s is being placed by %s; retry in a moment", id, rec.Caller)}
	case names.StateLost:
		return api.Claim{}, Target{}, rec, true, lostError(rec) // agent/registry/removal.go
	}
	t, c, err = lookupHolder(ctx, co, targets, id, rec.Owner, op)
	return c, t, rec, true, err
}

// releaseHere releases a claim that this server's own ledger holds
// committed under a registry token, without reading the registry first:
// the owner's release of the name is itself conditional on this server
// holding it under that token, so when the registry lets it go
// (NameReleased) the copy released here was the one it named, as a
// linearizable lookup would have said, for one registry write instead of
// a read and a write. done is false when the shortcut does not apply (no
// such claim here, or it went meanwhile) and when the registry names
// another server's copy (NameElsewhere: here is then the leftover released
// here, and the caller releases the registry's copy as usual). Any other
// answer without the name let go (the registry did not answer, a move of
// the name in progress) is checked as after a lookup (releaseMovedAway).
func (co *Coordinator) releaseHere(ctx context.Context, id string, abort func(context.Context, Target) (api.Claim, error)) (here api.Claim, done bool, err error) {
	if co.ledger == nil {
		return api.Claim{}, false, nil
	}
	lc, err := co.ledger.Get(id)
	if err != nil || lc.State != ledger.StateCommitted || lc.NameToken == 0 {
		return api.Claim{}, false, nil
	}
	self := co.servers.Self()
	rctx, cancel := context.WithTimeout(ctx, api.OwnerOpTimeout)
	c, err := abort(rctx, self)
	cancel()
	switch {
	case api.IsCode(err, api.CodeNotFound):
		return api.Claim{}, false, nil // released meanwhile: find it as usual
	case err != nil:
		return api.Claim{}, true, unanswered(ctx, id, self.name, err)
	case c.NameReleased:
		return c, true, nil
	case c.NameElsewhere:
		return c, false, nil
	}
	rec := names.Record{State: names.StateHeld, Owner: self.name, Token: lc.NameToken,
		Request: owner.RequestDigest(api.ReserveRequest{Items: lc.Items, Labels: lc.Labels})}
	c, err = co.releaseMovedAway(ctx, co.servers.Targets(), id, self.name, rec, c, abort)
	return c, true, err
}

// releaseMovedAway makes a release free every copy: after the copy on
// from (whose name was rec) is released, the registry is read again, and
// when the name was moved away from from meanwhile (a resize that could
// not release its old copy put the name back there, before from's own
// release of the name), the copy it moved to is released too. At most a
// few rounds; a registry that does not answer the check is a 503 (retry
// the release), since the claim may still be held.
func (co *Coordinator) releaseMovedAway(ctx context.Context, targets []Target, id, from string, rec names.Record, released api.Claim, op func(context.Context, Target) (api.Claim, error)) (api.Claim, error) {
	key := names.Claim(id)
	for range 3 {
		lctx, cancel := context.WithTimeout(ctx, api.NameTimeout)
		cur, err := co.names().Lookup(lctx, key, names.Linearizable)
		cancel()
		switch {
		case errors.Is(err, names.ErrNotFound):
			return released, nil
		case err != nil:
			return api.Claim{}, &api.Error{Code: api.CodeUnavailable,
				Message: fmt.Sprintf("claim %s was released on %s, but the name registry could not say whether a move took it elsewhere meanwhile (%v); retry the release", id, from, err)}
		case cur.State != names.StateHeld || cur.Owner == from || cur.MovedFrom != from || cur.Token <= rec.Token || cur.Request != rec.Request:
			// Gone, its release on from still to come, or a new claim.
			return released, nil
		}
		co.log.Warn("claim moved away from the server it was released on; releasing it there too", "claim", id, "released_on", from, "node", cur.Owner)
		_, c, err := lookupHolder(ctx, co, targets, id, cur.Owner, op)
		if err != nil {
			return api.Claim{}, err
		}
		addrs := make([]string, 0, len(c.GPUs))
		for _, g := range c.GPUs {
			addrs = append(addrs, g.PCIAddress)
		}
		released.Warnings = append(released.Warnings, fmt.Sprintf("claim %s had been moved to %s while it was released on %s; its copy there (%s) was released too", id, cur.Owner, from, strings.Join(addrs, ", ")))
		from, rec = cur.Owner, cur
	}
	return api.Claim{}, &api.Error{Code: api.CodeUnavailable,
		Message: fmt.Sprintf("claim %s keeps moving while it is released; retry the release", id)}
}

// releaseLost frees the name of a claim whose owner was removed from the
// cluster (members remove): its GPUs went with that server.
func (co *Coordinator) releaseLost(ctx context.Context, id string, rec names.Record) (api.Claim, error) {
	rctx, cancel := context.WithTimeout(ctx, api.NameTimeout)
	defer cancel()
	if _, err := co.names().Release(rctx, names.Claim(id), rec.Token, ""); err != nil && !errors.Is(err, names.ErrNotFound) {
		if errors.Is(err, names.ErrStale) || errors.Is(err, names.ErrConflict) {
			return api.Claim{}, &api.Error{Code: api.CodeUnavailable,
				Message: fmt.Sprintf("claim %s was claimed again while its lost name was being released; retry", id)}
		}
		return api.Claim{}, claimNameError(id, err)
	}
	co.log.Warn("lost claim released: its name is free; its GPUs were on a removed server", "claim", id, "node", rec.Owner)
	return api.Claim{ID: id, Node: rec.Owner, State: api.StateLost, Items: []api.Item{}, GPUs: []api.ClaimGPU{},
		Warnings: []string{fmt.Sprintf("claim %s was held on %s, which was removed from the cluster; its GPUs went with that server and the ID is free again", id, rec.Owner)}}, nil
}

// claimNameError is the API's answer for a registry error about claim id:
// unavailable is a retryable 503 naming the registry servers that did not
// answer, never "not available"; a name held by another request is a
// conflict naming its holder.
func claimNameError(id string, err error) error {
	var (
		u *names.UnavailableError
		r *names.RefusedError
	)
	switch {
	case errors.As(err, &u):
		return &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("claim %s: %v", id, u)}
	case !errors.As(err, &r):
		return err
	}
	holder := ""
	if r.Record != nil {
		holder = r.Record.Owner
		if r.Record.State == names.StatePending || holder == "" {
			holder = r.Record.Caller
		}
	}
	switch r.Code {
	case names.CodeConflict:
		state := "held"
		if r.Record != nil && r.Record.State == names.StatePending {
			state = "being placed"
		}
		return &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("claim %s is %s on %s under a different request; release it first or use another ID", id, state, holder)}
	case names.CodeLost:
		return &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("claim %s was held on %s, which was removed from the cluster; release it first (gpuherd release %s) to free the ID, then claim it again", id, holder, id)}
	case names.CodeNotFound:
		return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("claim %s: %v", id, err)}
	case names.CodeInvalid:
		return api.Invalid("id", "claim %s: %v", id, err)
	}
	// limit, halted: the registry cannot take it now.
	return &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("claim %s: %v; retry later", id, err)}
}
