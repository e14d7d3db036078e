package ledger

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	bolt "go.etcd.io/bbolt"
)

// The journal is where the claims' writes go first. A bbolt transaction
// costs two fdatasyncs (its data pages, then its meta page); an append to
// the journal costs one, of the bytes appended. So every write of claims,
// drains and released claims is one journal record, appended and
// fdatasynced before its writers are answered; the bbolt file takes the
// journal's records in one transaction now and then (a checkpoint: when
// the journal fills, at Close, before a backup), and the journal then
// starts again from its beginning.
//
// The file, ledger.db's path plus ".journal", is preallocated with zeros
// and reused from its start after every checkpoint, so an append
// overwrites blocks the file already has and its fdatasync writes no
// metadata. It holds records:
//
//	length  uint32, little endian: of the payload
//	crc     uint32, little endian: CRC-32C of the payload
//	payload JSON: journalRecord
//
// Records are numbered: the first after a checkpoint is the bbolt file's
// journal sequence (meta key "journal") plus one, and each next one is
// the one before plus one. Reading stops at the first record that is cut
// short, fails its checksum, or does not follow the one before: that is
// where the last append ended (the zeros of the preallocation, a record a
// crash cut before its fdatasync returned, or a record left from before
// the last checkpoint, numbered lower). A damaged record with a whole,
// following record behind it is not an end but damage, and is refused.
//
// Records at or below the file's sequence are already in the file (a
// crash between a checkpoint's commit and the next append leaves them);
// the ones above it are applied when the ledger is opened, before anything
// reads it.
const journalSuffix = ".journal"

// journalSize is the journal's preallocated size; a checkpoint runs once
// three quarters of it hold records (a few hundred claims).
const journalSize = 256 << 10

const journalHeader = 8

// maxJournalSize is the largest journal read: the ledger's grows past its
// preallocation only while checkpoints fail, by a record at a time.
const maxJournalSize = 256 << 20

var journalCRC = crc32.MakeTable(crc32.Castagnoli)

// keyJournal in the meta bucket is the sequence of the last journal
// record the file holds (uint64 big-endian; absent: 0).
var keyJournal = []byte("journal")

// journalRecord is one write: bucket operations in order.
type journalRecord struct {
	Seq uint64      `json:"seq"`
	Ops []journalOp `json:"ops"`
}

// journalOp puts Value under Key in Bucket, or deletes Key when Delete.
type journalOp struct {
	Bucket string `json:"b"`
	Key    string `json:"k"`
	Value  []byte `json:"v,omitempty"`
	Delete bool   `json:"d,omitempty"`
}

// JournalPath is the journal of the ledger file at path: its writes that
// the file may not hold yet. It goes wherever the file goes (a backup
// made by `gpuherd ledger backup` has them applied and needs none).
func JournalPath(path string) string { return path + journalSuffix }

// journal is the open journal file; its writer holds the ledger's fileMu.
type journal struct {
	path string
	f    *os.File
	size int64  // the file's size: preallocated, grown only by a record that does not fit
	pre  int64  // the preallocated size
	off  int64  // where the next record goes
	seq  uint64 // the last record's sequence (the file's, right after a checkpoint)
	// synced is the last record known durable: fdatasynced, stored in
	// the file by a checkpoint, or read back at Open. Records after it
	// were written without an fdatasync (writeUnsynced) and wait for the
	// next one (sync, or a synced append).
	synced uint64
	// datasync makes the file's written bytes durable (datasync.File;
	// WithDatasync).
	datasync func(*os.File) error
	// broken is set when an append failed and its bytes could not be
	// wiped: the journal's end is then unknown, and it takes no more.
	broken error
}

// encodeJournalRecord frames rec.
func encodeJournalRecord(rec journalRecord) ([]byte, error) {
	payload, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, journalHeader, journalHeader+len(payload))
	binary.LittleEndian.PutUint32(buf[0:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(buf[4:], crc32.Checksum(payload, journalCRC))
	return append(buf, payload...), nil
}

// frameAt reads the record framed at off of data: its payload, and the
// offset after it; ok false when no whole record with a good checksum is
// there.
func frameAt(data []byte, off int64) (payload []byte, next int64, ok bool) {
	if off+journalHeader > int64(len(data)) {
		return nil, off, false
	}
	n := int64(binary.LittleEndian.Uint32(data[off:]))
	sum := binary.LittleEndian.Uint32(data[off+4:])
	if n == 0 || off+journalHeader+n > int64(len(data)) {
		return nil, off, false
	}
	payload = data[off+journalHeader : off+journalHeader+n]
	if crc32.Checksum(payload, journalCRC) != sum {
		return nil, off, false
	}
	return payload, off + journalHeader + n, true
}

// readJournal reads the records of the journal at jpath that follow
// sequence base, in order, and the offset where its last record ends. A
// missing journal has none. It fails with a *CorruptError naming the
// journal when a record is damaged but not at the end, or does not
// decode.
func readJournal(jpath string, base uint64) (recs []journalRecord, end int64, err error) {
	fi, err := os.Stat(jpath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, 0, nil
	case err != nil:
		return nil, 0, err
	case !fi.Mode().IsRegular():
		return nil, 0, &CorruptError{Path: jpath, Err: fmt.Errorf("is not a regular file (%s)", fi.Mode().Type())}
	case fi.Size() > maxJournalSize:
		// Read whole, it could take the agent's memory.
		return nil, 0, &CorruptError{Path: jpath, Err: fmt.Errorf("is %d bytes, far more than the ledger ever writes to it (%d preallocated, grown only while checkpoints fail): not a journal this ledger wrote", fi.Size(), journalSize)}
	}
	data, err := os.ReadFile(jpath)
	if err != nil {
		return nil, 0, err
	}
	var (
		off  int64
		prev uint64
	)
	for i := 0; ; i++ {
		payload, next, ok := frameAt(data, off)
		if !ok {
			if err := damagedBefore(data, off, prev); err != nil {
				return nil, 0, &CorruptError{Path: jpath, Err: err}
			}
			break
		}
		var rec journalRecord
		if err := json.Unmarshal(payload, &rec); err != nil {
			return nil, 0, &CorruptError{Path: jpath, Err: fmt.Errorf("record at byte %d: %w", off, err)}
		}
		if err := checkOps(rec.Ops); err != nil {
			return nil, 0, &CorruptError{Path: jpath, Err: fmt.Errorf("record %d at byte %d: %w", rec.Seq, off, err)}
		}
		if i > 0 && rec.Seq != prev+1 {
			break // a record from before the last checkpoint
		}
		if rec.Seq > base {
			if len(recs) == 0 && rec.Seq != base+1 {
				return nil, 0, &CorruptError{Path: jpath, Err: fmt.Errorf("record at byte %d is number %d, but the ledger file holds the journal up to %d: records %d to %d are missing",
					off, rec.Seq, base, base+1, rec.Seq-1)}
			}
			recs = append(recs, rec)
		}
		prev, off = rec.Seq, next
	}
	return recs, off, nil
}

// damagedBefore tells a journal's end at off from a damaged record: if a
// record that follows the one before (prev) lies right behind what off's
// header says, the record at off was appended and acknowledged, and then
// damaged.
func damagedBefore(data []byte, off int64, prev uint64) error {
	if off+journalHeader > int64(len(data)) {
		return nil
	}
	n := int64(binary.LittleEndian.Uint32(data[off:]))
	if n == 0 {
		return nil
	}
	payload, _, ok := frameAt(data, off+journalHeader+n)
	if !ok {
		return nil
	}
	var rec journalRecord
	if json.Unmarshal(payload, &rec) != nil || rec.Seq != prev+2 {
		return nil
	}
	return fmt.Errorf("record at byte %d fails its checksum, but record %d follows it: the file was damaged after it was written; restore the ledger directory from a backup", off, rec.Seq)
}

// openJournal opens the journal at jpath for appending after off, the end
// of its last record, creating and preallocating it if needed.
func openJournal(jpath string, off int64, seq uint64, pre int64, sync func(*os.File) error) (*journal, error) {
	f, err := os.OpenFile(jpath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	j := &journal{path: jpath, f: f, size: fi.Size(), pre: pre, off: off, seq: seq, synced: seq, datasync: sync}
	j.preallocate()
	return j, nil
}

// preallocate grows the file to its preallocated size with zeros, synced.
// A full disk is no reason to stop: the appends then grow the file
// themselves (and fail, reported, while the disk stays full), and the
// next checkpoint tries again.
func (j *journal) preallocate() {
	if j.size < j.pre {
		_ = j.grow(j.pre)
	}
}

// grow extends the file with zeros to size and syncs it; on failure it
// cuts off what it added.
func (j *journal) grow(size int64) error {
	zeros := make([]byte, size-j.size)
	_, err := j.f.WriteAt(zeros, j.size)
	if err == nil {
		err = j.f.Sync()
	}
	if err != nil {
		_ = j.f.Truncate(j.size)
		return err
	}
	j.size = size
	return nil
}

// append writes ops as the next record and, with sync, fdatasyncs it.
// When it fails, the record is not acknowledged: its bytes are wiped (the
// next append takes its place), and if even that fails the journal takes
// no more. A record written without sync is durable once a later one is
// synced (the fdatasync covers every byte written before it), and a crash
// before that keeps it or loses it whole: its checksum fails if it was
// torn, and reading stops there.
func (j *journal) append(ops []journalOp, sync bool) error {
	if j.broken != nil {
		return fmt.Errorf("journal %s is unusable since an earlier write failed (%v): restart the agent", j.path, j.broken)
	}
	buf, err := encodeJournalRecord(journalRecord{Seq: j.seq + 1, Ops: ops})
	if err != nil {
		return err
	}
	if _, err = j.f.WriteAt(buf, j.off); err == nil {
		if testJournalSync != nil {
			err = testJournalSync()
		}
		if err == nil && sync {
			err = j.datasync(j.f)
		}
	}
	if err != nil {
		j.wipe(len(buf))
		return fmt.Errorf("journal %s: %w", j.path, err)
	}
	j.off += int64(len(buf))
	j.size = max(j.size, j.off)
	j.seq++
	if sync {
		j.synced = j.seq
	}
	return nil
}

// sync makes every record appended so far durable with one fdatasync.
// When it fails, the records written since the last durable one may be
// lost or kept, and nothing says which: the journal takes no more, and
// the agent must be restarted to read back what the disk has.
func (j *journal) sync() error {
	if j.broken != nil {
		return fmt.Errorf("journal %s is unusable since an earlier write failed (%v): restart the agent", j.path, j.broken)
	}
	if err := j.datasync(j.f); err != nil {
		j.broken = err
		return fmt.Errorf("journal %s: %w", j.path, err)
	}
	j.synced = j.seq
	return nil
}

// wipe zeroes the n bytes at the journal's end after a failed append, so
// that a record that was not acknowledged is never read back: what it
// added past the file's size is cut off (which needs no space on a full
// disk), and the rest is overwritten with zeros.
func (j *journal) wipe(n int) {
	err := j.f.Truncate(j.size)
	if err == nil && j.off < j.size {
		_, err = j.f.WriteAt(make([]byte, min(int64(n), j.size-j.off)), j.off)
	}
	if err == nil {
		err = j.datasync(j.f)
	}
	if err != nil {
		j.broken = err
	}
}

// full says the journal should be checkpointed.
func (j *journal) full() bool { return j.off >= j.pre*3/4 }

// reset starts the journal again from its beginning, after a checkpoint
// stored every record up to j.seq in the file. Nothing is written: the
// records left are numbered at or below the file's sequence.
func (j *journal) reset() {
	j.off = 0
	j.synced = j.seq
	j.preallocate()
}

func (j *journal) close() error { return j.f.Close() }

// testJournalSync, when set (tests only), runs after each append's write
// and before its fdatasync; an error fails the append as a failed
// fdatasync would, after the record's bytes were written.
var testJournalSync func() error

// overlay is bucket operations not yet in the bbolt file: bucket -> key
// -> value, a nil value being a deletion.
type overlay map[string]map[string][]byte

// apply applies ops to o, in order.
func (o overlay) apply(ops []journalOp) {
	for _, op := range ops {
		m := o[op.Bucket]
		if m == nil {
			m = map[string][]byte{}
			o[op.Bucket] = m
		}
		if op.Delete {
			m[op.Key] = nil
		} else {
			m[op.Key] = op.Value
		}
	}
}

// get looks key up in o: found false when o says nothing of it; a nil
// value when o deletes it.
func (o overlay) get(bucket, key []byte) (v []byte, found bool) {
	v, found = o[string(bucket)][string(key)]
	return v, found
}

// checkOps refuses an operation the ledger never writes: a bucket other
// than its records' (claims, drains, released, facts), or a meta key
// other than the revision; an empty key; a put without a value. Applied,
// such an operation could make the file unreadable, or write where
// nothing reads.
func checkOps(ops []journalOp) error {
	for i, op := range ops {
		switch {
		case op.Key == "":
			return fmt.Errorf("operation %d on bucket %q has no key", i, op.Bucket)
		case op.Bucket == string(bucketMeta):
			if op.Key != string(keyRevision) || op.Delete || len(op.Value) != 8 {
				return fmt.Errorf("operation %d writes meta key %q, which only the revision's 8 bytes may be", i, op.Key)
			}
		case op.Bucket != string(bucketClaims) && op.Bucket != string(bucketDrains) &&
			op.Bucket != string(bucketReleased) && op.Bucket != string(bucketFacts):
			return fmt.Errorf("operation %d names bucket %q, which the ledger never writes", i, op.Bucket)
		case !op.Delete && len(op.Value) == 0:
			return fmt.Errorf("operation %d puts no value under %s/%s", i, op.Bucket, op.Key)
		}
	}
	return nil
}

// applyOps writes ops into the open write transaction tx.
func applyOps(tx *bolt.Tx, ops []journalOp) error {
	for _, op := range ops {
		b, err := tx.CreateBucketIfNotExists([]byte(op.Bucket))
		if err != nil {
			return fmt.Errorf("bucket %q: %w", op.Bucket, err)
		}
		if op.Delete {
			err = b.Delete([]byte(op.Key))
		} else {
			err = b.Put([]byte(op.Key), op.Value)
		}
		if err != nil {
			return fmt.Errorf("bucket %q, key %q: %w", op.Bucket, op.Key, err)
		}
	}
	return nil
}

// journalApplyTo writes recs into the open write transaction tx, and the
// sequence of the last one.
func journalApplyTo(tx *bolt.Tx, recs []journalRecord) error {
	for _, rec := range recs {
		if err := applyOps(tx, rec.Ops); err != nil {
			return fmt.Errorf("journal record %d: %w", rec.Seq, err)
		}
	}
	if len(recs) == 0 {
		return nil
	}
	return tx.Bucket(bucketMeta).Put(keyJournal, encodeRevision(recs[len(recs)-1].Seq))
}

// journalSeq reads the file's journal sequence.
func journalSeq(tx *bolt.Tx) (uint64, error) {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		return 0, nil
	}
	raw := meta.Get(keyJournal)
	switch len(raw) {
	case 0:
		return 0, nil
	case 8:
		return binary.BigEndian.Uint64(raw), nil
	}
	return 0, fmt.Errorf("meta key %q: want 8 bytes, have %d", keyJournal, len(raw))
}

// settleJournal applies to the bbolt file of db, at path, the records of
// its journal that the file does not hold yet, and marks the file's
// schema as mark: in one transaction, and only when either changes. A file
// whose schema this gpuherd cannot read is left alone (load says why).
func settleJournal(db *bolt.DB, path string, mark int) (applied int, err error) {
	return settleJournalFrom(db, path, JournalPath(path), mark)
}

// settleJournalFrom is settleJournal with the journal at jpath: the
// operator's tools apply a ledger's journal to a copy of its file.
func settleJournalFrom(db *bolt.DB, path, jpath string, mark int) (applied int, err error) {
	var (
		base   uint64
		schema int
	)
	err = db.View(func(tx *bolt.Tx) error {
		var err error
		if base, err = journalSeq(tx); err != nil {
			return &CorruptError{Path: path, Bucket: string(bucketMeta), Key: string(keyJournal), Err: err}
		}
		schema, _ = strconv.Atoi(string(tx.Bucket(bucketMeta).Get(keySchema)))
		return nil
	})
	if err != nil || schema < 1 || schema > SchemaVersion {
		return 0, err
	}
	recs, _, err := readJournal(jpath, base)
	var ce *CorruptError
	switch {
	case errors.As(err, &ce):
		return 0, err
	case err != nil:
		return 0, unusable(jpath, err)
	case len(recs) == 0 && schema == mark:
		return 0, nil
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if err := journalApplyTo(tx, recs); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keySchema, []byte(strconv.Itoa(mark)))
	})
	if err != nil {
		return 0, unusable(path, fmt.Errorf("applying the %d records of its journal %s: %w", len(recs), jpath, err))
	}
	return len(recs), nil
}

// pendingJournal returns the records of the journal of the ledger at
// path that its file, open in db, does not hold.
func pendingJournal(db *bolt.DB, path string) ([]journalRecord, error) {
	var base uint64
	err := db.View(func(tx *bolt.Tx) error {
		var err error
		if base, err = journalSeq(tx); err != nil {
			return &CorruptError{Path: path, Bucket: string(bucketMeta), Key: string(keyJournal), Err: err}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	jpath := JournalPath(path)
	recs, _, err := readJournal(jpath, base)
	var ce *CorruptError
	if err != nil && !errors.As(err, &ce) {
		return nil, unusable(jpath, err)
	}
	return recs, err
}

// settledCopy writes to a new file in dir the ledger of db, at path, with
// the records of its journal that it lacks applied, and returns the new
// file's path; the caller removes it. The ledger itself is not written.
func settledCopy(db *bolt.DB, path, dir string) (string, error) {
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".settled-*")
	if err != nil {
		return "", fmt.Errorf("copy of ledger %s: %w", path, err)
	}
	err = db.View(func(tx *bolt.Tx) error { _, err := tx.WriteTo(tmp); return err })
	if err == nil {
		err = tmp.Chmod(0o600)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		var cdb *bolt.DB
		if cdb, err = bolt.Open(tmp.Name(), 0o600, &bolt.Options{Timeout: DefaultLockTimeout}); err == nil {
			_, err = settleJournalFrom(cdb, tmp.Name(), JournalPath(path), schemaSettled)
			if cerr := cdb.Close(); err == nil {
				err = cerr
			}
		}
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("copy of ledger %s with its journal applied: %w", path, err)
	}
	return tmp.Name(), nil
}
