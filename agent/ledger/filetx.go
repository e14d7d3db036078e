package ledger

import (
	"bytes"
	"sort"

	bolt "go.etcd.io/bbolt"
)

// recordReader reads the ledger file's records: bbolt's, or bbolt's with
// the journal's records not yet checkpointed on top (fileTx).
type recordReader interface {
	hasBucket(name []byte) bool
	// get returns the value of key in bucket, nil when there is none.
	// It is valid only while the reader is.
	get(bucket, key []byte) []byte
	// forEach calls fn for every key of bucket in key order.
	forEach(bucket []byte, fn func(k, v []byte) error) error
}

// boltReader reads a bbolt transaction alone.
type boltReader struct{ tx *bolt.Tx }

func (r boltReader) hasBucket(name []byte) bool { return r.tx.Bucket(name) != nil }

func (r boltReader) get(bucket, key []byte) []byte {
	if b := r.tx.Bucket(bucket); b != nil {
		return b.Get(key)
	}
	return nil
}

func (r boltReader) forEach(bucket []byte, fn func(k, v []byte) error) error {
	if b := r.tx.Bucket(bucket); b != nil {
		return b.ForEach(fn)
	}
	return nil
}

// fileTx is one write to the ledger file as its writers see it: the file
// (bbolt's last checkpoint, btx, read-only, and the journal's records since,
// base) with their own changes on top. The changes are kept as the journal
// operations that write them (ops). A fileTx with no btx reads base alone.
type fileTx struct {
	btx  *bolt.Tx
	base overlay // not modified through the fileTx
	own  overlay // this write's changes
	ops  []journalOp
}

func newFileTx(btx *bolt.Tx, base overlay) *fileTx {
	return &fileTx{btx: btx, base: base, own: overlay{}}
}

func (t *fileTx) hasBucket(name []byte) bool {
	return t.btx != nil && t.btx.Bucket(name) != nil || t.base[string(name)] != nil || t.own[string(name)] != nil
}

func (t *fileTx) get(bucket, key []byte) []byte {
	if v, ok := t.own.get(bucket, key); ok {
		return v
	}
	if v, ok := t.base.get(bucket, key); ok {
		return v
	}
	if t.btx == nil {
		return nil
	}
	return boltReader{t.btx}.get(bucket, key)
}

func (t *fileTx) forEach(bucket []byte, fn func(k, v []byte) error) error {
	if len(t.base[string(bucket)]) == 0 && len(t.own[string(bucket)]) == 0 {
		if t.btx == nil {
			return nil
		}
		return boltReader{t.btx}.forEach(bucket, fn)
	}
	merged := map[string][]byte{}
	if t.btx != nil {
		err := boltReader{t.btx}.forEach(bucket, func(k, v []byte) error {
			merged[string(k)] = v
			return nil
		})
		if err != nil {
			return err
		}
	}
	for _, o := range []overlay{t.base, t.own} {
		for k, v := range o[string(bucket)] {
			if v == nil {
				delete(merged, k)
			} else {
				merged[k] = v
			}
		}
	}
	keys := make([]string, 0, len(merged))
	for k := range merged {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := fn([]byte(k), merged[k]); err != nil {
			return err
		}
	}
	return nil
}

// put records value under key in bucket. The value is copied.
func (t *fileTx) put(bucket, key, value []byte) {
	t.record(journalOp{Bucket: string(bucket), Key: string(key), Value: bytes.Clone(value)})
}

// delete records that key is gone from bucket.
func (t *fileTx) delete(bucket, key []byte) {
	t.record(journalOp{Bucket: string(bucket), Key: string(key), Delete: true})
}

func (t *fileTx) record(op journalOp) {
	t.ops = append(t.ops, op)
	t.own.apply([]journalOp{op})
}

// changed says whether the write changed anything.
func (t *fileTx) changed() bool { return len(t.ops) > 0 }
