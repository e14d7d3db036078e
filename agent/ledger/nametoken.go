package ledger

import (
	"fmt"
)

// SetNameToken records the name registry's token for committed claim id,
// written and fsynced: what the owner's anti-entropy pass does after it
// gave a claim from an older version's ledger its name, or found the name
// of a claim awaiting it (CommitAwaitingName) held here; it ends the
// wait. The same token again, on a claim not awaiting, writes nothing. A
// claim that is not committed fails with ErrNotFound: only a committed
// claim holds a name.
func (l *Ledger) SetNameToken(id string, token uint64) (Claim, error) {
	var out Claim
	err := l.write(func(tx *fileTx, st *state) (bool, error) {
		rec, ok := st.claims[id]
		if !ok || rec.State != StateCommitted {
			return false, fmt.Errorf("claim %q is not committed: %w on this server", id, ErrNotFound)
		}
		out = rec.Claim
		if rec.NameToken == token && !rec.AwaitingName {
			return false, nil
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
