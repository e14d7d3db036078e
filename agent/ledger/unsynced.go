package ledger

import (
	"errors"
	"fmt"
	"time"
)

// Writes whose fdatasync waits. A record appended to the journal without
// an fdatasync is in the kernel's page cache: a killed process leaves it
// there, to be read back at the next Open, and only a crash of the whole
// machine (a power cut) before a later fdatasync can lose it, whole (its
// checksum fails if it was torn, and reading stops there). Some writes
// need no fdatasync of their own (SettleName: a crash that loses it
// leaves what the owner settles again); others need one before they are
// answered, but not before the caller's next step can start
// (ReleaseUnsynced: the release of the claim's name goes out while the
// disk syncs the release).

// Unsynced is a write appended to the journal and published, whose
// record may not be durable yet. The zero value is a write that needed
// no file (a reservation's abort): already as durable as it will be.
type Unsynced struct {
	l   *Ledger
	seq uint64
}

// Durable returns once the write's record is durable: at once when a
// later write's fdatasync or a checkpoint made it so, else after an
// fdatasync of the journal, which also covers every record appended
// before it. A writer that would answer for the write must call it first.
// When the fdatasync fails the journal takes no more writes (restart the
// agent: what the disk holds is then read back), and the error says the
// write was not acknowledged.
func (u Unsynced) Durable() error {
	if u.l == nil {
		return nil
	}
	return u.l.syncThrough(u.seq)
}

// syncThrough makes the journal durable up to its record seq.
func (l *Ledger) syncThrough(seq uint64) error {
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	if l.journal.synced >= seq {
		return nil
	}
	start := time.Now()
	if err := l.journal.sync(); err != nil {
		err = fmt.Errorf("ledger %s: write not acknowledged: %w", l.path, err)
		l.writeErr.Store(&err)
		l.wrote(OpWrite, err)
		return err
	}
	l.syncs.Add(1)
	l.fdatasyncs.Add(1)
	l.took(OpWrite, start)
	return nil
}

// ReleaseUnsynced is ReleaseRemembering, but returns once the release's
// record is written to the journal, before its fdatasync: the claim is
// released and its GPUs free from then on, for every reader and writer of
// this ledger. The caller must call Durable before it says the claim is
// released. Until then a power cut may bring the claim back as it was
// committed, as if the release had never been asked for.
func (l *Ledger) ReleaseUnsynced(id string, now time.Time, keep time.Duration) (Claim, Unsynced, error) {
	var out Claim
	fn := l.releasing(id, now.UTC(), false, max(keep, 0), &out)
	if _, err := fn(nil, l.current().clone()); !errors.Is(err, errNeedsFile) {
		// Nothing of the file to change (a reservation, or nothing):
		// written as any other change, with what it answers.
		if err := l.write(fn); err != nil {
			return Claim{}, Unsynced{}, err
		}
		return copyClaim(out), Unsynced{}, nil
	}
	seq, err := l.writeUnsynced(fn)
	if err != nil {
		return Claim{}, Unsynced{}, err
	}
	return copyClaim(out), Unsynced{l: l, seq: seq}, nil
}

// writeAhead is writeFile for a change that may be published before its
// record is durable (a commit awaiting its name, listed as the reservation
// it was): the record is appended without an fdatasync and the change
// published, and the caller makes it durable (Unsynced.Durable) before it
// answers for it. Where fn changed nothing and answers success, what it
// read may be such a write not yet durable: the Unsynced returned then
// covers the journal up to its last record. A refusal, or a write that
// failed, is answered as it is, made durable first when fn changed
// something all the same (a lapsed reservation dropped).
func (l *Ledger) writeAhead(fn func(tx *fileTx, st *state) (changed bool, err error)) (Unsynced, error) {
	seq, err := l.writeUnsynced(fn)
	switch {
	case seq == 0 && err != nil:
		return Unsynced{}, err
	case seq == 0:
		l.fileMu.Lock()
		seq = l.journal.seq
		l.fileMu.Unlock()
	case err != nil:
		if serr := l.syncThrough(seq); serr != nil {
			return Unsynced{}, serr
		}
		return Unsynced{}, err
	}
	return Unsynced{l: l, seq: seq}, nil
}

// writeUnsynced is writeFile for one writer whose record is not synced
// before it returns: it waits for the transaction in flight, if any, then
// runs fn over the file's state, appends what fn changed to the journal
// without syncing it, and publishes the result. It returns the record's
// sequence (0 when fn changed nothing), for Unsynced. A writer queued
// meanwhile runs in the next transaction as usual, and its fdatasync
// makes this record durable too.
func (l *Ledger) writeUnsynced(fn func(tx *fileTx, st *state) (changed bool, err error)) (uint64, error) {
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	l.writeMu.Lock()
	errs := make([]error, 1)
	tx, next, _, err := l.runBatch(l.state, []*fileWrite{{fn: fn}}, errs)
	if err == nil {
		err = l.appendJournal(tx.ops, false)
	}
	switch {
	case errors.Is(err, errUnchanged):
		l.writeMu.Unlock()
		return 0, errs[0]
	case err != nil:
		l.released = nil
		l.writeMu.Unlock()
		err = fmt.Errorf("ledger %s: write not acknowledged: %w", l.path, err)
		l.writeErr.Store(&err)
		l.wrote(OpWrite, err)
		return 0, err
	}
	seq := l.journal.seq
	l.writeErr.Store(nil)
	next.rev = max(next.rev, l.state.rev+1)
	l.publish(next)
	l.writeMu.Unlock()
	l.wroteOK(OpWrite)
	l.checkpointIfFull()
	return seq, errs[0]
}
