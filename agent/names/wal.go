package names

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuherd/gpuherd/internal/datasync"
)

// wal is the registry's raft log: append-only segment files in one
// directory, every append written with one write and made durable with one
// fdatasync before it returns. A bbolt transaction costs two fsyncs (its
// data pages, then its meta page) and rewrites pages; an append costs one,
// of the bytes appended. The log is short (raft keeps TrailingLogs entries
// after each snapshot, a few thousand small commands), so every entry is
// also kept in memory: reads, which raft's replication does for every
// entry it sends, never touch the disk.
//
// A segment is named after the index of its first entry (20 digits, so
// names sort as numbers) and holds records:
//
//	length  uint32, little endian: of index and entry
//	crc     uint32, little endian: CRC-32C of index and entry
//	index   uint64, little endian
//	entry   encodeLog's bytes
//
// A record cut short or failing its checksum at the end of the last
// segment is an append that a crash interrupted before its fdatasync
// returned, so raft was never told it was stored: it is cut off when the
// log is opened. Anywhere else it is damage, and opening refuses it.
//
// The last segment's file is written with zeros ahead of its records
// (walPrealloc at a time, made durable before the records that use it), so
// that an append overwrites blocks the file already has: its fdatasync then
// writes no metadata, where an append that grows the file makes the file
// system commit its journal, which every such fdatasync on the disk waits
// for in turn. Zeros end the records as a torn append does, and are cut
// off the same way when the log is opened; a segment is cut back to its
// records before the next one starts, so only the last holds zeros.
//
// The leader's appends are written ahead (appendAhead): written, readable
// at once, and made durable by a goroutine of their own, so that raft
// sends them to the followers while the leader's fdatasync runs, as etcd's
// leader does, instead of after it. Raft counts the leader's own copy from
// the write on, so an entry may commit on a follower's durable copy and the
// leader's written one; the registry's state machine applies nothing
// before the leader's copy is durable too (waitDurable), and the followers
// hear a commit index no higher than that (durableCommits), so whatever
// is applied or answered rests on a majority's durable copies, as before.
// The followers' appends stay synchronous: a follower tells the leader an
// entry is stored only once it is durable.
type wal struct {
	dir      string
	segSize  int64 // walSegmentSize; smaller in tests
	prealloc int64 // walPrealloc; smaller in tests

	wmu sync.Mutex // one writer at a time: appends, deletions, rotation
	mu  sync.RWMutex
	// first is the index of entries[0]; entries holds first..last.
	first   uint64
	entries []walEntry
	// segs are the segment files in order; the last one takes appends.
	segs []*walSegment
	// syncs counts fdatasyncs and directory syncs.
	syncs func()
	// sync makes appended records durable (datasync.File); tests make it
	// fail or wait. Set with wmu held.
	sync func(*os.File) error
	// aheadSynced, when set (with wmu held), is told of each fdatasync
	// of entries written ahead: when it started, and how it ended.
	aheadSynced func(start time.Time, err error)
	// testBeforeAheadSync, when set (tests only, with wmu held), runs in
	// syncAhead between reading the segment to sync and syncing it, with
	// neither wmu nor syncMu held: where a deletion may close it.
	testBeforeAheadSync func()

	// What the entries written ahead still lack (appendAhead). smu
	// guards these; durableNow signals when durable, syncErr or closed
	// change. Lock order: wmu, then smu.
	smu        sync.Mutex
	durableNow *sync.Cond
	// durable: every entry up to this index is on disk.
	durable uint64
	// gen counts the cuts from the back and the removals of every
	// segment: a sync that started before one covers nothing after it.
	gen uint64
	// syncing: a goroutine runs syncAhead.
	syncing bool
	// syncErr is a failed fdatasync of entries written ahead: whether
	// the disk kept them is unknown, so the log takes no more appends
	// and the entries are never reported durable.
	syncErr error
	closed  bool
	bg      sync.WaitGroup
	// syncMu is held through syncAhead's fdatasync, and by a deletion
	// before it closes or cuts a file: never while waiting for wmu.
	syncMu sync.Mutex
}

type walEntry struct {
	seg  *walSegment
	off  int64 // where its record starts in seg
	data []byte
}

type walSegment struct {
	first uint64
	path  string
	f     *os.File
	size  int64 // bytes of records
	alloc int64 // bytes of the file: zeros from size on
}

// walSegmentSize is where a segment stops taking appends and the next one
// starts: about 50,000 registry commands.
const walSegmentSize = 16 << 20

// walPrealloc is how far past its records the last segment's file is
// written with zeros at a time: one extra fdatasync every few thousand
// registry commands.
const walPrealloc = 1 << 20

// walHeader is the length, checksum and index in front of each entry.
const walHeader = 16

var walCRC = crc32.MakeTable(crc32.Castagnoli)

func segmentName(first uint64) string { return fmt.Sprintf("%020d.seg", first) }

// openWAL opens the log in dir, creating dir when it is missing, and reads
// every segment back. Entries below keepFrom (what a compaction deleted
// from the front of a segment still on disk) are dropped.
func openWAL(dir string, keepFrom uint64, synced func()) (*wal, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("name registry log %s: %w", dir, err)
	}
	w := &wal{dir: dir, segSize: walSegmentSize, prealloc: walPrealloc, syncs: synced, sync: datasync.File}
	w.durableNow = sync.NewCond(&w.smu)
	names, err := segmentFiles(dir)
	if err != nil {
		return nil, err
	}
	for i, name := range names {
		last := i == len(names)-1
		if err := w.readSegment(name, last); err != nil {
			w.close()
			return nil, err
		}
	}
	if keepFrom > w.first && len(w.entries) > 0 {
		w.dropFront(min(keepFrom, w.first+uint64(len(w.entries))) - 1)
	}
	// Entries written ahead before a kill are in the file system's
	// cache, not necessarily on the disk: make them durable before
	// anything is applied or answered from them.
	if seg := w.tail(); seg != nil {
		if err := w.sync(seg.f); err != nil {
			w.close()
			return nil, fmt.Errorf("name registry log %s: sync: %w", seg.path, err)
		}
		w.syncs()
	}
	_, w.durable = w.bounds()
	return w, nil
}

// segmentFiles lists dir's segments in index order; any other file is
// left alone.
func segmentFiles(dir string) ([]string, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("name registry log %s: %w", dir, err)
	}
	var out []string
	for _, de := range des {
		n := de.Name()
		if de.Type().IsRegular() && strings.HasSuffix(n, ".seg") && len(n) == 24 {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// readSegment reads one segment into memory. In the last segment, a torn
// record ends the log and is cut off; anywhere else it is an error.
func (w *wal) readSegment(name string, last bool) error {
	path := filepath.Join(w.dir, name)
	first, err := strconv.ParseUint(strings.TrimSuffix(name, ".seg"), 10, 64)
	if err != nil {
		return fmt.Errorf("name registry log: segment %s: not named after an index", path)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("name registry log: %w", err)
	}
	seg := &walSegment{first: first, path: path, f: f}
	w.segs = append(w.segs, seg)
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("name registry log: reading %s: %w", path, err)
	}
	off := int64(0)
	want := first
	if len(w.entries) > 0 {
		if next := w.first + uint64(len(w.entries)); next != first {
			return fmt.Errorf("name registry log: segment %s starts at entry %d, but the log before it ends at %d", path, first, next-1)
		}
	} else {
		w.first = first
	}
	for off < int64(len(data)) {
		idx, entry, n, why := parseRecord(data[off:])
		if why == "" && idx != want {
			why = fmt.Sprintf("holds entry %d where %d belongs", idx, want)
		}
		if why != "" {
			if !last {
				return fmt.Errorf("name registry log: segment %s is damaged at byte %d: %s; the log cannot be read past it (restore the registry from a voter that has it: remove this agent's names directory, and it joins again)", path, off, why)
			}
			// The tail of an append a crash interrupted, never
			// acknowledged to raft, or the zeros written ahead of the
			// records: cut off, so that no byte of a torn record is
			// left behind the next append.
			if err := f.Truncate(off); err != nil {
				return fmt.Errorf("name registry log: cutting the interrupted append off %s: %w", path, err)
			}
			if err := f.Sync(); err != nil {
				return fmt.Errorf("name registry log: %s: %w", path, err)
			}
			break
		}
		w.entries = append(w.entries, walEntry{seg: seg, off: off, data: entry})
		off += n
		want++
	}
	seg.size, seg.alloc = off, off
	if off == 0 && last {
		// Created, and the process ended before the append it was made
		// for: named after an index the log may not hold next.
		w.segs = w.segs[:len(w.segs)-1]
		f.Close()
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("name registry log: %w", err)
		}
		return nil
	}
	return nil
}

// parseRecord reads one record from b: the entry's index, its bytes, the
// record's length, or why b does not start with a whole, intact record.
func parseRecord(b []byte) (index uint64, entry []byte, n int64, why string) {
	if len(b) < walHeader {
		return 0, nil, 0, "record header cut short"
	}
	length := binary.LittleEndian.Uint32(b[0:4])
	sum := binary.LittleEndian.Uint32(b[4:8])
	if length < 8 || int64(length) > int64(len(b)-8) {
		return 0, nil, 0, fmt.Sprintf("record length %d does not fit", length)
	}
	body := b[8 : 8+int(length)]
	if crc32.Checksum(body, walCRC) != sum {
		return 0, nil, 0, "checksum mismatch"
	}
	return binary.LittleEndian.Uint64(body[:8]), slices.Clone(body[8:]), 8 + int64(length), ""
}

func appendRecord(b []byte, index uint64, entry []byte) []byte {
	start := len(b)
	b = binary.LittleEndian.AppendUint32(b, uint32(8+len(entry)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, index)
	b = append(b, entry...)
	binary.LittleEndian.PutUint32(b[start+4:], crc32.Checksum(b[start+8:], walCRC))
	return b
}

func (w *wal) close() error {
	// Entries written ahead are made durable first.
	w.smu.Lock()
	w.closed = true
	w.durableNow.Broadcast()
	w.smu.Unlock()
	w.bg.Wait()
	var errs []error
	for _, s := range w.segs {
		errs = append(errs, s.f.Close())
	}
	w.segs = nil
	return errors.Join(errs...)
}

// bounds are the first and last index held, 0 and 0 when empty.
func (w *wal) bounds() (first, last uint64) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if len(w.entries) == 0 {
		return 0, 0
	}
	return w.first, w.first + uint64(len(w.entries)) - 1
}

func (w *wal) get(index uint64, l *raft.Log) error {
	w.mu.RLock()
	if len(w.entries) == 0 || index < w.first || index >= w.first+uint64(len(w.entries)) {
		w.mu.RUnlock()
		return raft.ErrLogNotFound
	}
	data := w.entries[index-w.first].data
	w.mu.RUnlock()
	if err := decodeLog(data, l); err != nil {
		return fmt.Errorf("name registry log %s: entry %d: %w", w.dir, index, err)
	}
	l.Index = index
	return nil
}

// append writes logs, which must follow the last entry held (or start
// anywhere when the log is empty), in one write and one fdatasync.
func (w *wal) append(logs []*raft.Log) error { return w.write(logs, false) }

// appendAhead writes logs as append does and returns before they are
// durable: a goroutine makes them so, and waitDurable waits for it.
func (w *wal) appendAhead(logs []*raft.Log) error { return w.write(logs, true) }

func (w *wal) write(logs []*raft.Log, ahead bool) error {
	if len(logs) == 0 {
		return nil
	}
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if err := w.failed(); err != nil {
		return err
	}
	_, last := w.bounds()
	if last != 0 && logs[0].Index != last+1 {
		return fmt.Errorf("name registry log %s: append of entry %d after entry %d", w.dir, logs[0].Index, last)
	}
	var buf []byte
	entries := make([]walEntry, 0, len(logs))
	offs := make([]int64, 0, len(logs))
	for i, l := range logs {
		if i > 0 && l.Index != logs[i-1].Index+1 {
			return fmt.Errorf("name registry log %s: entries %d and %d appended together are not consecutive", w.dir, logs[i-1].Index, l.Index)
		}
		enc := encodeLog(l)
		offs = append(offs, int64(len(buf)))
		buf = appendRecord(buf, l.Index, enc)
		entries = append(entries, walEntry{data: enc})
	}
	seg := w.tail()
	if seg == nil || (seg.size > 0 && seg.size+int64(len(buf)) > w.segSize) {
		if seg != nil {
			if err := w.seal(seg, last); err != nil {
				return err
			}
		}
		var err error
		if seg, err = w.newSegment(logs[0].Index); err != nil {
			return err
		}
	}
	if err := w.preallocate(seg, seg.size+int64(len(buf))); err != nil {
		return err
	}
	if err := w.failed(); err != nil { // preallocate's sync found a failure
		return err
	}
	if _, err := seg.f.WriteAt(buf, seg.size); err != nil {
		seg.cutBack() // a short write leaves a torn tail
		return fmt.Errorf("name registry log %s: %w", seg.path, err)
	}
	if !ahead {
		if err := w.sync(seg.f); err != nil {
			seg.cutBack() // not stored, as far as raft knows
			err = fmt.Errorf("name registry log %s: sync: %w", seg.path, err)
			w.syncFailed(err, last)
			return err
		}
		w.syncs()
	}
	for i := range entries {
		entries[i].seg, entries[i].off = seg, seg.size+offs[i]
	}
	seg.size += int64(len(buf))
	w.mu.Lock()
	if len(w.entries) == 0 {
		w.first = logs[0].Index
	}
	w.entries = append(w.entries, entries...)
	w.mu.Unlock()
	end := logs[len(logs)-1].Index
	w.smu.Lock()
	defer w.smu.Unlock()
	if !ahead {
		// The fdatasync covered every entry of this segment, and a
		// segment is synced before the next one starts (seal).
		w.setDurable(end)
	} else if !w.syncing {
		w.syncing = true
		w.bg.Add(1)
		go w.syncAhead()
	}
	return nil
}

// failed is the error of a failed sync of entries written ahead. Call
// with wmu held.
func (w *wal) failed() error {
	w.smu.Lock()
	defer w.smu.Unlock()
	return w.syncErr
}

// syncFailed records a failed fdatasync of the last segment, the log
// holding entries up to last. The kernel reports a write-back error to
// one fdatasync only, so when entries written ahead were waiting for one,
// no later fdatasync can vouch for them: the log takes no more appends,
// their records are cut off the file (a restart must not read them back
// from the page cache as if they were on the disk), and nothing is
// reported durable again. A failure with nothing waiting is the failed
// append's alone. Call with wmu held.
func (w *wal) syncFailed(err error, last uint64) {
	w.smu.Lock()
	defer w.smu.Unlock()
	if w.durable >= last || w.syncErr != nil {
		return
	}
	w.syncErr = err
	w.durableNow.Broadcast()
	seg := w.tail()
	if seg == nil {
		return
	}
	w.mu.RLock()
	off, ok := int64(0), false
	for i := len(w.entries) - 1; i >= 0 && w.first+uint64(i) > w.durable && w.entries[i].seg == seg; i-- {
		off, ok = w.entries[i].off, true
	}
	w.mu.RUnlock()
	if ok && seg.f.Truncate(off) == nil {
		seg.size, seg.alloc = min(seg.size, off), min(seg.alloc, off)
	}
}

// setDurable records that every entry up to index is on disk; after a
// failed sync of entries written ahead, nothing is. Call with smu held.
func (w *wal) setDurable(index uint64) {
	if index > w.durable && w.syncErr == nil {
		w.durable = index
		w.durableNow.Broadcast()
	}
}

// syncAhead makes the entries written ahead durable, one fdatasync for
// every entry written by the time it starts, until none is left.
func (w *wal) syncAhead() {
	defer w.bg.Done()
	for {
		w.wmu.Lock()
		_, last := w.bounds()
		seg, sync, report, before := w.tail(), w.sync, w.aheadSynced, w.testBeforeAheadSync
		w.smu.Lock()
		gen := w.gen
		if seg == nil || last <= w.durable || w.syncErr != nil {
			w.syncing = false
			w.durableNow.Broadcast()
			w.smu.Unlock()
			w.wmu.Unlock()
			return
		}
		w.smu.Unlock()
		w.wmu.Unlock()
		// Outside wmu: the next appends are written meanwhile.
		if before != nil {
			before()
		}
		w.syncMu.Lock()
		start := time.Now()
		err := sync(seg.f)
		w.syncMu.Unlock()
		if errors.Is(err, os.ErrClosed) {
			// A deletion removed the segment meanwhile, and its entries
			// with it: look again.
			continue
		}
		if report != nil {
			report(start, err)
		}
		if err != nil {
			w.wmu.Lock()
			w.syncFailed(fmt.Errorf("name registry log %s: sync of entries written ahead: %w", seg.path, err), last)
			w.wmu.Unlock()
			continue
		}
		w.syncs()
		w.smu.Lock()
		if w.gen == gen { // else the entries it was for were cut off
			w.setDurable(last)
		}
		w.smu.Unlock()
	}
}

// durableIndex is the index up to which every entry is on disk.
func (w *wal) durableIndex() uint64 {
	w.smu.Lock()
	defer w.smu.Unlock()
	return w.durable
}

// waitDurable waits until the entry at index is on disk. It fails when
// the sync of entries written ahead failed, or the log is closed first.
func (w *wal) waitDurable(index uint64) error {
	w.smu.Lock()
	defer w.smu.Unlock()
	for w.durable < index {
		if w.syncErr != nil {
			return w.syncErr
		}
		if w.closed && !w.syncing {
			return fmt.Errorf("name registry log %s: closed before entry %d was durable", w.dir, index)
		}
		w.durableNow.Wait()
	}
	return nil
}

// cut records that the entries after last are gone: a sync in flight
// covers none of what is written in their place. Call with wmu held.
func (w *wal) cut(last uint64) {
	w.smu.Lock()
	defer w.smu.Unlock()
	w.gen++
	w.durable = min(w.durable, last)
}

func (w *wal) tail() *walSegment {
	if len(w.segs) == 0 {
		return nil
	}
	return w.segs[len(w.segs)-1]
}

// preallocate makes seg's file hold at least end bytes, durably, writing
// zeros past its records: walPrealloc more than end, or only up to end
// when the disk has no room for that.
func (w *wal) preallocate(seg *walSegment, end int64) error {
	if end <= seg.alloc {
		return nil
	}
	_, last := w.bounds()
	var err error
	for _, to := range []int64{end + w.prealloc, end} {
		if _, err = seg.f.WriteAt(make([]byte, to-seg.alloc), seg.alloc); err == nil {
			if err = datasync.File(seg.f); err == nil {
				w.syncs()
				seg.alloc = to
				return nil
			}
			w.syncFailed(fmt.Errorf("name registry log %s: sync: %w", seg.path, err), last)
		}
		if terr := seg.f.Truncate(seg.alloc); terr != nil {
			return fmt.Errorf("name registry log %s: making room for an append: %w (and cutting it back: %v)", seg.path, err, terr)
		}
	}
	return fmt.Errorf("name registry log %s: making room for an append: %w", seg.path, err)
}

// cutBack cuts seg's file back to its records after an append that
// failed, so that none of its bytes is read back behind a later append
// that writes fewer in their place. When even that fails, the bytes stay
// past the records, where the log's opening cuts a torn tail off.
func (seg *walSegment) cutBack() {
	if seg.f.Truncate(seg.size) == nil {
		seg.alloc = seg.size
	}
}

// seal cuts seg's file back to its records, durably, before the next
// segment starts: zeros are read as the end of the log only in the last.
// Its entries written ahead, up to last, are made durable with it.
func (w *wal) seal(seg *walSegment, last uint64) error {
	w.smu.Lock()
	pending := w.durable < last
	w.smu.Unlock()
	if seg.alloc == seg.size && !pending {
		return nil
	}
	if err := seg.f.Truncate(seg.size); err != nil {
		return fmt.Errorf("name registry log %s: %w", seg.path, err)
	}
	if err := datasync.File(seg.f); err != nil {
		err = fmt.Errorf("name registry log %s: sync: %w", seg.path, err)
		w.syncFailed(err, last)
		return err
	}
	w.syncs()
	seg.alloc = seg.size
	w.smu.Lock()
	w.setDurable(last)
	w.smu.Unlock()
	return nil
}

// newSegment starts a segment whose first entry is first, durable in the
// directory before anything is appended to it.
func (w *wal) newSegment(first uint64) (*walSegment, error) {
	path := filepath.Join(w.dir, segmentName(first))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("name registry log: %w", err)
	}
	if err := w.syncDir(); err != nil {
		f.Close()
		return nil, err
	}
	seg := &walSegment{first: first, path: path, f: f}
	w.segs = append(w.segs, seg)
	return seg, nil
}

func (w *wal) syncDir() error {
	d, err := os.Open(w.dir)
	if err != nil {
		return fmt.Errorf("name registry log: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("name registry log %s: sync: %w", w.dir, err)
	}
	w.syncs()
	return nil
}

// deleteRange removes entries lo..hi. Raft removes only from the front
// (compaction after a snapshot), from the back (a follower's entries the
// leader overrode), or everything (a snapshot installed): a range in the
// middle is refused.
func (w *wal) deleteRange(lo, hi uint64) error {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	w.syncMu.Lock() // no file closed under a sync of entries written ahead
	defer w.syncMu.Unlock()
	first, last := w.bounds()
	if len(w.entries) == 0 || hi < first || lo > last {
		return nil
	}
	switch {
	case lo <= first:
		return w.deleteFront(min(hi, last))
	case hi >= last:
		return w.deleteBack(lo)
	}
	return fmt.Errorf("name registry log %s: deleting entries %d..%d from the middle of %d..%d is not supported", w.dir, lo, hi, first, last)
}

// deleteFront drops entries up to upTo from memory and removes the
// segments that hold nothing else. The caller records the new first index
// durably first (Store.DeleteRange), so entries left in a partly deleted
// segment stay deleted across a restart.
func (w *wal) deleteFront(upTo uint64) error {
	w.dropFront(upTo)
	if len(w.entries) == 0 {
		// Everything, under a snapshot: a sync in flight covers none of
		// what is appended next, and what was deleted is in the snapshot.
		w.smu.Lock()
		w.gen++
		if w.syncErr == nil {
			w.durable = upTo
		}
		w.smu.Unlock()
	}
	removed := false
	for len(w.segs) > 0 {
		s := w.segs[0]
		// With everything deleted, the last segment goes too: the next
		// append may start at any index.
		if len(w.entries) > 0 && w.entries[0].seg == s {
			break
		}
		w.segs = w.segs[1:]
		s.f.Close()
		if err := os.Remove(s.path); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("name registry log: %w", err)
		}
		removed = true
	}
	if removed {
		return w.syncDir()
	}
	return nil
}

func (w *wal) dropFront(upTo uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := int(upTo - w.first + 1)
	w.entries = slices.Clone(w.entries[n:])
	w.first = upTo + 1
}

// deleteBack cuts the log from lo on, durably, before anything is appended
// in its place.
func (w *wal) deleteBack(lo uint64) error {
	w.cut(lo - 1)
	w.mu.Lock()
	cut := w.entries[lo-w.first]
	w.entries = w.entries[:lo-w.first]
	w.mu.Unlock()
	for len(w.segs) > 0 && w.tail() != cut.seg {
		s := w.tail()
		w.segs = w.segs[:len(w.segs)-1]
		s.f.Close()
		if err := os.Remove(s.path); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("name registry log: %w", err)
		}
	}
	if err := cut.seg.f.Truncate(cut.off); err != nil {
		return fmt.Errorf("name registry log %s: %w", cut.seg.path, err)
	}
	cut.seg.size, cut.seg.alloc = cut.off, cut.off
	if err := cut.seg.f.Sync(); err != nil {
		err = fmt.Errorf("name registry log %s: sync: %w", cut.seg.path, err)
		w.syncFailed(err, lo-1)
		return err
	}
	w.syncs()
	w.smu.Lock()
	w.setDurable(lo - 1) // what is left, earlier segments synced when sealed
	w.smu.Unlock()
	if cut.off == 0 {
		// An empty segment named after an index the log may not hold
		// next: the next append starts a fresh one.
		w.segs = w.segs[:len(w.segs)-1]
		cut.seg.f.Close()
		if err := os.Remove(cut.seg.path); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("name registry log: %w", err)
		}
	}
	return w.syncDir()
}
