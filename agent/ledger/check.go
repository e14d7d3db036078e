package ledger

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Report is what Inspect found in a ledger file.
type Report struct {
	Path     string           `json:"path"`
	Size     int64            `json:"size_bytes"`
	Schema   int              `json:"schema"`
	Revision uint64           `json:"revision"`
	Claims   []Claim          `json:"claims"` // as the file holds them: an older gpuherd's file may hold reservations, which Open removes
	Drains   map[string]Drain `json:"drains"`
	Facts    int              `json:"facts"` // GPUs with cached NVML facts
	// JournalPending is how many records of the journal beside the file
	// the file did not hold yet (an agent that did not close it: killed,
	// crashed); the report includes them, as the agent's next start
	// would.
	JournalPending int `json:"journal_pending,omitempty"`
	// Problems is every unreadable or contradictory record; Inspect then
	// fails with a *IntegrityError and the other fields may be partial.
	Problems []Problem `json:"problems,omitempty"`
}

// Drain is one drained GPU as the file holds it.
type Drain struct {
	Model  string    `json:"model"`
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

// Inspect opens the ledger file at path read-only, runs bbolt's page check
// and reads every record exactly as Open would, and reports what it holds.
// It never writes to the file, so unlike Open it reports, rather than
// removes, the reservations a file written by an older gpuherd may hold.
// It fails with the same errors as Open (a *IntegrityError listing every
// unreadable or contradictory record, also in Report.Problems; a
// *CorruptError for the file itself; ErrSchemaTooNew), and with ErrLocked
// while an agent holds the file: stop it first, or back the ledger up
// through the agent.
func Inspect(path string, lockTimeout time.Duration) (Report, error) {
	if lockTimeout <= 0 {
		lockTimeout = DefaultLockTimeout
	}
	if err := checkFile(path); err != nil {
		var ce *CorruptError
		if errors.As(err, &ce) {
			return Report{}, err
		}
		if errors.Is(err, fs.ErrNotExist) {
			return Report{}, fmt.Errorf("ledger %s: %w: no ledger in this data directory", path, err)
		}
		return Report{}, unusable(path, err)
	}
	return inspect(path, lockTimeout)
}

func inspect(path string, lockTimeout time.Duration) (rep Report, err error) {
	var db *bolt.DB
	defer func() {
		if r := recover(); r != nil {
			err = &CorruptError{Path: path, Err: fmt.Errorf("bbolt failed reading it: %v", r)}
		}
		if db != nil {
			_ = db.Close()
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: lockTimeout})
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return Report{}, fmt.Errorf("ledger %s is %w (waited %s): a running agent holds it; stop the agent (systemctl stop gpuherd) to check or copy the file",
			path, ErrLocked, lockTimeout)
	case errors.Is(err, bolterrors.ErrInvalid), errors.Is(err, bolterrors.ErrChecksum), errors.Is(err, bolterrors.ErrVersionMismatch):
		return Report{}, &CorruptError{Path: path, Err: err}
	case err != nil:
		return Report{}, unusable(path, err)
	}
	recs, err := pendingJournal(db, path)
	if err != nil {
		return Report{}, err
	}
	if len(recs) > 0 {
		return inspectSettled(db, path, lockTimeout, len(recs))
	}
	rep = Report{Path: path, Drains: map[string]Drain{}}
	err = db.View(func(tx *bolt.Tx) error {
		rep.Size = tx.Size()
		if tx.Bucket(bucketMeta) == nil {
			return &CorruptError{Path: path, Bucket: string(bucketMeta), Err: errors.New("missing: this is not a gpuherd ledger, or one whose creation never finished")}
		}
		if err := checkPages(tx, path); err != nil {
			return err
		}
		st, err := load(boltReader{tx}, path)
		if err != nil {
			return recordsError(tx, path, err)
		}
		if err := checkIntegrity(st, path); err != nil {
			return err
		}
		fmt.Sscan(string(tx.Bucket(bucketMeta).Get(keySchema)), &rep.Schema)
		rep.Revision = st.rev
		for _, rec := range st.claims {
			rep.Claims = append(rep.Claims, copyClaim(rec.Claim))
		}
		slices.SortFunc(rep.Claims, func(a, b Claim) int { return strings.Compare(a.ID, b.ID) })
		for addr, d := range st.drains {
			rep.Drains[addr] = Drain(d)
		}
		rep.Facts = tx.Bucket(bucketFacts).Stats().KeyN
		return nil
	})
	var ie *IntegrityError
	if errors.As(err, &ie) {
		rep.Problems = ie.Problems
		rep.Claims = nil
		return rep, err
	}
	if err != nil {
		return Report{}, err
	}
	return rep, nil
}

// inspectSettled inspects a copy of the ledger of db, at path, with the
// pending records of its journal applied, and reports it under path.
func inspectSettled(db *bolt.DB, path string, lockTimeout time.Duration, pending int) (Report, error) {
	tmp, err := settledCopy(db, path, os.TempDir())
	if err != nil {
		return Report{}, err
	}
	defer os.Remove(tmp)
	rep, err := inspect(tmp, lockTimeout)
	rep.Path, rep.JournalPending = path, pending
	var (
		ie *IntegrityError
		ce *CorruptError
	)
	switch {
	case errors.As(err, &ie):
		ie.Path = path
	case errors.As(err, &ce):
		ce.Path = path
	}
	return rep, err
}

// BackupFile copies the ledger at src, which no agent may hold, to dst: it
// checks src as Inspect does, writes a consistent copy to a temporary file
// beside dst with the writes of src's journal that src lacks applied (so
// that dst is whole by itself), fsyncs it, checks the copy, and renames it
// into place. dst is never left half-written; src is not written.
func BackupFile(src, dst string, lockTimeout time.Duration) (Report, error) {
	if _, err := Inspect(src, lockTimeout); err != nil {
		return Report{}, err
	}
	db, err := bolt.Open(src, 0o600, &bolt.Options{ReadOnly: true, Timeout: lockTimeout})
	if err != nil {
		return Report{}, fmt.Errorf("ledger %s: %w", src, err)
	}
	defer db.Close()
	tmpPath, err := settledCopy(db, src, filepath.Dir(dst))
	if err != nil {
		return Report{}, fmt.Errorf("backup to %s: %w", dst, err)
	}
	defer os.Remove(tmpPath)
	tmp, err := os.Open(tmpPath)
	if err == nil {
		err = tmp.Sync()
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return Report{}, fmt.Errorf("backup to %s: %w", dst, err)
	}
	rep, err := Inspect(tmpPath, lockTimeout)
	if err != nil {
		return Report{}, fmt.Errorf("backup to %s: the copy does not read back: %w", dst, err)
	}
	if err := os.Rename(tmpPath, dst); err != nil {
		return Report{}, fmt.Errorf("backup to %s: %w", dst, err)
	}
	if err := syncDir(filepath.Dir(dst)); err != nil {
		return Report{}, err
	}
	rep.Path = dst
	return rep, nil
}
