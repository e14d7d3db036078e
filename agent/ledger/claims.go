package ledger

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/gpuherd/gpuherd/agent/placement"
)

// Reserve takes GPUs for claim id for lease, on behalf of coordinator ("" when
// local), in one step under the ledger's write lock: it checks what is free
// (GPUs in committed claims and in live reservations are not) and records
// the reservation, or records nothing. The reservation lives in memory only:
// Reserve writes no file and costs no fsync, and a reservation does not
// survive Close (see Open); only Commit makes the claim durable.
//
// A GPU is free when it is in the inventory, healthy, not drained and in no
// live claim; a reservation whose ExpiresAt is at or before now is not live.
// Each item is placed with package placement.
//
// Retries are safe: while claim id is live, the same request (same items in
// any order, same labels) returns the existing claim unchanged, reserved or
// committed, and a different one fails with *ConflictError. A reservation
// that has expired is replaced by a new one, possibly on other GPUs, and so
// is a live reservation whose NameToken is older than req's (see
// supersedes); a req whose NameToken is older than the live claim's fails
// with a *ConflictError whose Stale is set. A newer token with the same
// request moves the reservation to it, GPUs and all.
//
// Errors: *ValidationError for a malformed id, request, coordinator or lease;
// *NotAvailableError listing every item this server cannot place in full.
func (l *Ledger) Reserve(id string, req Request, coordinator string, now time.Time, lease time.Duration) (Claim, error) {
	if err := ValidateID(id); err != nil {
		return Claim{}, err
	}
	if err := ValidateRequest(req, l.maxGPUs); err != nil {
		return Claim{}, err
	}
	if err := validateLease(lease); err != nil {
		return Claim{}, err
	}
	if len(coordinator) > MaxCoordinatorLen || !printable(coordinator) {
		return Claim{}, &ValidationError{Field: "coordinator", Reason: fmt.Sprintf("must be printable and at most %d bytes", MaxCoordinatorLen)}
	}
	now = now.UTC()

	var out Claim
	err := l.write(func(tx *fileTx, st *state) (bool, error) {
		if old, ok := st.claims[id]; ok && old.Live(now) {
			order, same := supersedes(req.NameToken, old.Claim), sameRequest(old.Claim, req)
			switch {
			case order == tokenOlder:
				return false, &ConflictError{ID: id, Existing: old.Claim, Stale: req.NameToken}
			case order == tokenNewer && !same:
				// The placement that made it lost the name (tokens.go):
				// the reservation is an orphan, and its GPUs are free
				// for this one.
				if err := st.deleteClaim(tx, id); err != nil {
					return false, err
				}
			case !same:
				return false, &ConflictError{ID: id, Existing: old.Claim}
			case old.State == StateReserved && req.NameToken != 0 && req.NameToken != old.NameToken:
				// The same request under a newer grant (its pending name
				// lapsed and a retry took it again), or bringing the token
				// a reservation made before its placement held the name
				// lacks (a resize's move): the reservation and its GPUs
				// carry on under it.
				old.NameToken = req.NameToken
				if err := st.putClaim(tx, old); err != nil {
					return false, err
				}
				out = old.Claim
				return true, nil
			default:
				out = old.Claim
				return false, nil
			}
		}

		free := st.freeByModel(now)
		models, missing := pick(free, req)
		if len(missing) > 0 {
			return false, &NotAvailableError{ID: id, Missing: missing, Devices: req.Devices}
		}

		rec := claimRecord{
			Claim: Claim{
				ID:          id,
				State:       StateReserved,
				Items:       slices.Clone(req.Items),
				GPUs:        slices.Sorted(maps.Keys(models)),
				Coordinator: coordinator,
				CreatedAt:   now,
				ExpiresAt:   now.Add(lease),
				NameToken:   req.NameToken,
			},
			GPUModels: models,
		}
		if len(req.Labels) > 0 {
			rec.Labels = maps.Clone(req.Labels)
		}
		if err := st.putClaim(tx, rec); err != nil {
			return false, err
		}
		out = rec.Claim
		return true, nil
	})
	if err != nil {
		return Claim{}, err
	}
	return copyClaim(out), nil
}

// Commit turns the live reservation id into a committed claim, which holds
// its GPUs until Release: the claim is written to the file and fsynced
// before Commit returns, and survives a restart. Committing a committed
// claim returns it unchanged, writing nothing, so a coordinator may retry.
// A reservation whose lease has passed is dropped (in memory, no write) and
// fails with ErrLeaseExpired: its GPUs may already be promised elsewhere, so
// it must never be committed. Unknown id: ErrNotFound; after a restart that
// includes every reservation the previous run held.
func (l *Ledger) Commit(id string, now time.Time) (Claim, error) {
	return l.CommitUnder(id, 0, now)
}

// CommitUnder is Commit recording token, when not zero, as the name token
// the claim is committed under: the token the name registry held its ID
// on this server with at commit (the owner's one-step hold). A claim
// committed already keeps the token it has.
func (l *Ledger) CommitUnder(id string, token uint64, now time.Time) (Claim, error) {
	return l.commit(id, time.Time{}, token, now)
}

// CommitReservation is CommitUnder of the reservation of id created at
// createdAt only, checked in the same write: one made since under the same
// ID (the first lapsed, or lost its name to a newer grant, and another
// request reserved the ID again) is not the one the caller checked, nor
// the one whose name it holds, and is left reserved: ErrNotFound.
func (l *Ledger) CommitReservation(id string, createdAt time.Time, token uint64, now time.Time) (Claim, error) {
	return l.commit(id, createdAt, token, now)
}

// commit is CommitUnder, of the claim created at createdAt unless zero.
func (l *Ledger) commit(id string, createdAt time.Time, token uint64, now time.Time) (Claim, error) {
	var out Claim
	if err := l.write(committing(id, createdAt.UTC(), token, now.UTC(), false, &out)); err != nil {
		return Claim{}, err
	}
	return copyClaim(out), nil
}

// committing is the change that commits the reservation id made at
// createdAt (any, when zero) under token, answering the claim in out; with
// awaiting, the claim is committed with AwaitingName set
// (CommitAwaitingName) and keeps its reservation's deadline.
func committing(id string, createdAt time.Time, token uint64, now time.Time, awaiting bool, out *Claim) func(tx *fileTx, st *state) (bool, error) {
	return func(tx *fileTx, st *state) (bool, error) {
		rec, ok := st.claims[id]
		switch {
		case !ok:
			return false, notFound(id)
		case !createdAt.IsZero() && !rec.CreatedAt.Equal(createdAt):
			return false, fmt.Errorf("claim %q: the reservation made at %s was replaced by one made at %s: %w on this server",
				id, createdAt.UTC().Format(time.RFC3339Nano), rec.CreatedAt.Format(time.RFC3339Nano), ErrNotFound)
		case rec.State == StateCommitted:
			*out = rec.Claim
			return false, nil
		case !rec.Live(now):
			if err := st.deleteClaim(tx, id); err != nil {
				return false, err
			}
			return true, leaseExpired(rec.Claim, now)
		}
		rec.State = StateCommitted
		if !awaiting {
			// Awaiting its name, it keeps its reservation's deadline:
			// the owner decides it by then (commitahead.go).
			rec.ExpiresAt = time.Time{}
		}
		rec.CommittedAt = now
		if token != 0 {
			rec.NameToken = token
		}
		rec.AwaitingName = awaiting
		if err := st.putClaim(tx, rec); err != nil {
			return false, err
		}
		*out = rec.Claim
		return true, nil
	}
}

// Extend renews the live reservation id so that it lasts at least until
// now+lease; a coordinator that binds slowly calls it before the deadline.
// It never shortens a lease, so a delayed retry of an older Extend is
// harmless. A committed claim has no lease and is returned unchanged. An
// expired reservation is dropped and fails with ErrLeaseExpired; unknown id:
// ErrNotFound. Like the reservation itself, the new lease is kept in memory
// only: Extend writes no file.
func (l *Ledger) Extend(id string, now time.Time, lease time.Duration) (Claim, error) {
	if err := validateLease(lease); err != nil {
		return Claim{}, err
	}
	now = now.UTC()
	var out Claim
	err := l.write(func(tx *fileTx, st *state) (bool, error) {
		rec, ok := st.claims[id]
		switch {
		case !ok:
			return false, notFound(id)
		case rec.State == StateCommitted:
			out = rec.Claim
			return false, nil
		case !rec.Live(now):
			if err := st.deleteClaim(tx, id); err != nil {
				return false, err
			}
			return true, leaseExpired(rec.Claim, now)
		}
		deadline := now.Add(lease)
		if !deadline.After(rec.ExpiresAt) {
			out = rec.Claim
			return false, nil
		}
		rec.ExpiresAt = deadline
		if err := st.putClaim(tx, rec); err != nil {
			return false, err
		}
		out = rec.Claim
		return true, nil
	})
	if err != nil {
		return Claim{}, err
	}
	return copyClaim(out), nil
}

// Release removes claim id, reserved or committed, and returns what it was;
// its GPUs are free once the call returns. Releasing a committed claim
// deletes it from the file (fsynced); releasing a reservation writes
// nothing. Unknown id: ErrNotFound, which callers treat as success (the
// claim is gone either way). A reservation whose lease has already passed
// held nothing anymore: it is removed and reported as ErrNotFound too.
func (l *Ledger) Release(id string, now time.Time) (Claim, error) {
	return l.release(id, now, false, -1)
}

// ReleaseRemembering is Release, and a committed claim's release is
// remembered as Remember(c, now, keep) does, in the same transaction: one
// fsync'ed write for both, and never a release that is not remembered.
func (l *Ledger) ReleaseRemembering(id string, now time.Time, keep time.Duration) (Claim, error) {
	return l.release(id, now, false, max(keep, 0))
}

// AbortReservation removes claim id only while it is a reservation: a
// coordinator that lost the answer to its reserve, or reserved ahead of
// knowing the ID is new, must never release the claim a concurrent
// coordinator committed under the same ID. A committed claim is left as it
// is and reported with ErrCommitted; otherwise as Release.
func (l *Ledger) AbortReservation(id string, now time.Time) (Claim, error) {
	return l.release(id, now, true, -1)
}

// release is Release, or AbortReservation with reservationOnly; keep, when
// not negative, as in ReleaseRemembering.
func (l *Ledger) release(id string, now time.Time, reservationOnly bool, keep time.Duration) (Claim, error) {
	var out Claim
	if err := l.write(l.releasing(id, now.UTC(), reservationOnly, keep, &out)); err != nil {
		return Claim{}, err
	}
	return copyClaim(out), nil
}

// releasing is release's change, for a write: it sets *out to the claim
// released.
func (l *Ledger) releasing(id string, now time.Time, reservationOnly bool, keep time.Duration, out *Claim) func(tx *fileTx, st *state) (bool, error) {
	return func(tx *fileTx, st *state) (bool, error) {
		rec, ok := st.claims[id]
		if !ok {
			return false, notFound(id)
		}
		if reservationOnly && rec.State == StateCommitted {
			return false, fmt.Errorf("claim %s: %w; not aborted", id, ErrCommitted)
		}
		if err := st.deleteClaim(tx, id); err != nil {
			return false, err
		}
		if !rec.Live(now) {
			return true, notFound(id)
		}
		if keep >= 0 && tx != nil && rec.State == StateCommitted {
			if err := l.rememberIn(tx, rec.Claim, now, keep); err != nil {
				return false, fmt.Errorf("remember released claim %s: %w", id, err)
			}
		}
		*out = rec.Claim
		return true, nil
	}
}

// Expire removes every reservation whose lease has passed at now and
// returns them sorted by ID. The agent calls it periodically so that the
// claim list, the revision and the published capacity catch up with time;
// the claims it removes were already not live. Reservations are in memory
// only, so Expire writes no file.
func (l *Ledger) Expire(now time.Time) ([]Claim, error) {
	now = now.UTC()
	var out []Claim
	err := l.write(func(tx *fileTx, st *state) (bool, error) {
		out = nil
		for _, id := range slices.Sorted(maps.Keys(st.claims)) {
			rec := st.claims[id]
			if rec.Live(now) {
				continue
			}
			if err := st.deleteClaim(tx, id); err != nil {
				return false, err
			}
			out = append(out, copyClaim(rec.Claim))
		}
		return len(out) > 0, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Get returns claim id as stored, or ErrNotFound. A reservation whose lease
// has passed is returned until Expire (or a call on it) removes it; check
// Claim.Live.
func (l *Ledger) Get(id string) (Claim, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	rec, ok := l.state.claims[id]
	if !ok {
		return Claim{}, notFound(id)
	}
	return copyClaim(rec.Claim), nil
}

// List returns every stored claim sorted by ID, including reservations
// whose lease has passed but that Expire has not removed yet.
func (l *Ledger) List() []Claim {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]Claim, 0, len(l.state.claims))
	for _, rec := range l.state.claims {
		out = append(out, copyClaim(rec.Claim))
	}
	slices.SortFunc(out, func(a, b Claim) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// freeByModel returns the free GPUs of each model as placement candidates.
func (st *state) freeByModel(now time.Time) map[string][]placement.Candidate {
	busy := st.busy(now)
	out := map[string][]placement.Candidate{}
	for addr, g := range st.inventory {
		if _, held := busy[addr]; held || !g.Healthy || g.Unusable {
			continue
		}
		if _, drained := st.drains[addr]; drained {
			continue
		}
		out[g.Model] = append(out[g.Model], placement.Candidate{Address: addr, NUMANode: g.NUMANode, Distance: g.Distance})
	}
	return out
}

// pick chooses the GPUs of req among the free ones: placement's choice per
// model, or exactly req.Devices when the request is pinned. It returns the
// chosen GPUs with their models and the items it could not hold.
func pick(free map[string][]placement.Candidate, req Request) (map[string]string, []Item) {
	models := map[string]string{}
	var missing []Item
	if len(req.Devices) > 0 {
		freeModel := map[string]string{}
		for m, cs := range free {
			for _, c := range cs {
				freeModel[c.Address] = m
			}
		}
		need := map[string]int{}
		for _, it := range req.Items {
			need[it.Model] = it.Count
		}
		for _, a := range req.Devices {
			m, ok := freeModel[a]
			if !ok || need[m] == 0 {
				continue
			}
			need[m]--
			models[a] = m
		}
		for _, it := range req.Items {
			if n := need[it.Model]; n > 0 {
				missing = append(missing, Item{Model: it.Model, Count: n})
			}
		}
		return models, missing
	}
	for _, it := range req.Items {
		got, ok := placement.Pick(free[it.Model], it.Count)
		if !ok {
			missing = append(missing, it)
			continue
		}
		for _, a := range got {
			models[a] = it.Model
		}
	}
	return models, missing
}

// sameRequest reports whether req asks for what c holds: the same items in
// any order (models are unique within a request), the same labels, and,
// for a pinned request, the same GPUs.
func sameRequest(c Claim, req Request) bool {
	byModel := func(a, b Item) int { return cmp.Compare(a.Model, b.Model) }
	have := slices.SortedFunc(slices.Values(c.Items), byModel)
	want := slices.SortedFunc(slices.Values(req.Items), byModel)
	if len(req.Devices) > 0 && !slices.Equal(c.GPUs, req.Devices) {
		return false
	}
	return slices.Equal(have, want) && maps.Equal(c.Labels, req.Labels)
}

func validateLease(lease time.Duration) error {
	if lease <= 0 {
		return &ValidationError{Field: "lease", Reason: fmt.Sprintf("is %s; must be positive", lease)}
	}
	return nil
}

// copyClaim deep-copies a claim so that callers cannot change the cache
// through its slices and maps.
func copyClaim(c Claim) Claim {
	c.Items = slices.Clone(c.Items)
	c.GPUs = slices.Clone(c.GPUs)
	c.Labels = maps.Clone(c.Labels)
	return c
}
