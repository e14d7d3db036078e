package ledger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// RemoveClaim deletes the record of claim id from the ledger file at path,
// which no agent may hold: the operator's way out of a file that Open
// refuses (a GPU in two claims, a claim naming a GPU the ledger does not
// hold, an unreadable claim record). It removes the record whatever it
// holds, readable or not, in one fsynced transaction that also moves the
// revision, and returns the removed claim as far as it could be read. The
// claim's GPUs are free at the agent's next start. The writes of the
// ledger's journal that the file lacks are applied to it first. ErrNotFound when the
// file has no such record; ErrLocked while an agent holds the file.
func RemoveClaim(path, id string, lockTimeout time.Duration) (Claim, error) {
	if lockTimeout <= 0 {
		lockTimeout = DefaultLockTimeout
	}
	if err := checkFile(path); err != nil {
		var ce *CorruptError
		if errors.As(err, &ce) {
			return Claim{}, err
		}
		return Claim{}, unusable(path, err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return Claim{}, fmt.Errorf("ledger %s is %w (waited %s): a running agent holds it; stop the agent (systemctl stop gpuherd) first",
			path, ErrLocked, lockTimeout)
	case err != nil:
		return Claim{}, unusable(path, err)
	}
	defer db.Close()
	// The journal's writes first: one of them may be the record to
	// remove, and applied after the removal it would bring it back.
	if _, err := settleJournal(db, path, schemaSettled); err != nil {
		return Claim{}, err
	}
	var out Claim
	err = db.Update(func(tx *bolt.Tx) error {
		meta, claims := tx.Bucket(bucketMeta), tx.Bucket(bucketClaims)
		if meta == nil || claims == nil {
			return &CorruptError{Path: path, Bucket: string(bucketClaims), Err: errors.New("bucket missing: this is not a gpuherd ledger, or a damaged one; restore a backup")}
		}
		if err := checkPages(tx, path); err != nil {
			return err
		}
		v := claims.Get([]byte(id))
		if v == nil {
			return fmt.Errorf("ledger %s: claim %q: %w in the file", path, id, ErrNotFound)
		}
		if rec, err := decodeClaim([]byte(id), v); err == nil {
			out = copyClaim(rec.Claim)
		} else {
			out = Claim{ID: id}
		}
		if err := claims.Delete([]byte(id)); err != nil {
			return fmt.Errorf("ledger %s: delete claim %q: %w", path, id, err)
		}
		var rev uint64
		if raw := meta.Get(keyRevision); len(raw) == 8 {
			rev = binary.BigEndian.Uint64(raw)
		}
		return meta.Put(keyRevision, encodeRevision(rev+1))
	})
	if err != nil {
		return Claim{}, err
	}
	return out, nil
}
