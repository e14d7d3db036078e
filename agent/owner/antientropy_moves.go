package owner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
)

// The anti-entropy rules for what a move cut short leaves behind
// (docs/protocol.md, "Anti-entropy"). A resize move commits the new copy
// before it releases the old one; when the old copy cannot be released
// and the undo fails, both copies stay, and the name is on one of them.
// The rules below settle such a pair without ever freeing the copy a
// client was told about:
//
//   - a name held here with no claim, which came here by a move, is
//     handed back to the server it came from (whose copy may be the only
//     one), asked to take it at once, and released only once that server
//     answers that it holds no copy;
//   - a committed copy here whose name is moving here takes it (confirms
//     the move as this server);
//   - a committed copy whose name was released (its ledger has a name
//     token, the registry no name) is a leftover of a released claim, and
//     is released like a duplicate: never adopted;
//   - a duplicate is released only once the server holding the name says
//     it holds its copy committed.

// nameOutcome is what the pass did with a name held here without a claim.
type nameOutcome int

const (
	nameKept nameOutcome = iota
	nameFreed
	nameHandedBack
)

// nameWithoutClaim settles name r, held on this server with no claim in
// its ledger: a name that came here by a move, and whose claim this
// server does not remember releasing under its token, is handed back to
// the server it came from, and handed back again at each pass while that
// server holds a copy and did not take it; any other (or one handed back
// before whose server answers that it holds no copy) is released. A name
// with a move under way is left to that move.
func (o *Owner) nameWithoutClaim(ctx context.Context, r names.Record) nameOutcome {
	self := o.cfg.NodeName
	if r.Move != nil {
		return nameKept // the move confirms or lapses; the next pass sees which
	}
	if r.State != names.StateHeld || r.MovedFrom == "" || r.MovedFrom == self {
		if o.freeName(ctx, r) {
			return nameFreed
		}
		return nameKept
	}
	o.ae.mu.Lock()
	tried := o.ae.handedBack[r.Name] == r.Token
	o.ae.mu.Unlock()
	if tried {
		// Its server did not take it back. Freed only when that server
		// says it holds no copy: while it holds one (its confirm did not
		// come in time: it was cut off, or busy), it may be the claim's
		// only copy, whose name must not go; handed back again.
		switch o.originCopy(ctx, r) {
		case originNoCopy:
			if o.freeName(ctx, r) {
				return nameFreed
			}
			return nameKept
		case originNoAnswer:
			return nameKept
		}
	}
	if c, err := o.ledger.Get(r.Name); err == nil && c.Live(o.clk.Now()) {
		return nameKept // committed or reserved since the pass read the ledger
	}
	if rel, ok, _ := o.ledger.Recall(r.Name, o.clk.Now(), time.Duration(o.cfg.RememberReleased)); ok && rel.NameToken == r.Token {
		// Its claim was committed here under this very token and released
		// since: the name's release did not reach the registry. The old
		// server's copy, if any, is a leftover of the same release.
		if o.freeName(ctx, r) {
			return nameFreed
		}
		return nameKept
	}
	if _, ok := o.names().(NameMover); !ok {
		o.log.Warn("anti-entropy: the name authority cannot move names; releasing a moved name with no claim instead of handing it back", "claim", r.Name, "moved_from", r.MovedFrom)
		if o.freeName(ctx, r) {
			return nameFreed
		}
		return nameKept
	}
	if !o.handBack(ctx, r) {
		return nameKept
	}
	return nameHandedBack
}

// handBack moves name r, held on this server with no claim here and moved
// here from r.MovedFrom, back to that server, and asks it to take the
// name onto its copy at once; the hand-back is remembered under r's token
// (a later pass releases the name only once that server holds no copy).
// It reports whether the registry took the move back. The registry must
// move names (NameMover).
func (o *Owner) handBack(ctx context.Context, r names.Record) bool {
	self := o.cfg.NodeName
	_, err := o.names().(NameMover).Move(ctx, names.Claim(r.Name), r.Token, self, r.MovedFrom, self)
	switch {
	case err == nil:
	case errors.Is(err, names.ErrNotFound), errors.Is(err, names.ErrStale), errors.Is(err, names.ErrConflict):
		return false // released, moved or granted again since it was read
	default:
		o.log.Warn("handing a moved name with no claim back failed; the anti-entropy pass retries", "claim", r.Name, "to", r.MovedFrom, "err", err)
		return false
	}
	o.ae.mu.Lock()
	if o.ae.handedBack == nil {
		o.ae.handedBack = map[string]uint64{}
	}
	o.ae.handedBack[r.Name] = r.Token
	o.ae.mu.Unlock()
	o.log.Warn("name moved here with no claim in this ledger handed back to the server it came from; released by a later pass unless that server takes it",
		"claim", r.Name, "to", r.MovedFrom, "token", r.Token)
	o.nudgeOrigin(ctx, r)
	return true
}

// What the server a name came from answers about its copy.
const (
	originHasCopy = iota
	originNoCopy
	originNoAnswer
)

// originCopy asks the server name r came from whether it holds the claim
// (committed or reserved): originNoCopy only when it answers that it does
// not.
func (o *Owner) originCopy(ctx context.Context, r names.Record) int {
	p, ok := o.peer(r.MovedFrom)
	if !ok {
		return originNoAnswer
	}
	lctx, cancel := context.WithTimeout(ctx, api.OwnerOpTimeout)
	defer cancel()
	_, err := p.Owner.Lookup(lctx, r.Name)
	switch {
	case err == nil:
		return originHasCopy
	case api.IsCode(err, api.CodeNotFound):
		return originNoCopy
	}
	return originNoAnswer
}

// nudgeOrigin asks the server a handed-back name goes to for the commit of
// its copy: its owner, finding the name moving to it, confirms the move
// onto the copy at once (heldHere) rather than at its next pass, which
// may come after the move lapsed. Best effort: the pass confirms it too.
func (o *Owner) nudgeOrigin(ctx context.Context, r names.Record) {
	p, ok := o.peer(r.MovedFrom)
	if !ok {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, api.OwnerOpTimeout)
	defer cancel()
	if _, err := p.Owner.Commit(cctx, r.Name); err != nil {
		o.log.Info("anti-entropy: the server a name was handed back to did not take it at once; its pass may", "claim", r.Name, "to", r.MovedFrom, "err", err)
	}
}

// forgetHandedBack drops the hand-backs of names no longer held here
// without a claim (the IDs in still).
func (o *Owner) forgetHandedBack(still map[string]bool) {
	o.ae.mu.Lock()
	defer o.ae.mu.Unlock()
	for id := range o.ae.handedBack {
		if !still[id] {
			delete(o.ae.handedBack, id)
		}
	}
}

// confirmMoveHere confirms, as this server, the move of committed claim
// c's name r to this server: the copy here takes the name (a move's
// coordinator that stopped before its confirm, or a name handed back),
// and the ledger records its token.
func (o *Owner) confirmMoveHere(ctx context.Context, c ledger.Claim, r names.Record) bool {
	self := o.cfg.NodeName
	got, err := o.names().Confirm(ctx, names.Claim(c.ID), r.Move.Token, self, nil)
	if err != nil {
		o.log.Info("anti-entropy: the move of a claim's name to this server was not confirmed this pass", "claim", c.ID, "from", r.Owner, "err", err)
		return false
	}
	if _, err := o.ledger.SetNameToken(c.ID, got.Token); err != nil {
		o.log.Warn("anti-entropy: recording a claim's name token failed", "claim", c.ID, "token", got.Token, "err", err)
	}
	o.log.Warn("anti-entropy: name moving to this server's committed copy confirmed here", "claim", c.ID, "from", r.Owner, "token", got.Token, "gpus", c.GPUs)
	return true
}

// resolveLeftover applies the leftover rule to committed claim c, whose
// name was released (its ledger has a name token; the registry no name):
// released on the second sighting in a row (again), never while a VM uses
// it. It reports whether c was released.
func (o *Owner) resolveLeftover(ctx context.Context, c ledger.Claim, again bool) bool {
	if !again {
		o.log.Warn("claim committed here under a name token has no name in the registry: its name was released, so this copy is a leftover",
			"claim", c.ID, "token", c.NameToken, "gpus", c.GPUs)
	}
	unlock := o.claimLocks.Lock(c.ID)
	defer unlock()
	cur, err := o.ledger.Get(c.ID)
	if err != nil || cur.State != ledger.StateCommitted || !cur.CommittedAt.Equal(c.CommittedAt) || cur.NameToken != c.NameToken {
		return false // released or replaced meanwhile: the next pass looks again
	}
	if why := o.inUseWhy(cur); why != "" {
		if !again {
			o.log.Warn("leftover kept while a VM uses it; it is released once the VM stops", "claim", c.ID, "in_use", why)
		}
		return false
	}
	if !again {
		o.log.Info("leftover unused; released by the next pass if it is still one", "claim", c.ID)
		return false
	}
	return o.releaseCopy(ctx, c, "leftover", "its name was released", "token", c.NameToken)
}

// holderLacks asks server holder, which the registry names as holding
// claim id, whether it holds the claim committed: "" when it does, else
// why this copy must stay (it answers that it does not, or does not
// answer).
func (o *Owner) holderLacks(ctx context.Context, holder, id string) string {
	p, ok := o.peer(holder)
	if !ok {
		return fmt.Sprintf("%s is not among the servers this one sees", holder)
	}
	lctx, cancel := context.WithTimeout(ctx, api.OwnerOpTimeout)
	defer cancel()
	c, err := p.Owner.Lookup(lctx, id)
	switch {
	case api.IsCode(err, api.CodeNotFound):
		return fmt.Sprintf("%s does not hold it", holder)
	case err != nil:
		return fmt.Sprintf("%s did not answer: %v", holder, err)
	case c.State != api.StateClaimed:
		return fmt.Sprintf("%s holds it %s, not committed", holder, c.State)
	}
	return ""
}
