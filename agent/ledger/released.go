package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// bucketReleased remembers claims this server released: claim ID ->
// Released. It is created on first use, so a ledger written by an older
// gpuherd opens unchanged and an older gpuherd ignores the bucket.
var bucketReleased = []byte("released")

// maxReleased bounds the released claims remembered; past it the oldest
// are forgotten first.
var maxReleased = 4096

// Released is what the ledger remembers of a claim it released: the
// request, so that a later claim of the ID can come back here.
type Released struct {
	ID         string            `json:"id"`
	Items      []Item            `json:"items"`
	Labels     map[string]string `json:"labels,omitempty"`
	ReleasedAt time.Time         `json:"released_at"`
	// NameToken is the name token the claim was committed under (0: none),
	// so that the anti-entropy pass can tell a name whose release did not
	// reach the registry from one moved here whose commit never happened.
	NameToken uint64 `json:"name_token,omitempty"`
}

// Remember records that claim c was released at now, durably, forgetting
// records older than keep and the oldest beyond maxReleased. keep 0
// remembers nothing (and forgets everything). A release of a committed
// claim remembers it in its own transaction (ReleaseRemembering); this is
// for a claim released otherwise.
func (l *Ledger) Remember(c Claim, now time.Time, keep time.Duration) error {
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	err := l.journalWrite(OpRemember, func(tx *fileTx) error { return l.rememberIn(tx, c, now, keep) })
	if err != nil {
		return fmt.Errorf("ledger %s: remember released claim %s: %w", l.path, c.ID, err)
	}
	return nil
}

// releasedIndex is when each remembered released claim was released, as
// the released bucket holds it, so that forgetting the old ones reads no
// record: a release used to decode every remembered record (up to
// maxReleased) to find them. Writers keep it under fileMu, in the
// transaction that changes the bucket; a transaction that fails drops it,
// and the next one rebuilds it from the file.
type releasedIndex struct {
	at map[string]time.Time
	// oldest is a lower bound of at's times (zero: unknown): until it
	// is older than keep, and while at is within maxReleased, there is
	// nothing to forget.
	oldest time.Time
}

// releasedIn returns the index of b, building it when there is none. A
// record that does not decode is indexed as released at the zero time, so
// that the next forgetting drops it.
func (l *Ledger) releasedIn(tx *fileTx) (*releasedIndex, error) {
	if l.released != nil {
		return l.released, nil
	}
	idx := &releasedIndex{at: map[string]time.Time{}}
	err := tx.forEach(bucketReleased, func(k, v []byte) error {
		var r Released
		if json.Unmarshal(v, &r) != nil {
			r.ReleasedAt = time.Time{}
		}
		idx.at[string(k)] = r.ReleasedAt
		return nil
	})
	if err != nil {
		return nil, err
	}
	l.released = idx
	return idx, nil
}

// rememberIn writes c as released at now into tx and forgets what is due
// (see Remember). Call with fileMu held; a caller whose transaction then
// fails drops l.released.
func (l *Ledger) rememberIn(tx *fileTx, c Claim, now time.Time, keep time.Duration) (err error) {
	defer func() {
		if err != nil {
			l.released = nil // the transaction will not commit what the index took
		}
	}()
	idx, err := l.releasedIn(tx)
	if err != nil {
		return err
	}
	if keep > 0 {
		rec := Released{ID: c.ID, Items: slices.Clone(c.Items), Labels: maps.Clone(c.Labels), ReleasedAt: now.UTC(), NameToken: c.NameToken}
		v, err := json.Marshal(rec)
		if err != nil {
			return fmt.Errorf("encode released claim %q: %w", c.ID, err)
		}
		tx.put(bucketReleased, []byte(c.ID), v)
		idx.at[c.ID] = rec.ReleasedAt
		if idx.oldest.After(rec.ReleasedAt) {
			idx.oldest = rec.ReleasedAt
		}
	}
	idx.forget(tx, now, keep)
	return nil
}

// forget drops records older than keep, then the oldest beyond
// maxReleased.
func (idx *releasedIndex) forget(tx *fileTx, now time.Time, keep time.Duration) {
	if len(idx.at) <= maxReleased && !idx.oldest.IsZero() && now.Sub(idx.oldest) < keep {
		return
	}
	type aged struct {
		id string
		at time.Time
	}
	var (
		all  []aged
		drop []string
	)
	for id, at := range idx.at {
		if now.Sub(at) >= keep {
			drop = append(drop, id)
			continue
		}
		all = append(all, aged{id, at})
	}
	if len(all) > maxReleased {
		slices.SortFunc(all, func(x, y aged) int { return x.at.Compare(y.at) })
		for _, a := range all[:len(all)-maxReleased] {
			drop = append(drop, a.id)
		}
		all = all[len(all)-maxReleased:]
	}
	for _, id := range drop {
		tx.delete(bucketReleased, []byte(id))
		delete(idx.at, id)
	}
	idx.oldest = time.Time{}
	for _, a := range all {
		if idx.oldest.IsZero() || a.at.Before(idx.oldest) {
			idx.oldest = a.at
		}
	}
	if idx.oldest.IsZero() {
		idx.oldest = now.UTC() // nothing left: nothing is older than now
	}
}

// Recall returns what the ledger remembers of released claim id, if it
// was released less than keep before now.
func (l *Ledger) Recall(id string, now time.Time, keep time.Duration) (Released, bool, error) {
	var (
		r     Released
		found bool
	)
	err := l.view(func(tx recordReader) error {
		v := tx.get(bucketReleased, []byte(id))
		if v == nil {
			return nil
		}
		if err := json.Unmarshal(v, &r); err != nil {
			return &CorruptError{Path: l.path, Bucket: string(bucketReleased), Key: id, Err: err}
		}
		found = now.Sub(r.ReleasedAt) < keep
		return nil
	})
	if err != nil {
		var ce *CorruptError
		if errors.As(err, &ce) {
			return Released{}, false, err
		}
		return Released{}, false, fmt.Errorf("ledger %s: read released claim %s: %w", l.path, id, err)
	}
	return r, found, nil
}

// RecallAll returns every released claim remembered at now (released less
// than keep before it), oldest first.
func (l *Ledger) RecallAll(now time.Time, keep time.Duration) ([]Released, error) {
	var out []Released
	err := l.view(func(tx recordReader) error {
		return tx.forEach(bucketReleased, func(k, v []byte) error {
			var r Released
			if json.Unmarshal(v, &r) == nil && now.Sub(r.ReleasedAt) < keep {
				out = append(out, r)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("ledger %s: read released claims: %w", l.path, err)
	}
	slices.SortFunc(out, func(x, y Released) int { return x.ReleasedAt.Compare(y.ReleasedAt) })
	return out, nil
}
