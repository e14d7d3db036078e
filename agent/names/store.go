package names

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Store is raft's log and stable store. The log is a write-ahead log of
// its own (wal.go: one write and one fdatasync per append, the leader's
// commands synced beside their replication); the stable values (term,
// vote) and the log's first index after a compaction are in one bbolt
// file, each write one fsynced transaction. What raft was told is stored
// survives kill -9.
//
// hashicorp/raft-boltdb/v2 is the usual choice for both. Its v2.3.1
// imports go-metrics/compat, which go-metrics v0.7.0 (required by
// memberlist v0.7.0 and raft v1.8.0) no longer has, so it cannot be built
// in this module; and every append there is a bbolt transaction, two
// fsyncs, where the write-ahead log costs one.
type Store struct {
	db      *bolt.DB
	path    string
	log     *wal
	commits atomic.Uint64
	// leading says whether this server leads raft (set once raft runs):
	// its appends are then written ahead (wal.appendAhead).
	leading atomic.Pointer[func() bool]
}

var (
	// bucketLogs held the log before it moved to the write-ahead log;
	// OpenStore moves what it still holds.
	bucketLogs   = []byte("logs")
	bucketStable = []byte("stable")
	// keyLogFirst is the log's first index after the last compaction.
	keyLogFirst = []byte("gpuherd_log_first")
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
		_, err := tx.CreateBucketIfNotExists(bucketStable)
		return err
	}); err != nil {
		db.Close()
		return nil, err
	}
	keep, err := s.GetUint64(keyLogFirst)
	if err != nil && !errors.Is(err, errKeyNotFound) {
		db.Close()
		return nil, err
	}
	if s.log, err = openWAL(LogDir(path), keep, func() { s.commits.Add(1) }); err != nil {
		db.Close()
		return nil, err
	}
	if err := s.moveBoltLog(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// LogDir is the directory of the write-ahead log beside the store file
// path.
func LogDir(path string) string {
	return filepath.Join(filepath.Dir(path), strings.TrimSuffix(filepath.Base(path), ".db")+"-log")
}

// moveBoltLog moves a log kept in the bbolt file (by an agent of an older
// version) into the write-ahead log: the entries are appended and synced
// before the bucket is deleted, and a move interrupted before that starts
// over from the bucket.
func (s *Store) moveBoltLog() error {
	var logs []*raft.Log
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLogs)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			var l raft.Log
			if err := decodeLog(v, &l); err != nil {
				return fmt.Errorf("log entry %d: %w", binary.BigEndian.Uint64(k), err)
			}
			l.Index = binary.BigEndian.Uint64(k)
			logs = append(logs, &l)
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("name registry store %s: moving its log: %w", s.path, err)
	}
	if len(logs) == 0 && !s.hasBoltLog() {
		return nil
	}
	if len(logs) > 0 {
		if first, last := s.log.bounds(); last != 0 {
			if err := s.log.deleteRange(first, last); err != nil {
				return err
			}
		}
		if err := s.log.append(logs); err != nil {
			return err
		}
	}
	return s.update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketLogs) == nil {
			return nil
		}
		return tx.DeleteBucket(bucketLogs)
	})
}

// Path is the store's file.
func (s *Store) Path() string { return s.path }

// Commits counts the durable writes since the store was opened: bbolt
// transactions (each syncs its data pages, then its meta page), log
// appends (one fdatasync each) and the directory syncs of log segments
// made or removed.
func (s *Store) Commits() uint64 { return s.commits.Load() }

// Close closes the files.
func (s *Store) Close() error {
	var err error
	if s.log != nil {
		err = s.log.close()
	}
	return errors.Join(err, s.db.Close())
}

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

func (s *Store) hasBoltLog() bool {
	found := false
	_ = s.db.View(func(tx *bolt.Tx) error {
		found = tx.Bucket(bucketLogs) != nil
		return nil
	})
	return found
}

// FirstIndex is the lowest index in the log, 0 when it is empty.
func (s *Store) FirstIndex() (uint64, error) {
	first, _ := s.log.bounds()
	return first, nil
}

// LastIndex is the highest index in the log, 0 when it is empty.
func (s *Store) LastIndex() (uint64, error) {
	_, last := s.log.bounds()
	return last, nil
}

// GetLog reads the entry at index into l. A server that does not lead
// reads an entry it wrote ahead while it led only once it is durable:
// raft acknowledges to the new leader entries it finds already in its log
// without storing them again, and it must not vouch for a copy a power
// cut could still take.
func (s *Store) GetLog(index uint64, l *raft.Log) error {
	if err := s.log.get(index, l); err != nil {
		return err
	}
	if leading := s.leading.Load(); leading != nil && !(*leading)() {
		return s.log.waitDurable(index)
	}
	return nil
}

// StoreLog writes one entry.
func (s *Store) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs appends entries, synced before it returns; the leader's are
// written ahead instead, made durable while raft sends them to the
// followers (wal.appendAhead), and WaitDurable waits for them.
//
// Raft stores the leader's entries from its leader loop and a follower's
// from the loop that handles the leader's calls, which makes the server a
// follower before it stores anything: so leading, read here, is the role
// the entries are stored in. A follower never writes ahead: it tells the
// leader an entry is stored only once it is durable.
//
// Only commands are written ahead. A configuration entry is synced
// before raft sends it: raft takes the next membership change once the
// one before is committed, and answers a change on commit, not through
// the state machine; a change committed on the leader's written copy and
// lost in a power cut could leave two majorities of different voter sets.
// The no-op a new leader appends is synced too, since raft counts it
// before it takes a membership change.
func (s *Store) StoreLogs(logs []*raft.Log) error {
	if leading := s.leading.Load(); leading != nil && (*leading)() && onlyCommands(logs) {
		return s.log.appendAhead(logs)
	}
	return s.log.append(logs)
}

func onlyCommands(logs []*raft.Log) bool {
	for _, l := range logs {
		if l.Type != raft.LogCommand {
			return false
		}
	}
	return true
}

// writeAheadWhile makes the appends made while leading answers true
// written ahead.
func (s *Store) writeAheadWhile(leading func() bool) { s.leading.Store(&leading) }

// reportAheadSyncs tells report of each fdatasync of entries written
// ahead: they are not part of an append's time.
func (s *Store) reportAheadSyncs(report func(start time.Time, err error)) {
	s.log.wmu.Lock()
	s.log.aheadSynced = report
	s.log.wmu.Unlock()
}

// durableIndex is the index up to which the log is on disk.
func (s *Store) durableIndex() uint64 { return s.log.durableIndex() }

// WaitDurable waits until the log's entry at index is on disk; it fails
// when the disk failed the sync of entries written ahead (the log then
// takes no more appends).
func (s *Store) WaitDurable(index uint64) error { return s.log.waitDurable(index) }

// DeleteRange removes the entries from min to max, both included. A
// compaction (from the front) records the new first index before any
// segment changes, so entries it deleted from a segment that stays on disk
// are not read back after a restart.
func (s *Store) DeleteRange(lo, hi uint64) error {
	first, last := s.log.bounds()
	if last == 0 || hi < first || lo > last {
		return nil
	}
	if lo <= first {
		keep := hi + 1
		if hi >= last {
			keep = 0 // everything: the next append may start anywhere
		}
		if err := s.SetUint64(keyLogFirst, keep); err != nil {
			return err
		}
	}
	return s.log.deleteRange(lo, hi)
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
