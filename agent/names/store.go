package names

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Store is raft's log and stable store in one bbolt file. Every write is
// one bbolt transaction, fsynced before it returns, so what raft was told
// is on disk survives kill -9.
//
// hashicorp/raft-boltdb/v2 is the usual choice. Its v2.3.1 imports
// go-metrics/compat, which go-metrics v0.7.0 (required by memberlist
// v0.7.0 and raft v1.8.0) no longer has, so it cannot be built in this
// module; this store does the same job on the bbolt already in use.
type Store struct {
	db      *bolt.DB
	path    string
	commits atomic.Uint64
}

var (
	bucketLogs   = []byte("logs")
	bucketStable = []byte("stable")
	// errKeyNotFound's text is what raft compares against for a missing
	// stable key.
	errKeyNotFound = errors.New("not found")
)

// storeLockTimeout bounds the wait for a file another process holds.
const storeLockTimeout = 2 * time.Second

// OpenStore opens or creates the store at path.
func OpenStore(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: storeLockTimeout})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("name registry store %s is locked by another process (waited %s): is another agent running on this data directory?", path, storeLockTimeout)
		}
		return nil, fmt.Errorf("name registry store %s: %w", path, err)
	}
	s := &Store{db: db, path: path}
	if err := s.update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketLogs, bucketStable} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Path is the store's file.
func (s *Store) Path() string { return s.path }

// Commits counts the write transactions since the store was opened; each
// is fsynced (bbolt syncs the data pages, then the meta page).
func (s *Store) Commits() uint64 { return s.commits.Load() }

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

func (s *Store) update(fn func(*bolt.Tx) error) error {
	if err := s.db.Update(fn); err != nil {
		return fmt.Errorf("name registry store %s: %w", filepath.Base(s.path), err)
	}
	s.commits.Add(1)
	return nil
}

var (
	_ raft.LogStore    = (*Store)(nil)
	_ raft.StableStore = (*Store)(nil)
)

func indexKey(i uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], i)
	return b[:]
}

// FirstIndex is the lowest index in the log, 0 when it is empty.
func (s *Store) FirstIndex() (uint64, error) {
	var i uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		if k, _ := tx.Bucket(bucketLogs).Cursor().First(); k != nil {
			i = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return i, err
}

// LastIndex is the highest index in the log, 0 when it is empty.
func (s *Store) LastIndex() (uint64, error) {
	var i uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		if k, _ := tx.Bucket(bucketLogs).Cursor().Last(); k != nil {
			i = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return i, err
}

// GetLog reads the entry at index into l.
func (s *Store) GetLog(index uint64, l *raft.Log) error {
	return s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketLogs).Get(indexKey(index))
		if v == nil {
			return raft.ErrLogNotFound
		}
		if err := decodeLog(v, l); err != nil {
			return fmt.Errorf("name registry store %s: log entry %d: %w", s.path, index, err)
		}
		l.Index = index
		return nil
	})
}

// StoreLog writes one entry.
func (s *Store) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs writes entries in one fsynced transaction.
func (s *Store) StoreLogs(logs []*raft.Log) error {
	return s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLogs)
		for _, l := range logs {
			if err := b.Put(indexKey(l.Index), encodeLog(l)); err != nil {
				return err
			}
		}
		return nil
	})
}

// DeleteRange removes the entries from min to max, both included.
func (s *Store) DeleteRange(lo, hi uint64) error {
	return s.update(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketLogs).Cursor()
		for k, _ := c.Seek(indexKey(lo)); k != nil && binary.BigEndian.Uint64(k) <= hi; k, _ = c.Next() {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
}

// Set stores a stable value.
func (s *Store) Set(key, val []byte) error {
	return s.update(func(tx *bolt.Tx) error { return tx.Bucket(bucketStable).Put(key, val) })
}

// Get reads a stable value; a missing key is an error whose text raft
// recognises.
func (s *Store) Get(key []byte) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketStable).Get(key)
		if v == nil {
			return errKeyNotFound
		}
		out = append([]byte(nil), v...)
		return nil
	})
	return out, err
}

// SetUint64 stores a stable number.
func (s *Store) SetUint64(key []byte, val uint64) error { return s.Set(key, indexKey(val)) }

// GetUint64 reads a stable number.
func (s *Store) GetUint64(key []byte) (uint64, error) {
	v, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("name registry store %s: stable key %q holds %d bytes, want 8", s.path, key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// logFormat is the first byte of a stored log entry.
const logFormat byte = 1

// encodeLog writes an entry as: format, term, type, appended-at (Unix
// nanoseconds), data, extensions; numbers as varints, byte strings with
// their length first. The index is the key.
func encodeLog(l *raft.Log) []byte {
	b := make([]byte, 0, 1+3*binary.MaxVarintLen64+1+2*binary.MaxVarintLen64+len(l.Data)+len(l.Extensions))
	b = append(b, logFormat)
	b = binary.AppendUvarint(b, l.Term)
	b = append(b, byte(l.Type))
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	b = binary.AppendVarint(b, at)
	b = binary.AppendUvarint(b, uint64(len(l.Data)))
	b = append(b, l.Data...)
	b = binary.AppendUvarint(b, uint64(len(l.Extensions)))
	return append(b, l.Extensions...)
}

func decodeLog(b []byte, l *raft.Log) error {
	if len(b) == 0 || b[0] != logFormat {
		return errors.New("unknown entry format")
	}
	b = b[1:]
	term, n := binary.Uvarint(b)
	if n <= 0 || len(b) < n+1 {
		return errors.New("truncated term")
	}
	typ := raft.LogType(b[n])
	b = b[n+1:]
	at, n := binary.Varint(b)
	if n <= 0 {
		return errors.New("truncated time")
	}
	b = b[n:]
	data, b, err := lengthPrefixed(b)
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	ext, b, err := lengthPrefixed(b)
	if err != nil {
		return fmt.Errorf("extensions: %w", err)
	}
	if len(b) != 0 {
		return errors.New("trailing bytes")
	}
	*l = raft.Log{Term: term, Type: typ, Data: data, Extensions: ext}
	if at != 0 {
		l.AppendedAt = time.Unix(0, at)
	}
	return nil
}

func lengthPrefixed(b []byte) (field, rest []byte, err error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		return nil, nil, errors.New("truncated")
	}
	b = b[k:]
	if n == 0 {
		return nil, b, nil
	}
	return append([]byte(nil), b[:n]...), b[n:], nil
}
