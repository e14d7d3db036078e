package ledger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	bolt "go.etcd.io/bbolt"
)

// bbolt's file format (version 2), as far as the checks below need it: two
// meta pages at the start; each holds the page size and the high-water mark
// (pages in use) of the file, protected by an FNV-64a checksum.
const (
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	pageHeaderSize = 16 // id, flags, count, overflow
	metaChecksumAt = 56 // bytes of the meta covered by its checksum
	metaSize       = metaChecksumAt + 8
	minPageSize    = 1024
	maxPageSize    = 1 << 16
)

type boltMeta struct {
	pageSize uint32
	pgid     uint64 // high-water mark: pages 0..pgid-1 are in the file
	txid     uint64
}

// readMeta decodes the meta page at off, or says why it is not one.
func readMeta(f *os.File, off int64) (boltMeta, bool) {
	buf := make([]byte, pageHeaderSize+metaSize)
	if _, err := f.ReadAt(buf, off); err != nil {
		return boltMeta{}, false
	}
	m := buf[pageHeaderSize:]
	ne := binary.NativeEndian // bbolt writes its structs in the machine's order
	if ne.Uint32(m[0:]) != boltMagic || ne.Uint32(m[4:]) != boltVersion {
		return boltMeta{}, false
	}
	h := fnv.New64a()
	h.Write(m[:metaChecksumAt])
	if h.Sum64() != ne.Uint64(m[metaChecksumAt:]) {
		return boltMeta{}, false
	}
	return boltMeta{pageSize: ne.Uint32(m[8:]), pgid: ne.Uint64(m[40:]), txid: ne.Uint64(m[48:])}, true
}

// checkFile refuses, before bbolt maps it, a ledger file that bbolt would
// misread or crash on: not a regular file, empty, or shorter than its own
// meta page says. bbolt maps the file and a page past its end is a SIGBUS,
// which no recover() catches: a truncated ledger would kill the agent with a
// fault instead of an error naming the file. It returns fs.ErrNotExist when
// there is no file.
func checkFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	switch {
	case fi.IsDir():
		return &CorruptError{Path: path, Err: errors.New("is a directory, not a ledger file")}
	case !fi.Mode().IsRegular():
		return &CorruptError{Path: path, Err: fmt.Errorf("is not a regular file (%s)", fi.Mode().Type())}
	case fi.Size() == 0:
		// gpuherd creates the file under another name and links it into
		// place once it is complete, so an empty ledger.db is damage (a
		// truncation, a failed copy), never a new ledger.
		return &CorruptError{Path: path, Err: errors.New("the file is empty (0 bytes), but gpuherd never leaves an empty ledger: it was truncated or badly copied")}
	}
	f, err := os.Open(path)
	if err != nil {
		return unusable(path, err)
	}
	defer f.Close()
	var best boltMeta
	found := false
	if m, ok := readMeta(f, 0); ok {
		best, found = m, true
	}
	second := int64(os.Getpagesize()) // what bbolt uses when it creates a file
	if found {
		second = int64(best.pageSize)
	}
	if m, ok := readMeta(f, second); ok && (!found || m.txid > best.txid) {
		best, found = m, true
	}
	if !found {
		return nil // not a bbolt file at all: bbolt says so (ErrInvalid)
	}
	if best.pageSize < minPageSize || best.pageSize > maxPageSize || best.pageSize&(best.pageSize-1) != 0 {
		return &CorruptError{Path: path, Err: fmt.Errorf("meta page gives page size %d", best.pageSize)}
	}
	if want := int64(best.pgid) * int64(best.pageSize); best.pgid < 2 || fi.Size() < want {
		return &CorruptError{Path: path, Err: fmt.Errorf("truncated: %d bytes, but its last transaction (%d) uses %d pages of %d bytes (%d bytes)",
			fi.Size(), best.txid, best.pgid, best.pageSize, want)}
	}
	return nil
}

// unusable explains an operating-system error on the ledger file.
func unusable(path string, err error) error {
	hint := "check that it is a regular file owned by the agent's user with mode 0600, on a mounted, writable file system with free space"
	switch {
	case errors.Is(err, syscall.EROFS):
		hint = "the file system is mounted read-only: remount it read-write, or move data_dir"
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		hint = "the file system is full: free space on it (df -h " + filepath.Dir(path) + ")"
	case errors.Is(err, fs.ErrPermission):
		hint = "the agent may not open it: fix its owner and mode (root, 0600) and of the data directory (0700)"
	case errors.Is(err, syscall.EIO):
		hint = "the disk returned an I/O error: check the kernel log (dmesg); restore the ledger from a backup onto a healthy disk"
	}
	return fmt.Errorf("ledger %s cannot be used: %w; %s. Nothing was changed", path, err, hint)
}

// create makes a new, empty ledger at path: built under a temporary name
// and linked into place only once its buckets are on disk, so that a crash
// part-way leaves no ledger file rather than a half-written one. Linking
// (not renaming) fails if another agent created path meanwhile; that agent's
// file is then opened, and its lock decides.
func create(path string) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".new-*")
	if err != nil {
		return unusable(path, err)
	}
	tmpPath := tmp.Name()
	tmp.Close()
	defer os.Remove(tmpPath)
	if err := os.Chmod(tmpPath, 0o600); err != nil {
		return unusable(path, err)
	}
	if err := os.Remove(tmpPath); err != nil { // bbolt must create it: an empty file is refused above
		return unusable(path, err)
	}
	db, err := bolt.Open(tmpPath, 0o600, &bolt.Options{Timeout: DefaultLockTimeout})
	if err != nil {
		return unusable(path, err)
	}
	if err := db.Update(initBuckets); err != nil {
		db.Close()
		return unusable(path, fmt.Errorf("initialise: %w", err))
	}
	if err := db.Close(); err != nil {
		return unusable(path, err)
	}
	if err := os.Link(tmpPath, path); err != nil && !errors.Is(err, fs.ErrExist) {
		return unusable(path, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// initBuckets writes the schema of an empty ledger.
func initBuckets(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketMeta, bucketClaims, bucketDrains, bucketFacts} {
		if _, err := tx.CreateBucket(name); err != nil {
			return fmt.Errorf("create bucket %q: %w", name, err)
		}
	}
	meta := tx.Bucket(bucketMeta)
	if err := meta.Put(keySchema, []byte(fmt.Sprint(schemaSettled))); err != nil {
		return err
	}
	return meta.Put(keyRevision, encodeRevision(0))
}

// checkPages runs bbolt's own consistency check over every page (the
// ledger is small: this costs a few milliseconds at start).
func checkPages(tx *bolt.Tx, path string) error {
	var first error
	for err := range tx.Check() { // drain it: Check's goroutine sends every error
		if first == nil {
			first = err
		}
	}
	if first != nil {
		return &CorruptError{Path: path, Err: fmt.Errorf("page check: %w", first)}
	}
	return nil
}

// Backup writes a consistent copy of the whole ledger file to w, as of the
// last acknowledged write, and returns its size: the journal's records are
// stored in the file first (a checkpoint that also marks the file as
// holding every write), so the copy is whole by itself and any gpuherd
// reads it.
// Writers wait for the checkpoint only, not for the copy. The copy holds
// the committed claims and drains; reservations, which live in memory
// only, are not in it.
func (l *Ledger) Backup(w io.Writer) (int64, error) {
	l.fileMu.Lock()
	err := l.checkpoint(true)
	var tx *bolt.Tx
	if err == nil {
		tx, err = l.db.Begin(false)
	}
	l.fileMu.Unlock()
	var n int64
	if err == nil {
		n, err = tx.WriteTo(w)
		_ = tx.Rollback()
	}
	if err != nil {
		return n, fmt.Errorf("backup of ledger %s: %w", l.path, err)
	}
	return n, nil
}
