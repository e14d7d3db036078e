package claim

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/owner"
	"github.com/gpuherd/gpuherd/agent/placement"
)

// A resize that does not fit on the claim's server moves the claim
// (docs/protocol.md, "Resize"). Under the name registry the move commits
// the new placement before the old one is released, and the claim ID's
// name goes with it in one registry step, so that at every moment the
// name points at one committed copy:
//
//  1. Move: the name, held on the old server under token t, gets a move to
//     the new server under a new token t' (it stays held on the old
//     server meanwhile; a move nobody confirms lapses).
//  2. Reserve on the new server, carrying t' (its owner confirms t' at
//     commit once the claim path does).
//  3. Commit there.
//  4. Confirm t' for the new server: the name is held there from now on,
//     and t is stale.
//  5. Release the old copy.
//
// A crash before 4 leaves the name on the old server, whose copy is whole;
// a committed copy on the new server that the name does not point at is
// a duplicate that nothing uses and the anti-entropy pass releases. A
// crash after 4 leaves the name on the new server's committed copy; the
// old copy is the duplicate. A step that fails is undone before the
// answer, and whatever could not be undone is named in it.

// move moves claim at.id, committed on from, to the first server of
// ranked whose owner takes it. all are the servers a refusal describes.
func (at *attempt) move(ctx context.Context, from Target, ranked []string, byName map[string]Target, all []placement.Server) (api.Claim, error) {
	key := names.Claim(at.id)
	rec, err := at.names().Lookup(ctx, key, names.Linearizable)
	named := err == nil
	switch {
	case errors.Is(err, names.ErrNotFound):
		// Committed before the registry named claims: it moves without a
		// name, in the same order.
	case err != nil:
		return api.Claim{}, RegistryError(err, "claim "+at.id)
	case rec.State != names.StateHeld || rec.Owner != from.name:
		return api.Claim{}, &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s: the name registry has it %s on %s but %s holds it; retry the resize once they agree", at.id, rec.State, rec.Owner, from.name)}
	}
	mover, ok := at.names().(owner.NameMover)
	if named && !ok {
		return api.Claim{}, fmt.Errorf("claim %s: the name authority cannot move names", at.id)
	}
	var (
		lastErr  error
		failures []string
		refused  int
		refusals []string
	)
	for _, name := range ranked {
		t := byName[name]
		rr := at.rr
		if named {
			m, err := mover.Move(ctx, key, rec.Token, from.name, t.name, at.cfg.NodeName)
			if err != nil {
				return api.Claim{}, RegistryError(err, "claim "+at.id)
			}
			rr.Token = m.Move.Token
		}
		rctx, cancel := context.WithTimeout(ctx, api.ReserveTimeout)
		_, err := t.owner.Reserve(rctx, at.id, rr)
		cancel()
		if err != nil {
			var e *api.Error
			if !errors.As(err, &e) || e.ServerFault() {
				at.abortReservation(ctx, t)
			}
			if api.IsCode(err, api.CodeNotAvailable) {
				refused++
				refusals = append(refusals, api.RefusalsOf(err)...)
			} else {
				lastErr = fmt.Errorf("%s: %w", name, err)
				failures = append(failures, ownerFailure(name, err))
			}
			continue
		}
		c, err := at.commit(ctx, t)
		if errors.Is(err, errCommitUnknown) {
			return api.Claim{}, api.Annotate(err, "moving claim %[2]s from %[3]s to %[4]s: %[1]s; the claim stays on %[3]s until the move is confirmed", at.id, from.name, t.name)
		}
		if err != nil {
			at.abortReservation(ctx, t)
			if api.IsCode(err, api.CodeNotFound) {
				// The reservation the move made on t is gone (t was
				// paused or slow past its lease, and its sweep dropped
				// it): the claim is still on from, as it was. "Not
				// found" would tell the client the claim is gone.
				return api.Claim{}, &api.Error{Code: api.CodeUnavailable,
					Message: fmt.Sprintf("moving claim %s from %s to %s: the reservation on %s was gone before its commit (%v); nothing changed: retry the resize", at.id, from.name, t.name, t.name, err)}
			}
			return api.Claim{}, api.Annotate(err, "moving claim %[2]s from %[3]s to %[4]s: the commit failed, nothing changed: %[1]s", at.id, from.name, t.name)
		}
		if named {
			// t's commit confirmed the move's token as t itself (owner
			// confirm): the name is held on t now, unless it changed.
			if err := at.nameHeldOn(ctx, key, rr.Token, t.name); err != nil {
				if names.IsUnavailable(err) {
					return api.Claim{}, &api.Error{Code: api.CodeUnavailable,
						Message: fmt.Sprintf("claim %s was committed on %s, but the name registry did not confirm its move from %s (%v); both copies are kept until the move is settled: retry the resize", at.id, t.name, from.name, err)}
				}
				// The name changed while the claim moved (released, or
				// moved by someone else): the new copy is nobody's.
				undo := at.dropCopy(ctx, t)
				return api.Claim{}, &api.Error{Code: api.CodeConflict,
					Message: fmt.Sprintf("claim %s changed while it moved to %s (%v); nothing changed on %s%s", at.id, t.name, err, from.name, undo)}
			}
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), api.OwnerOpTimeout)
		_, err = from.owner.Abort(actx, at.id)
		cancel()
		if err != nil && !api.IsCode(err, api.CodeNotFound) {
			// The old copy stays (a VM holds it, or its owner did not
			// answer): put everything back as it was.
			return api.Claim{}, at.undoMove(ctx, key, from, t, c, named, err)
		}
		at.log.Info("claim moved", "claim", at.id, "from", from.name, "to", t.name)
		return c, nil
	}
	if lastErr != nil && refused == 0 {
		return api.Claim{}, &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s was not moved: every server that could hold the new request failed to take it (%s); nothing changed, the claim stays on %s: retry the resize, and if it keeps failing read the agent's log on those servers (journalctl -u gpuherd)",
				at.id, strings.Join(failures, "; "), from.name)}
	}
	return api.Claim{}, withRefusals(at.refuse(at.rr.Items, all), refusals)
}

// dropCopy releases the copy of at.id committed on t by this move and
// says in words what it could not do ("" when all went well).
func (at *attempt) dropCopy(ctx context.Context, t Target) string {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), api.OwnerOpTimeout)
	defer cancel()
	if _, err := t.owner.Abort(actx, at.id); err != nil && !api.IsCode(err, api.CodeNotFound) {
		at.log.Error("a moved claim's new copy could not be released; it holds GPUs nobody uses", "claim", at.id, "node", t.name, "err", err)
		return fmt.Sprintf("; its new copy on %s could not be released (%v): release it there", t.name, err)
	}
	return ""
}

// undoMove puts a move back when the old copy could not be released
// (cause): the name back on from, the new copy on t released. What it
// cannot undo it logs as an error and names in the answer.
func (at *attempt) undoMove(ctx context.Context, key names.Key, from, t Target, moved api.Claim, named bool, cause error) error {
	var failed []string
	if named {
		// The new copy may have been released meanwhile (a release of
		// the claim reached its holder): its name must not bring the old
		// copy back to life, which the anti-entropy pass then releases.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), api.LookupTimeout)
		cur, err := t.owner.Lookup(lctx, at.id)
		cancel()
		if err != nil || cur.State != api.StateClaimed || !cur.CreatedAt.Equal(moved.CreatedAt) {
			at.log.Error("a failed move's new copy is gone (released meanwhile?); its name is not moved back, the old copy is left to the anti-entropy pass", "claim", at.id, "from", from.name, "to", t.name, "cause", cause, "lookup_err", err)
			return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("moving claim %s from %s to %s: the old GPUs could not be released (%v), and the new copy was released meanwhile; the old copy is released once its server answers", at.id, from.name, t.name, cause)}
		}
		if err := at.moveNameBack(ctx, key, t.name, from.name); err != nil {
			failed = append(failed, fmt.Sprintf("its name stays on %s (%v)", t.name, err))
		}
	}
	if len(failed) == 0 {
		if s := at.dropCopy(ctx, t); s != "" {
			failed = append(failed, s[2:])
		}
	}
	var e *api.Error
	code := api.CodeConflict
	if errors.As(cause, &e) {
		code = e.Code
	}
	if len(failed) == 0 {
		return &api.Error{Code: code, Message: fmt.Sprintf("moving claim %s from %s to %s: the old GPUs could not be released (%v); nothing changed", at.id, from.name, t.name, cause)}
	}
	at.log.Error("a failed move could not be undone", "claim", at.id, "from", from.name, "to", t.name, "cause", cause, "left", failed)
	return &api.Error{Code: api.CodeInternal, Message: fmt.Sprintf("moving claim %s from %s to %s: the old GPUs could not be released (%v), and undoing the move failed: %v; the claim is held on both (new copy %v): release the one the VM does not use",
		at.id, from.name, t.name, cause, failed, moved.GPUs)}
}

// moveNameBack moves key, held on to after a move, back to from.
func (at *attempt) moveNameBack(ctx context.Context, key names.Key, to, from string) error {
	ctx = context.WithoutCancel(ctx)
	rec, err := at.names().Lookup(ctx, key, names.Linearizable)
	if err != nil {
		return err
	}
	m, err := at.names().(owner.NameMover).Move(ctx, key, rec.Token, to, from, at.cfg.NodeName)
	if err != nil {
		return err
	}
	_, err = at.names().(owner.NameMover).ConfirmMove(ctx, key, m.Move.Token, from, at.cfg.NodeName)
	return err
}

// nameHeldOn checks that the registry holds key on owner under token.
func (at *attempt) nameHeldOn(ctx context.Context, key names.Key, token uint64, owner string) error {
	rec, err := at.names().Lookup(ctx, key, names.Linearizable)
	if err != nil {
		return err
	}
	if rec.State != names.StateHeld || rec.Owner != owner || rec.Token != token {
		return &names.RefusedError{Op: names.OpConfirm, Key: key, Code: names.CodeConflict, Record: &rec,
			Detail: fmt.Sprintf("%s is %s on %s under token %d, not on %s under %d", key, rec.State, rec.Owner, rec.Token, owner, token)}
	}
	return nil
}

// RegistryError turns a name registry error into the API's: unavailable
// (retryable, naming the servers) or the refusal it is.
func RegistryError(err error, what string) error {
	var (
		re *names.RefusedError
		ue *names.UnavailableError
	)
	switch {
	case errors.As(err, &ue):
		return &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("%s: %v", what, err)}
	case errors.As(err, &re) && (re.Code == names.CodeConflict || re.Code == names.CodeStale || re.Code == names.CodeLost):
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("%s: %v", what, err)}
	case errors.As(err, &re) && re.Code == names.CodeNotFound:
		return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("%s: %v", what, err)}
	case errors.As(err, &re) && re.Code == names.CodeInvalid:
		return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("%s: %v", what, err)}
	}
	return fmt.Errorf("%s: %w", what, err)
}
