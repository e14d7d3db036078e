package ledger

import (
	"fmt"
	"time"
)

// A commit written ahead of its name (docs/design.md, "A commit awaiting
// its name"). An owner holds a new claim's ID in the name
// registry and commits the claim in this ledger; the two writes are
// durable each on its own disk, and neither needs the other's result to
// be written. CommitAwaitingName writes the commit while the registry's
// answer is still on its way; SettleName then records the token without
// an fdatasync of its own, and UnwindAwaiting takes the commit back when
// the registry refused. A crash between them leaves a claim that awaits
// its name: the owner asks the registry whether it holds the ID here
// under the claim's request, and settles or unwinds it.

// CommitAwaitingName is CommitReservation of the reservation of id made at
// createdAt, written before the name registry has answered the hold of
// its ID: the claim is committed, fsynced, with no token and with
// AwaitingName set. Until SettleName or UnwindAwaiting it holds its GPUs
// whatever its lease says (the sweep leaves it), and it is not a claim
// (Claim.Named). It keeps its reservation's ExpiresAt, the time by which
// its owner decides it, and listings show it reserved until then: so it
// is published as soon as its record is written, and the call returns
// once the record is durable, its fdatasync shared with any other
// writer's that comes first. The errors are CommitReservation's.
func (l *Ledger) CommitAwaitingName(id string, createdAt, now time.Time) (Claim, error) {
	c, written, err := l.CommitAwaitingNameAhead(id, createdAt, now)
	if err != nil {
		return Claim{}, err
	}
	if err := written.Durable(); err != nil {
		return Claim{}, err
	}
	return c, nil
}

// CommitAwaitingNameAhead is CommitAwaitingName returning once the
// commit is written and published, before it is durable: the caller
// answers for it only after written.Durable, and may delay that call
// while the registry's answer is on its way, for a later writer's
// fdatasync to cover the record first.
func (l *Ledger) CommitAwaitingNameAhead(id string, createdAt, now time.Time) (c Claim, written Unsynced, err error) {
	if createdAt.IsZero() {
		return Claim{}, Unsynced{}, &ValidationError{Field: "created_at", Reason: "a commit ahead of its name needs the reservation's creation time"}
	}
	var out Claim
	written, err = l.writeAhead(committing(id, createdAt.UTC(), 0, now.UTC(), true, &out))
	if err != nil {
		return Claim{}, Unsynced{}, err
	}
	return copyClaim(out), written, nil
}

// SettleName ends the wait of the claim id made at createdAt, committed by
// CommitAwaitingName, with token, the registry's token for its ID on this
// server. The record is appended to the journal without an fdatasync: the
// commit it completes is durable already, the next synced write makes it
// durable too, and a crash that loses it leaves the claim awaiting, which
// the owner settles from the registry again. A claim not awaiting, or
// made at another time, fails with ErrNotFound and is left as it is.
func (l *Ledger) SettleName(id string, createdAt time.Time, token uint64) (Claim, error) {
	if token == 0 {
		return Claim{}, &ValidationError{Field: "name_token", Reason: "a claim's name is settled with the registry's token, never 0"}
	}
	var out Claim
	_, err := l.writeUnsynced(func(tx *fileTx, st *state) (bool, error) {
		rec, err := awaitingClaim(st, id, createdAt)
		if err != nil {
			return false, err
		}
		rec.named(token)
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

// UnwindAwaiting takes back the commit of the claim id made at createdAt
// that awaits its name, written and fsynced: the registry did not hold
// its ID here. With expiresAt after now the claim becomes the reservation
// it was, under that lease (the coordinator may commit it again once the
// registry answers); otherwise it is removed. Either way it is returned as
// it was. A claim not awaiting, or made at another time, fails with
// ErrNotFound and is left as it is.
func (l *Ledger) UnwindAwaiting(id string, createdAt, expiresAt, now time.Time) (Claim, error) {
	var out Claim
	err := l.write(func(tx *fileTx, st *state) (bool, error) {
		rec, err := awaitingClaim(st, id, createdAt)
		if err != nil {
			return false, err
		}
		out = rec.Claim
		if !expiresAt.After(now) {
			return true, st.deleteClaim(tx, id)
		}
		if tx == nil {
			return false, errNeedsFile
		}
		rec.State = StateReserved
		rec.AwaitingName = false
		rec.CommittedAt = time.Time{}
		rec.ExpiresAt = expiresAt.UTC()
		return true, st.putClaim(tx, rec)
	})
	if err != nil {
		return Claim{}, err
	}
	return copyClaim(out), nil
}

// Awaiting lists the claims that await their name, sorted by ID: what a
// pass that cannot reach the registry leaves undecided.
func (l *Ledger) Awaiting() []Claim {
	var out []Claim
	for _, c := range l.List() {
		if c.AwaitingName {
			out = append(out, c)
		}
	}
	return out
}

// named ends the wait of a claim committed ahead of its name, if it
// waited, under token: a claim has no deadline.
func (r *claimRecord) named(token uint64) {
	r.NameToken = token
	r.AwaitingName = false
	r.ExpiresAt = time.Time{}
}

// awaitingClaim is claim id of st when it awaits its name and was made at
// createdAt; ErrNotFound otherwise.
func awaitingClaim(st *state, id string, createdAt time.Time) (claimRecord, error) {
	rec, ok := st.claims[id]
	switch {
	case !ok:
		return claimRecord{}, notFound(id)
	case !rec.AwaitingName || rec.State != StateCommitted:
		return claimRecord{}, fmt.Errorf("claim %q does not await its name: %w on this server", id, ErrNotFound)
	case !rec.CreatedAt.Equal(createdAt):
		return claimRecord{}, fmt.Errorf("claim %q: the claim made at %s was replaced by one made at %s: %w on this server",
			id, createdAt.UTC().Format(time.RFC3339Nano), rec.CreatedAt.Format(time.RFC3339Nano), ErrNotFound)
	}
	return rec, nil
}
