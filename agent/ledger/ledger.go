// Package ledger is the owner's record of who holds which GPU of this server.
//
// Each server is the only authority over its own GPUs: a claim is committed
// when, and only when, this ledger has written it durably. Every
// state-changing call runs under one writer lock, so a check and the take
// that follows it are atomic.
//
// Only committed claims and drains are written to the file: each call that
// changes them reads the current records, decides, and writes what it
// changed as one record of the file's journal, fdatasynced before the call
// returns, so an acknowledged commit survives kill -9; the journal goes
// into the bbolt file now and then, and at the next Open after a crash
// (journal.go). Reservations live in memory only: the agent would drop
// every one at a restart anyway (its lease ran on the previous run's
// clock, and its coordinator has seen the agent fail), so writing them
// would buy nothing. Reserve, Extend, Expire and releasing a reservation
// touch no file; a claim costs one fdatasync, its Commit.
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
	"os"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/gpuherd/gpuherd/internal/datasync"
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
	writeResult func(op string, err error)
	writeTime   func(op string, d time.Duration)
	journalSize int64
	datasync    func(*os.File) error
}

// Write operations, as WithWriteResult names them.
const (
	OpWrite    = "write"             // claims, reservations' commits, drains
	OpRemember = "remember_released" // a released claim's record
	OpFacts    = "facts"             // what NVML told of a GPU
	// OpCheckpoint is the journal's records written into the bbolt file.
	OpCheckpoint = "checkpoint"
)

// WithWriteResult has fn told the outcome of every write to the file (nil
// when it was acknowledged), so that the agent can report a store that
// fails; fn must be quick and must not call the ledger.
func WithWriteResult(fn func(op string, err error)) Option {
	return func(o *options) { o.writeResult = fn }
}

// WithWriteTime has fn told how long every acknowledged write to the file
// took, to the end of its fdatasync: the append of its journal record (a
// batch of writers is one), and each checkpoint (OpCheckpoint) whole. It
// is what the disk makes a claim wait for. fn must be quick and must not
// call the ledger.
func WithWriteTime(fn func(op string, d time.Duration)) Option {
	return func(o *options) { o.writeTime = fn }
}

// WithDatasync replaces how the journal makes what it wrote durable
// (datasync.File, an fdatasync). fn is called with the journal's file for
// every durable write; it is for tests that must hold a write between its
// bytes and its fdatasync, or fail the fdatasync, as a disk can.
func WithDatasync(fn func(*os.File) error) Option {
	return func(o *options) {
		if fn != nil {
			o.datasync = fn
		}
	}
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

// Ledger is the claims ledger of one server: committed claims and drains
// in its file, reservations in memory. It is safe for concurrent use; it
// must not be used after Close.
type Ledger struct {
	path    string
	db      *bolt.DB
	maxGPUs int
	// dropped is what Open removed from a file written by an older
	// gpuherd, which wrote reservations to it; never modified.
	dropped []Claim

	// fileMu serialises the file's write transactions (writeFile, Remember,
	// PutFacts, Close); it is held across each one's fsync.
	fileMu sync.Mutex
	// writeMu serialises changes to the state: a writer that changes only
	// memory (a reservation taken, extended or aborted) holds it alone, for
	// no longer than its check-and-take; a file transaction holds it while
	// its writers run, not while the transaction is written and synced
	// (see pending). Take fileMu first when both are needed.
	writeMu sync.Mutex
	// pending is the state a file transaction leaves, from when its writers
	// have run until it is synced and published, or dropped if the commit
	// fails; nil when no transaction is in flight. A writer that changes
	// only memory meanwhile changes both the published state and pending
	// (carry), or waits for the transaction. Guarded by writeMu.
	pending *state
	// queue is the writers waiting for the next file transaction (group
	// commit, writeFile); queueMu guards it alone.
	queueMu sync.Mutex
	queue   []*fileWrite
	// released indexes the released bucket (releasedIndex); nil until
	// first used, and after a write that failed. Guarded by fileMu.
	released *releasedIndex
	// mu guards the state pointer only, so that readers (metrics, gossip)
	// never wait for a writer's fsync, just for the pointer swap.
	mu    sync.RWMutex
	state *state // the file after the last committed write, plus the reservations and the inventory; never modified once published
	// writeErr is the failure of the last file write, nil once one succeeds.
	writeErr atomic.Pointer[error]
	// syncs counts the durable writes since Open (Syncs); fdatasyncs
	// the fdatasyncs they cost (Fdatasyncs).
	syncs, fdatasyncs atomic.Uint64
	// journal takes every write of claims, drains and released claims
	// first (journal.go); guarded by fileMu.
	journal *journal
	// unflushed is what the journal holds that the bbolt file does not
	// yet: changed under fileMu and overlayMu, read under either.
	unflushed overlay
	overlayMu sync.RWMutex
	// marked is whether the file's schema says that the journal may hold
	// writes it lacks (schemaJournalled); guarded by fileMu.
	marked bool
	// checkpointErr is why the last checkpoint failed, nil once one
	// succeeds. Guarded by fileMu.
	checkpointErr error
	// writeResult is told every file write's outcome (WithWriteResult).
	writeResult func(op string, err error)
	// writeTime is told every acknowledged file write's duration
	// (WithWriteTime).
	writeTime func(op string, d time.Duration)
}

// wrote tells the write observer, if any, of one write's outcome.
func (l *Ledger) wrote(op string, err error) {
	if l.writeResult != nil {
		l.writeResult(op, err)
	}
}

// took tells the write timer, if any, how long an acknowledged write
// that started at start took.
func (l *Ledger) took(op string, start time.Time) {
	if l.writeTime != nil {
		l.writeTime(op, time.Since(start))
	}
}

// Open opens (creating it with mode 0600 if needed) the ledger file at path.
// The ledger starts with the committed claims and drains of the file and no
// reservation: those of a previous run are gone with its memory. A file
// written by an older gpuherd may still hold reservations; Open removes them
// from it, in one write, and DroppedAtOpen lists them.
//
// It fails with ErrLocked when another process holds the file, with
// ErrSchemaTooNew when a newer gpuherd wrote it, with a *CorruptError when
// the file itself cannot be read, and with a *IntegrityError naming every
// unreadable record and every contradiction between claims (a GPU in two
// claims, a claim naming a GPU it holds no model for, items that do not
// match the GPUs' models): it never starts empty over existing data, nor
// serves from a file that would hand one GPU to two VMs.
func Open(path string, opts ...Option) (*Ledger, error) {
	o := options{maxGPUs: DefaultMaxGPUs, lockTimeout: DefaultLockTimeout, journalSize: journalSize, datasync: datasync.File}
	for _, opt := range opts {
		opt(&o)
	}

	switch err := checkFile(path); {
	case errors.Is(err, fs.ErrNotExist):
		if err := refuseOrphanJournal(path); err != nil {
			return nil, err
		}
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
	db, st, dropped, err := openFile(path, o)
	if err != nil {
		return nil, err
	}
	seq, err := fileJournalSeq(db)
	if err == nil {
		var j *journal
		if j, err = openJournal(JournalPath(path), 0, seq, o.journalSize, o.datasync); err == nil {
			return &Ledger{
				path:        path,
				db:          db,
				journal:     j,
				unflushed:   overlay{},
				maxGPUs:     o.maxGPUs,
				dropped:     dropped,
				state:       st,
				writeResult: o.writeResult,
				writeTime:   o.writeTime,
			}, nil
		}
	}
	_ = db.Close()
	return nil, unusable(JournalPath(path), err)
}

// refuseOrphanJournal fails when there is no ledger file at path but its
// journal holds writes: the file was moved or deleted, and starting empty
// would forget claims that the journal says were acknowledged.
func refuseOrphanJournal(path string) error {
	jpath := JournalPath(path)
	recs, _, err := readJournal(jpath, 0)
	switch {
	case err != nil:
		return fmt.Errorf("ledger %s is missing and its journal %s cannot be read (%v): restore the ledger, or move the journal aside to start with an empty one", path, jpath, err)
	case len(recs) > 0:
		return &CorruptError{Path: path, Err: fmt.Errorf("missing, but its journal %s holds %d writes to it: restore the ledger (gpuherd ledger check --file BACKUP), or move the journal aside too to start with an empty one", jpath, len(recs))}
	}
	return nil
}

// fileJournalSeq reads the journal sequence the file holds.
func fileJournalSeq(db *bolt.DB) (seq uint64, err error) {
	err = db.View(func(tx *bolt.Tx) error {
		seq, err = journalSeq(tx)
		return err
	})
	return seq, err
}

// openFile opens and reads the file. bbolt panics on some damaged pages
// (a freelist or branch that points nowhere); that is a corrupt file, not a
// reason to crash the agent.
func openFile(path string, o options) (db *bolt.DB, st *state, dropped []Claim, err error) {
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				_ = db.Close()
			}
			db, st, dropped, err = nil, nil, nil, &CorruptError{Path: path, Err: fmt.Errorf("bbolt failed reading it: %v", r)}
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: o.lockTimeout, NoSync: false})
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return nil, nil, nil, fmt.Errorf("ledger %s is %w (waited %s): is another gpuherd agent running with the same data directory?",
			path, ErrLocked, o.lockTimeout)
	case errors.Is(err, bolterrors.ErrInvalid), errors.Is(err, bolterrors.ErrChecksum), errors.Is(err, bolterrors.ErrVersionMismatch):
		return nil, nil, nil, &CorruptError{Path: path, Err: err}
	case err != nil:
		return nil, nil, nil, unusable(path, err)
	}
	st, dropped, err = initFile(db, path)
	if err != nil {
		_ = db.Close() // the open error is the one worth reporting
		return nil, nil, nil, err
	}
	return db, st, dropped, nil
}

// initFile creates the buckets of a new file, or checks the schema of an
// existing one, and reads every record once so that a damaged file is
// refused at start rather than half-way through serving claims. It then
// removes the reservations an older gpuherd left in the file, and returns
// them.
func initFile(db *bolt.DB, path string) (*state, []Claim, error) {
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
		return nil, nil, err
	}
	if fresh {
		// A bbolt file without buckets: an older gpuherd that stopped
		// between creating the file and writing its schema.
		if err := db.Update(initBuckets); err != nil {
			return nil, nil, fmt.Errorf("initialise ledger %s: %w", path, err)
		}
	}

	if err := db.View(func(tx *bolt.Tx) error { return checkPages(tx, path) }); err != nil {
		return nil, nil, err
	}
	// What a run that did not close the ledger left in the journal goes
	// into the file first.
	if _, err := settleJournal(db, path, schemaSettled); err != nil {
		return nil, nil, err
	}
	var st *state
	err = db.View(func(tx *bolt.Tx) error {
		var err error
		if st, err = load(boltReader{tx}, path); err != nil {
			return recordsError(tx, path, err) // every problem, not the first
		}
		return checkIntegrity(st, path) // integrity.go
	})
	if err != nil {
		return nil, nil, err
	}
	if len(st.reservations()) == 0 {
		return st, nil, nil // the usual case
	}
	return dropFileReservations(db, path)
}

// dropFileReservations removes from the file, in one write transaction, the
// reservations an older gpuherd wrote to it (this one keeps them in memory
// only), so that they can never come back, and returns the state without
// them and what it removed, sorted by ID. The revision moves: the claims did.
func dropFileReservations(db *bolt.DB, path string) (*state, []Claim, error) {
	var (
		st      *state
		dropped []Claim
	)
	err := db.Update(func(tx *bolt.Tx) error {
		var err error
		if st, err = load(boltReader{tx}, path); err != nil {
			return err
		}
		dropped = nil
		for _, rec := range st.reservations() {
			if err := tx.Bucket(bucketClaims).Delete([]byte(rec.ID)); err != nil {
				return fmt.Errorf("delete reservation %q: %w", rec.ID, err)
			}
			delete(st.claims, rec.ID)
			dropped = append(dropped, copyClaim(rec.Claim))
		}
		st.rev++
		return tx.Bucket(bucketMeta).Put(keyRevision, encodeRevision(st.rev))
	})
	if err != nil {
		var ce *CorruptError
		if errors.As(err, &ce) {
			return nil, nil, err
		}
		return nil, nil, unusable(path, fmt.Errorf("removing the reservations an older gpuherd left in it: %w", err))
	}
	return st, dropped, nil
}

// DroppedAtOpen returns the reservations that Open removed from a file
// written by an older gpuherd (which wrote reservations to the file), sorted
// by ID; nil for a file this gpuherd wrote, which never holds any. The
// reservations of this gpuherd's previous run are not listed: they were never
// in the file.
func (l *Ledger) DroppedAtOpen() []Claim {
	out := make([]Claim, 0, len(l.dropped))
	for _, c := range l.dropped {
		out = append(out, copyClaim(c))
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// Close stores the journal's records in the file and releases it, for the
// next agent. Every acknowledged write is already on disk (in the journal
// if not in the file), so a Close that cannot store them loses nothing: the
// next Open does. The reservations, which live in memory only, are gone: a
// ledger opened on the file again has none.
func (l *Ledger) Close() error {
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	cerr := l.checkpoint(true)
	jerr := l.journal.close()
	if err := l.db.Close(); err != nil {
		return fmt.Errorf("close ledger %s: %w", l.path, err)
	}
	if cerr != nil {
		return fmt.Errorf("close ledger %s: %w; the journal keeps those writes and the next start applies them", l.path, cerr)
	}
	if jerr != nil {
		return fmt.Errorf("close ledger %s: %w", JournalPath(l.path), jerr)
	}
	return nil
}

// Abandon lets go of the files as a process killed with kill -9 does:
// nothing more is written, and the journal's records stay there for the
// next Open to apply. It is how tests and simulations crash a ledger.
func (l *Ledger) Abandon() error {
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	_ = l.journal.close()
	return l.db.Close()
}

// Path is the ledger file.
func (l *Ledger) Path() string { return l.path }

// MaxGPUs is the most GPUs one claim may hold on this ledger.
func (l *Ledger) MaxGPUs() int { return l.maxGPUs }

// Revision is a counter bumped by every change to claims (reservations
// included), drains or the inventory; it never goes back while the ledger is
// open. The gossip layer re-publishes this server's capacity when it moves.
// Time passing alone (a lease running out) does not move it until Expire
// removes the reservation.
//
// It is informational. Every write of the file stores its current value,
// but changes to reservations or the inventory alone write nothing, so a
// ledger opened again starts from the value of the last file write, which
// may be lower than the last value the previous run reported.
func (l *Ledger) Revision() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.state.rev
}

// errUnchanged rolls back a write transaction that decided to change
// nothing, so that an idempotent retry costs no fsync.
var errUnchanged = errors.New("unchanged")

// errNeedsFile is what a change made in memory (tx == nil) returns when it
// would touch a record of the file: a committed claim or a drain. write
// then runs it again in a file transaction. It never leaves the package.
var errNeedsFile = errors.New("ledger: the change needs a file transaction")

// write runs fn under the write lock and publishes the state it leaves if
// it changed anything. fn changes the state through st's methods and
// returns whether it changed anything, and an error that is returned to
// the caller even when it did: that is how an operation both drops an
// expired reservation and reports ErrLeaseExpired. If nothing changed,
// nothing is published and fn's error is returned.
//
// fn first runs in memory, on a copy of the published state with tx nil:
// a change to reservations or the inventory alone is published from there
// without opening a file transaction, so it costs no fsync. When fn would
// touch a record of the file, st's method fails with errNeedsFile; the copy
// is dropped and fn runs again, from the start, in writeFile. fn must
// therefore depend only on st and its arguments, and set its results anew
// on every run.
func (l *Ledger) write(fn func(tx *fileTx, st *state) (changed bool, err error)) error {
	// A first run on a copy of the published state, without the write
	// lock, tells whether fn needs the file: such a writer queues for the
	// next transaction at once (group commit, writeFile) instead of
	// waiting for the write lock. What it decides counts only when run
	// again below.
	if _, err := fn(nil, l.current().clone()); errors.Is(err, errNeedsFile) {
		return l.writeFile(fn)
	}
	for alone := false; ; alone = true {
		if alone {
			// The change could not be carried over the transaction in
			// flight: wait for it, and keep the next one out meanwhile.
			if testWaitsForFile != nil {
				testWaitsForFile()
			}
			l.fileMu.Lock()
		}
		l.writeMu.Lock()
		retry, err := l.writeMemory(fn)
		l.writeMu.Unlock()
		if alone {
			l.fileMu.Unlock()
		}
		switch {
		case errors.Is(err, errNeedsFile):
			return l.writeFile(fn)
		case !retry:
			return err
		}
	}
}

// writeMemory runs fn on a copy of the published state, tx nil, and
// publishes what it leaves if it changed anything. While a file
// transaction is in flight the change must also hold in the state that
// transaction leaves (carry): when it does not, nothing is published and
// retry is set, for the caller to run fn again once the transaction is
// done. Call with writeMu held.
func (l *Ledger) writeMemory(fn func(tx *fileTx, st *state) (changed bool, err error)) (retry bool, err error) {
	// Only writers replace l.state, and writeMu is held: no lock needed to
	// read it here.
	cur := l.state
	st := cur.clone()
	changed, err := fn(nil, st)
	if errors.Is(err, errNeedsFile) || !changed {
		return false, err
	}
	if l.pending != nil {
		next, ok := carry(cur, st, l.pending)
		if !ok {
			return true, nil
		}
		l.pending = next
	}
	st.rev = cur.rev + 1
	l.publish(st)
	return false, err
}

// carry applies to pending, the state a file transaction in flight leaves,
// the change a writer made in memory from cur (the published state) to
// st, and returns the result; false if the change cannot be carried. It
// can when the transaction left every claim the writer changed as cur has
// it, and no GPU the writer's claims hold is held in pending by any other
// claim, live or not; and when the writer changed only reservations
// (changes made with tx nil can change nothing else but the inventory).
// The change then holds whether the transaction commits or fails, and the
// transaction's own writers, which did not touch those claims nor take
// those GPUs, are answered the same as if it came first. A drain the
// transaction writes does not matter: a drain leaves the claims already
// on its GPU, so a reservation made first is as good.
func carry(cur, st, pending *state) (*state, bool) {
	if !sameMap(cur.inventory, st.inventory) || len(cur.drains) != len(st.drains) {
		return nil, false
	}
	var ids []string
	for id, rec := range st.claims {
		if old, ok := cur.claims[id]; !ok || !reflect.DeepEqual(old, rec) {
			ids = append(ids, id)
		}
	}
	for id := range cur.claims {
		if _, ok := st.claims[id]; !ok {
			ids = append(ids, id)
		}
	}
	for _, id := range ids {
		was, inCur := cur.claims[id]
		p, inPending := pending.claims[id]
		if inCur != inPending || inCur && !reflect.DeepEqual(was, p) {
			return nil, false
		}
	}
	held := map[string]bool{}
	for id, rec := range pending.claims {
		if !slices.Contains(ids, id) {
			for _, g := range rec.GPUs {
				held[g] = true
			}
		}
	}
	next := pending.clone()
	for _, id := range ids {
		rec, ok := st.claims[id]
		if !ok {
			delete(next.claims, id)
			continue
		}
		if rec.State != StateReserved {
			return nil, false
		}
		for _, g := range rec.GPUs {
			if held[g] {
				return nil, false
			}
		}
		next.claims[id] = rec
	}
	return next, true
}

// sameMap reports whether a and b are the same map (not merely equal): the
// inventory is replaced, never modified in place.
func sameMap[K comparable, V any](a, b map[K]V) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// testAfterCommit, when set (tests only), runs after a batch's
// transaction is synced and before any of its writers is answered or its
// state published: where a crash would tear the batch from its answers.
var testAfterCommit func(writes int)

// testInFlight, when set (tests only), runs while a batch's transaction is
// in flight: its writers have run, it is not yet written or synced, and
// the write lock is free. testWaitsForFile runs when a writer is about to
// wait for the file lock (a file write, or a change that could not be
// carried over the transaction in flight).
var testInFlight, testWaitsForFile func()

// fileWrite is one writer's fn waiting for a transaction (writeFile), and
// what became of it once done is closed.
type fileWrite struct {
	fn   func(tx *fileTx, st *state) (changed bool, err error)
	err  error
	done chan struct{}
}

// writeFile runs fn in a read-write transaction over state freshly read
// from the file, plus the published reservations and inventory, which are
// not in it. If fn changed anything, the revision is bumped and stored in
// the same transaction, the transaction commits (fsync) and its state is
// published; fn's error, if any, is returned after the commit. If nothing
// changed, fn's changes to the transaction are rolled back and its error
// returned. If the commit fails, nothing is published: the ledger, its
// reservations included, stays as it was, and the error says the write was
// not acknowledged.
//
// Group commit: writers that arrive while a transaction is being written
// and synced queue up, and the next one to get the write lock runs every
// queued fn, in arrival order, in one transaction and one fsync. Each fn
// sees what the ones before it left; nobody is answered before the
// transaction holding their change is synced, and a failed commit fails
// them all. An fn that changes nothing (a refusal) is taken out and the
// others are run again without it, so that it leaves nothing behind.
func (l *Ledger) writeFile(fn func(tx *fileTx, st *state) (changed bool, err error)) error {
	w := &fileWrite{fn: fn, done: make(chan struct{})}
	l.queueMu.Lock()
	l.queue = append(l.queue, w)
	l.queueMu.Unlock()
	if testWaitsForFile != nil {
		testWaitsForFile()
	}
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	select {
	case <-w.done: // an earlier writer's transaction took it
		return w.err
	default:
	}
	l.queueMu.Lock()
	batch := l.queue
	l.queue = nil
	l.queueMu.Unlock()
	for len(batch) > 0 {
		batch = l.commitBatch(batch)
	}
	l.checkpointIfFull()
	return w.err
}

// commitBatch runs batch in one transaction (see writeFile) and answers
// its writers. When one of them changed nothing, it is answered and the
// rest are returned, to be run again in a transaction of their own.
func (l *Ledger) commitBatch(batch []*fileWrite) (again []*fileWrite) {
	l.writeMu.Lock()
	cur := l.state
	errs := make([]error, len(batch))
	tx, next, refusing, err := l.runBatch(cur, batch, errs)
	switch {
	case errors.Is(err, errUnchanged):
		l.writeMu.Unlock()
		l.released = nil // a dropped fn may have changed it
		w := batch[refusing]
		w.err = errs[refusing]
		close(w.done)
		return append(batch[:refusing:refusing], batch[refusing+1:]...)
	case err != nil:
		l.writeMu.Unlock()
		l.failBatch(batch, err)
		return nil
	}
	// Written and synced without the write lock: writers that change
	// only memory go on meanwhile, carried into pending (writeMemory).
	l.pending = next
	l.writeMu.Unlock()
	if testInFlight != nil {
		testInFlight()
	}
	start := time.Now()
	err = l.appendJournal(tx.ops, true)
	l.writeMu.Lock()
	next, l.pending = l.pending, nil
	if err != nil {
		l.writeMu.Unlock()
		l.failBatch(batch, err)
		return nil
	}
	l.took(OpWrite, start)
	if testAfterCommit != nil {
		testAfterCommit(len(batch))
	}
	l.writeErr.Store(nil)
	// The file's revision was set before the writers in memory that came
	// since; the published one only grows.
	next.rev = max(next.rev, l.state.rev+1)
	l.publish(next)
	l.writeMu.Unlock()
	for i, w := range batch {
		w.err = errs[i]
		l.wroteOK(OpWrite)
		close(w.done)
	}
	return nil
}

// testBatchBase, when set (tests only), is shown the state a batch starts
// from, to compare it with the file's (runBatch).
var testBatchBase func(tx *fileTx, path string, st *state)

// runBatch runs batch's writers over the file's state (bbolt's, with the
// journal's records not yet in it) plus cur's reservations and inventory,
// in order, setting errs. It returns the write, whose operations are the
// journal record to append, and the state it leaves; errUnchanged and
// refusing when a writer changed nothing (nothing is then to be written),
// or another error. Call with writeMu and fileMu held.
func (l *Ledger) runBatch(cur *state, batch []*fileWrite, errs []error) (tx *fileTx, next *state, refusing int, err error) {
	btx, err := l.db.Begin(false)
	if err != nil {
		return nil, nil, -1, err
	}
	defer func() {
		_ = btx.Rollback()
		if tx != nil {
			tx.btx = nil // its values are copies: nothing reads bbolt's pages after this
		}
	}()
	tx = newFileTx(btx, l.unflushed)
	// The published state is the file's (bbolt's plus the journal's
	// records not yet in it) with the reservations and the inventory,
	// which live in memory only: every change to the file's claims and
	// drains goes through a batch (here, or writeUnsynced) and is
	// published once written, memory-only writers change nothing else
	// (errNeedsFile), and a batch that fails publishes nothing and
	// leaves nothing in what later batches read (the journal's overlay
	// takes a record only once it is written). So its copy is what
	// reading the file again would give, without decoding every claim on
	// every write (testBatchBase checks that in the package's tests).
	st := cur.clone()
	if testBatchBase != nil {
		testBatchBase(tx, l.path, st)
	}
	for i, w := range batch {
		changed, err := w.fn(tx, st)
		errs[i] = err
		if !changed {
			return tx, nil, i, errUnchanged
		}
	}
	st.rev = max(st.rev, cur.rev) + 1
	tx.put(bucketMeta, keyRevision, encodeRevision(st.rev))
	return tx, st, -1, nil
}

// appendJournal appends ops to the journal, fdatasynced unless sync is
// false (writeUnsynced), and adds them to what the file lacks. Call with
// fileMu held.
func (l *Ledger) appendJournal(ops []journalOp, sync bool) error {
	if !l.marked {
		// The first record since the file was settled: from now on the
		// file alone is not the ledger, and an older gpuherd must not
		// read it as if it were (SchemaVersion).
		err := l.db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketMeta).Put(keySchema, []byte(strconv.Itoa(schemaJournalled)))
		})
		if err != nil {
			return err
		}
		l.fdatasyncs.Add(2)
		l.marked = true
	}
	if err := l.journal.append(ops, sync); err != nil {
		return err
	}
	if sync {
		l.syncs.Add(1)
		l.fdatasyncs.Add(1)
	}
	l.overlayMu.Lock()
	l.unflushed.apply(ops)
	l.overlayMu.Unlock()
	return nil
}

// journalWrite runs fn over the file's records and appends what it
// changed as one journal record: a durable write outside the claims'
// batches (a remembered release). Reported as op. Call with fileMu held.
func (l *Ledger) journalWrite(op string, fn func(tx *fileTx) error) error {
	btx, err := l.db.Begin(false)
	if err != nil {
		l.wrote(op, err)
		return err
	}
	tx := newFileTx(btx, l.unflushed)
	err = fn(tx)
	_ = btx.Rollback()
	tx.btx = nil
	if err == nil && !tx.changed() {
		return nil
	}
	start := time.Now()
	if err == nil {
		err = l.appendJournal(tx.ops, true)
	}
	if err != nil {
		l.released = nil // rebuilt from the file on next use
		l.wrote(op, err)
		return err
	}
	l.took(op, start)
	l.wroteOK(op)
	l.checkpointIfFull()
	return nil
}

// checkpointIfFull stores the journal in the file once it is three
// quarters full. A checkpoint that fails is reported and tried again
// after every write until one succeeds (the agent logs only the change);
// the journal meanwhile fills its preallocation, then grows. Call with
// fileMu held.
func (l *Ledger) checkpointIfFull() {
	if l.journal.full() {
		_ = l.checkpoint(false)
	}
}

// wroteOK tells the write observer that a write was acknowledged, unless
// the journal could not be stored in the file: the store then stays
// failing, although its writes are acknowledged, until a checkpoint
// succeeds (the journal grows meanwhile, and a full disk fills it too).
// Call with fileMu held.
func (l *Ledger) wroteOK(op string) {
	if l.checkpointErr == nil {
		l.wrote(op, nil)
	}
}

// checkpoint writes every journal record the file lacks into the file, in
// one bbolt transaction that also stores the journal's sequence, and
// starts the journal again from its beginning. With settle (Close), the
// file is also marked as holding every write, until the next record.
// Call with fileMu held.
func (l *Ledger) checkpoint(settle bool) error {
	if l.journal.off == 0 && !(settle && l.marked) {
		return nil // nothing the file lacks
	}
	schema := schemaJournalled
	if settle {
		schema = schemaSettled
	}
	start := time.Now()
	seq := l.journal.seq
	err := l.db.Update(func(tx *bolt.Tx) error {
		for name, m := range l.unflushed {
			b, err := tx.CreateBucketIfNotExists([]byte(name))
			if err != nil {
				return fmt.Errorf("bucket %q: %w", name, err)
			}
			for k, v := range m {
				if v == nil {
					err = b.Delete([]byte(k))
				} else {
					err = b.Put([]byte(k), v)
				}
				if err != nil {
					return fmt.Errorf("bucket %q, key %q: %w", name, k, err)
				}
			}
		}
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put(keyJournal, encodeRevision(seq)); err != nil {
			return err
		}
		return meta.Put(keySchema, []byte(strconv.Itoa(schema)))
	})
	if err != nil {
		err = fmt.Errorf("ledger %s: storing its journal %s in the file: %w; the journal keeps the writes", l.path, l.journal.path, err)
		l.checkpointErr = err
		l.wrote(OpCheckpoint, err)
		return err
	}
	l.fdatasyncs.Add(2)
	l.took(OpCheckpoint, start)
	l.checkpointErr = nil
	l.wrote(OpCheckpoint, nil)
	l.overlayMu.Lock()
	l.unflushed = overlay{}
	l.overlayMu.Unlock()
	l.journal.reset()
	l.marked = !settle
	return nil
}

// view runs fn over the file's records as the last acknowledged write
// left them: bbolt's, with the journal's records it lacks on top.
func (l *Ledger) view(fn func(r recordReader) error) error {
	l.overlayMu.RLock()
	defer l.overlayMu.RUnlock()
	return l.db.View(func(btx *bolt.Tx) error { return fn(newFileTx(btx, l.unflushed)) })
}

// failBatch answers every writer of a batch whose transaction failed:
// nothing of it was published, and the write was not acknowledged.
func (l *Ledger) failBatch(batch []*fileWrite, err error) {
	l.released = nil // fn may have changed it: rebuilt from the file on next use
	err = fmt.Errorf("ledger %s: write not acknowledged: %w", l.path, err)
	l.writeErr.Store(&err)
	for _, w := range batch {
		w.err = err
		l.wrote(OpWrite, err)
		close(w.done)
	}
}

// Syncs counts the durable writes acknowledged since Open: journal
// records (a batch of claims' writes, a remembered release) and facts.
// Changes to reservations alone, writes that changed nothing and
// checkpoints are not among them.
func (l *Ledger) Syncs() uint64 { return l.syncs.Load() }

// Fdatasyncs counts the fdatasyncs the ledger asked of the disk since
// Open: one per journal record, two per bbolt transaction (its data
// pages, then its meta page: checkpoints and facts). What the ledger
// costs the disk, for benchmarks.
func (l *Ledger) Fdatasyncs() uint64 { return l.fdatasyncs.Load() }

// publish makes next the state readers see. Call with writeMu held.
func (l *Ledger) publish(next *state) {
	l.mu.Lock()
	l.state = next
	l.mu.Unlock()
}

// current is the published state.
func (l *Ledger) current() *state {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.state
}
