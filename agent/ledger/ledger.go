// Package ledger is the owner's record of who holds which GPU of this server.
//
// Each server is the only authority over its own GPUs: a claim exists when,
// and only when, this ledger has written it durably. Every state-changing
// call is one bbolt read-write transaction that reads the current records,
// decides, writes, and is fsynced before the call returns; so a check and the
// take that follows it are atomic, and an acknowledged claim survives kill -9.
//
// The ledger holds no clock: every call whose answer depends on time takes
// now, and a reservation is live strictly before its ExpiresAt.
//
// What the ledger does not know is the hardware: the inventory tells it which
// GPUs exist (SetInventory), and that list lives only in memory, because the
// hardware, not the file, is the truth about it.
package ledger

import (
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// DefaultLockTimeout is how long Open waits for another process to let go
// of the file before it gives up; long enough to ride over the previous
// agent's exit during a restart, short enough to fail a start visibly.
const DefaultLockTimeout = 2 * time.Second

// Option tunes Open.
type Option func(*options)

type options struct {
	maxGPUs     int
	lockTimeout time.Duration
}

// WithMaxGPUs sets the most GPUs one claim may hold (default DefaultMaxGPUs).
// Values below 1 keep the default.
func WithMaxGPUs(n int) Option {
	return func(o *options) {
		if n >= 1 {
			o.maxGPUs = n
		}
	}
}

// WithLockTimeout sets how long Open waits for the file lock (default
// DefaultLockTimeout). Values of zero or less keep the default: bbolt would
// otherwise wait forever, and a hung agent is worse than a failed one.
func WithLockTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.lockTimeout = d
		}
	}
}

// Ledger is the durable claims ledger of one server. It is safe for
// concurrent use; it must not be used after Close.
type Ledger struct {
	path    string
	db      *bolt.DB
	maxGPUs int

	// writeMu serialises writers: bbolt would too, but the cached state must
	// change in the same order as the file. It is held across the fsync.
	writeMu sync.Mutex
	// mu guards the state pointer only, so that readers (metrics, gossip)
	// never wait for a writer's fsync, just for the pointer swap.
	mu    sync.RWMutex
	state *state // the file after the last committed write, plus the inventory; never modified once published
}

// Open opens (creating it with mode 0600 if needed) the ledger file at path.
//
// It fails with ErrLocked when another process holds the file, with
// ErrSchemaTooNew when a newer gpuherd wrote it, and with a *CorruptError
// when any record cannot be read: it never starts empty over existing data.
func Open(path string, opts ...Option) (*Ledger, error) {
	o := options{maxGPUs: DefaultMaxGPUs, lockTimeout: DefaultLockTimeout}
	for _, opt := range opts {
		opt(&o)
	}

	switch err := checkFile(path); {
	case errors.Is(err, fs.ErrNotExist):
		if err := create(path); err != nil {
			return nil, err
		}
	case err != nil:
		var ce *CorruptError
		if errors.As(err, &ce) {
			return nil, err
		}
		return nil, unusable(path, err)
	}
	db, st, err := openFile(path, o)
	if err != nil {
		return nil, err
	}
	return &Ledger{
		path:    path,
		db:      db,
		maxGPUs: o.maxGPUs,
		state:   st,
	}, nil
}

// openFile opens and reads the file. bbolt panics on some damaged pages
// (a freelist or branch that points nowhere); that is a corrupt file, not a
// reason to crash the agent.
func openFile(path string, o options) (db *bolt.DB, st *state, err error) {
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				_ = db.Close()
			}
			db, st, err = nil, nil, &CorruptError{Path: path, Err: fmt.Errorf("bbolt failed reading it: %v", r)}
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: o.lockTimeout, NoSync: false})
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return nil, nil, fmt.Errorf("ledger %s is %w (waited %s): is another gpuherd agent running with the same data directory?",
			path, ErrLocked, o.lockTimeout)
	case errors.Is(err, bolterrors.ErrInvalid), errors.Is(err, bolterrors.ErrChecksum), errors.Is(err, bolterrors.ErrVersionMismatch):
		return nil, nil, &CorruptError{Path: path, Err: err}
	case err != nil:
		return nil, nil, unusable(path, err)
	}
	st, err = initFile(db, path)
	if err != nil {
		_ = db.Close() // the open error is the one worth reporting
		return nil, nil, err
	}
	return db, st, nil
}

// initFile creates the buckets of a new file, or checks the schema of an
// existing one, and reads every record once so that a damaged file is
// refused at start rather than half-way through serving claims.
func initFile(db *bolt.DB, path string) (*state, error) {
	var fresh bool
	err := db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketMeta) != nil {
			return nil
		}
		fresh = true
		return tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			// Buckets without our meta bucket: some other program's file.
			// Writing our schema into it would hide that mistake.
			return &CorruptError{Path: path, Bucket: string(bucketMeta),
				Err: fmt.Errorf("missing, but the file holds bucket %q: this is not a gpuherd ledger", name)}
		})
	})
	if err != nil {
		return nil, err
	}
	if fresh {
		// A bbolt file without buckets: an older gpuherd that stopped
		// between creating the file and writing its schema.
		if err := db.Update(initBuckets); err != nil {
			return nil, fmt.Errorf("initialise ledger %s: %w", path, err)
		}
	}

	var st *state
	err = db.View(func(tx *bolt.Tx) error {
		if err := checkPages(tx, path); err != nil {
			return err
		}
		var err error
		st, err = load(tx, path)
		return err
	})
	return st, err
}

// Close releases the file. Every acknowledged write is already on disk, so
// Close has nothing to flush; it only frees the lock for the next agent.
func (l *Ledger) Close() error {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if err := l.db.Close(); err != nil {
		return fmt.Errorf("close ledger %s: %w", l.path, err)
	}
	return nil
}

// Path is the ledger file.
func (l *Ledger) Path() string { return l.path }

// MaxGPUs is the most GPUs one claim may hold on this ledger.
func (l *Ledger) MaxGPUs() int { return l.maxGPUs }

// Revision is a counter bumped by every change to claims, drains or the
// inventory, persisted with them. The gossip layer re-publishes this
// server's capacity when it moves. Time passing alone (a lease running out)
// does not move it until Expire removes the reservation.
func (l *Ledger) Revision() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.state.rev
}

// errUnchanged rolls back a write transaction that decided to change
// nothing, so that an idempotent retry costs no fsync.
var errUnchanged = errors.New("unchanged")

// write runs fn in one read-write transaction over freshly read state,
// under the write lock. fn changes the file through st's methods and returns
// whether it changed anything. If it did, the revision is bumped in the same
// transaction, the transaction commits (fsync), the cache is replaced, and
// fn's error, if any, is returned after the commit: that is how an operation
// both drops an expired reservation and reports ErrLeaseExpired. If nothing
// changed, the transaction is rolled back and fn's error returned.
func (l *Ledger) write(fn func(tx *bolt.Tx, st *state) (changed bool, err error)) error {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	var (
		next  *state
		fnErr error
	)
	err := l.db.Update(func(tx *bolt.Tx) error {
		st, err := load(tx, l.path)
		if err != nil {
			return err
		}
		// The inventory is not in the file; carry it over. Its map is
		// never modified in place, only replaced, so sharing it is safe.
		// Only writers replace l.state, and writeMu is held: no lock needed
		// to read it here.
		st.inventory = l.state.inventory
		changed, err := fn(tx, st)
		if !changed {
			fnErr = err
			return errUnchanged
		}
		st.rev++
		if err := tx.Bucket(bucketMeta).Put(keyRevision, encodeRevision(st.rev)); err != nil {
			return fmt.Errorf("write revision: %w", err)
		}
		next, fnErr = st, err
		return nil
	})
	switch {
	case errors.Is(err, errUnchanged):
		return fnErr
	case err != nil:
		return fmt.Errorf("ledger %s: write not acknowledged: %w", l.path, err)
	}
	l.mu.Lock()
	l.state = next
	l.mu.Unlock()
	return fnErr
}
