package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
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
// remembers nothing (and forgets everything).
func (l *Ledger) Remember(c Claim, now time.Time, keep time.Duration) error {
	rec := Released{ID: c.ID, Items: slices.Clone(c.Items), Labels: maps.Clone(c.Labels), ReleasedAt: now.UTC(), NameToken: c.NameToken}
	v, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode released claim %q: %w", c.ID, err)
	}
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	err = l.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketReleased)
		if err != nil {
			return err
		}
		if keep > 0 {
			if err := b.Put([]byte(c.ID), v); err != nil {
				return err
			}
		}
		return forgetReleased(b, now, keep)
	})
	if err != nil {
		err = fmt.Errorf("ledger %s: remember released claim %s: %w", l.path, c.ID, err)
		l.wrote(OpRemember, err)
		return err
	}
	l.syncs.Add(1)
	l.wrote(OpRemember, nil)
	return nil
}

// forgetReleased drops records older than keep, then the oldest beyond
// maxReleased. The bucket is small (bounded), so a full scan per release
// costs little next to the fsync.
func forgetReleased(b *bolt.Bucket, now time.Time, keep time.Duration) error {
	type aged struct {
		id string
		at time.Time
	}
	var all []aged
	var drop [][]byte
	err := b.ForEach(func(k, v []byte) error {
		var r Released
		if json.Unmarshal(v, &r) != nil || now.Sub(r.ReleasedAt) >= keep {
			drop = append(drop, bytes.Clone(k))
			return nil
		}
		all = append(all, aged{string(k), r.ReleasedAt})
		return nil
	})
	if err != nil {
		return err
	}
	if len(all) > maxReleased {
		slices.SortFunc(all, func(x, y aged) int { return x.at.Compare(y.at) })
		for _, a := range all[:len(all)-maxReleased] {
			drop = append(drop, []byte(a.id))
		}
	}
	for _, k := range drop {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// Recall returns what the ledger remembers of released claim id, if it
// was released less than keep before now.
func (l *Ledger) Recall(id string, now time.Time, keep time.Duration) (Released, bool, error) {
	var (
		r     Released
		found bool
	)
	err := l.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketReleased)
		if b == nil {
			return nil
		}
		v := b.Get([]byte(id))
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
	err := l.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketReleased)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
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
