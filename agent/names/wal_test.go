package names

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"

	"github.com/gpuherd/gpuherd/internal/datasync"
)

func walLog(i, term uint64) *raft.Log {
	return &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("cmd %d/%d", i, term))}
}

// checkLog compares the store's log with want (index → term), read
// through raft's interface.
func checkLog(t *testing.T, s *Store, want map[uint64]uint64, first, last uint64) {
	t.Helper()
	f, _ := s.FirstIndex()
	l, _ := s.LastIndex()
	if f != first || l != last {
		t.Fatalf("log holds %d..%d, want %d..%d", f, l, first, last)
	}
	for i := first; i <= last && last != 0; i++ {
		var got raft.Log
		if err := s.GetLog(i, &got); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		if w := walLog(i, want[i]); got.Index != i || got.Term != w.Term || !bytes.Equal(got.Data, w.Data) {
			t.Fatalf("entry %d: %+v, want %+v", i, got, *w)
		}
	}
	var l0 raft.Log
	if first > 0 {
		if err := s.GetLog(first-1, &l0); err != raft.ErrLogNotFound {
			t.Fatalf("entry %d below the first: %v", first-1, err)
		}
	}
	if err := s.GetLog(last+1, &l0); err != raft.ErrLogNotFound {
		t.Fatalf("entry %d above the last: %v", last+1, err)
	}
}

// TestWALAgainstModel runs random appends (a follower's, synced, and the
// leader's, written ahead), compactions, truncations of the tail, full
// deletions and reopenings (each a restart of the agent) with small
// segments, and checks the log after each against a model.
func TestWALAgainstModel(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(seed, 7))
			path := filepath.Join(t.TempDir(), "names.db")
			open := func() *Store {
				s, err := OpenStore(path)
				if err != nil {
					t.Fatal(err)
				}
				s.log.segSize = 300 // a few entries a segment
				s.log.prealloc = 64 // zeros ahead, written every few appends
				return s
			}
			s := open()
			defer func() { s.Close() }()
			want := map[uint64]uint64{}
			var first, last, term uint64 = 0, 0, 1
			for step := 0; step < 200; step++ {
				switch r := rnd.IntN(20); {
				case r < 12: // append a batch
					n := 1 + rnd.IntN(4)
					start := last + 1
					if last == 0 {
						start = first
						if start == 0 {
							start = 1
						}
					}
					var logs []*raft.Log
					for i := start; i < start+uint64(n); i++ {
						logs = append(logs, walLog(i, term))
						want[i] = term
					}
					store := s.StoreLogs // a follower's: durable on return
					if rnd.IntN(2) == 0 {
						store = s.log.appendAhead // the leader's
					}
					if err := store(logs); err != nil {
						t.Fatal(err)
					}
					if last == 0 {
						first = start
					}
					last = start + uint64(n) - 1
				case r < 15 && last > 0: // compaction
					hi := first + uint64(rnd.IntN(int(last-first+1)))
					if hi == last {
						hi-- // keep one: everything is its own case
					}
					if hi < first {
						continue
					}
					if err := s.DeleteRange(first, hi); err != nil {
						t.Fatal(err)
					}
					first = hi + 1
				case r < 17 && last > first: // the leader overrode the tail
					lo := first + 1 + uint64(rnd.IntN(int(last-first)))
					if err := s.DeleteRange(lo, last); err != nil {
						t.Fatal(err)
					}
					last = lo - 1
					term++
				case r == 17 && last > 0: // a snapshot installed: everything
					if err := s.DeleteRange(first, last); err != nil {
						t.Fatal(err)
					}
					first, last = last+5+uint64(rnd.IntN(10)), 0
					term++
				default: // restart
					s.Close()
					s = open()
				}
				f := first
				if last == 0 {
					f = 0
				}
				checkLog(t, s, want, f, last)
				// Entries written ahead are made durable beside the next
				// steps; nothing says more is durable than the log holds
				// (an empty one, what a snapshot took, below first).
				if d := durableOf(s); (last > 0 && d > last) || (last == 0 && first > 0 && d >= first) {
					t.Fatalf("step %d: durable up to %d, the log holds %d..%d", step, d, first, last)
				}
				if last > 0 && rnd.IntN(4) == 0 {
					if err := s.WaitDurable(last); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
}

// TestWALCutsAnInterruptedAppend: a crash during an append leaves a torn
// record at the end of the last segment; the log opens without it, and
// the next append lands where it was and survives a restart.
func TestWALCutsAnInterruptedAppend(t *testing.T) {
	for _, tail := range [][]byte{
		{1, 2, 3}, // header cut short
		appendRecord(nil, 4, []byte("entry"))[:20],                                                 // body cut short
		func() []byte { b := appendRecord(nil, 4, []byte("entry")); b[len(b)-1] ^= 1; return b }(), // bits of the body not written
	} {
		path := filepath.Join(t.TempDir(), "names.db")
		s, err := OpenStore(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.StoreLogs([]*raft.Log{walLog(1, 1), walLog(2, 1), walLog(3, 1)}); err != nil {
			t.Fatal(err)
		}
		segPath, end := s.log.tail().path, s.log.tail().size
		s.Close()
		// Where the next append went, over the zeros written ahead.
		f, err := os.OpenFile(segPath, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(tail, end); err != nil {
			t.Fatal(err)
		}
		f.Close()

		s, err = OpenStore(path)
		if err != nil {
			t.Fatalf("torn tail %x: %v", tail, err)
		}
		want := map[uint64]uint64{1: 1, 2: 1, 3: 1, 4: 2}
		checkLog(t, s, want, 1, 3)
		if err := s.StoreLogs([]*raft.Log{walLog(4, 2)}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s, err = OpenStore(path)
		if err != nil {
			t.Fatal(err)
		}
		checkLog(t, s, want, 1, 4)
		s.Close()
	}
}

// TestWALWritesZerosAheadOfItsRecords: the last segment's file holds zeros
// ahead of its records, so that appends do not grow it (their fdatasync
// writes no metadata); a segment is cut back to its records when the next
// starts, and the zeros are cut off when the log is opened.
func TestWALWritesZerosAheadOfItsRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "names.db")
	s, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	s.log.prealloc = 4096
	size := func(p string) int64 {
		t.Helper()
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	if err := s.StoreLogs([]*raft.Log{walLog(1, 1)}); err != nil {
		t.Fatal(err)
	}
	first := s.log.tail()
	if got, want := size(first.path), first.size+4096; got != want {
		t.Fatalf("segment file after one append: %d bytes, want its %d bytes of records and 4096 of zeros", got, first.size)
	}
	grown := size(first.path)
	for i := uint64(2); i <= 5; i++ {
		if err := s.StoreLogs([]*raft.Log{walLog(i, 1)}); err != nil {
			t.Fatal(err)
		}
		if got := size(first.path); got != grown {
			t.Fatalf("append of entry %d grew the segment file from %d to %d bytes, inside the zeros written ahead", i, grown, got)
		}
	}
	s.log.segSize = first.size + 1 // the next append starts a segment
	if err := s.StoreLogs([]*raft.Log{walLog(6, 1)}); err != nil {
		t.Fatal(err)
	}
	if len(s.log.segs) != 2 {
		t.Fatalf("%d segments, want 2", len(s.log.segs))
	}
	if got := size(first.path); got != first.size {
		t.Fatalf("the segment before the last keeps %d bytes, want only its %d bytes of records", got, first.size)
	}
	last := s.log.tail()
	lastPath, lastRecords := last.path, last.size
	if size(lastPath) <= lastRecords {
		t.Fatal("no zeros ahead of the last segment's records")
	}
	s.Close()
	s, err = OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkLog(t, s, map[uint64]uint64{1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1}, 1, 6)
	if got := size(lastPath); got != lastRecords {
		t.Fatalf("after reopening, the last segment holds %d bytes, want its %d bytes of records", got, lastRecords)
	}
}

// TestWALFailedSyncIsNeverReadBack: an append whose fdatasync fails was
// not stored, as raft is told; its records may be on the disk all the
// same. The next append takes their place, and a restart must not read
// any of them back behind it (here the failed batch held two entries, the
// next one only one of the same size).
func TestWALFailedSyncIsNeverReadBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "names.db")
	s, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLogs([]*raft.Log{walLog(1, 1), walLog(2, 1)}); err != nil {
		t.Fatal(err)
	}
	s.log.sync = func(*os.File) error { return errors.New("injected: the disk failed the sync") }
	err = s.StoreLogs([]*raft.Log{walLog(3, 1), walLog(4, 1)})
	s.log.sync = datasync.File
	if err == nil {
		t.Fatal("append with a failed sync succeeded")
	}
	if err := s.StoreLogs([]*raft.Log{walLog(3, 2)}); err != nil {
		t.Fatal(err)
	}
	want := map[uint64]uint64{1: 1, 2: 1, 3: 2}
	checkLog(t, s, want, 1, 3)
	s.Close()
	s, err = OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkLog(t, s, want, 1, 3)
}

// TestWALRefusesDamage: a bad record anywhere but the end of the last
// segment is damage, not an interrupted append: the store does not open,
// and says which file and where.
func TestWALRefusesDamage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "names.db")
	s, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	s.log.segSize = 40 // one entry a segment
	for i := uint64(1); i <= 6; i++ {
		if err := s.StoreLogs([]*raft.Log{walLog(i, 1)}); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.log.segs) < 3 {
		t.Fatalf("%d segments, want several", len(s.log.segs))
	}
	damaged := s.log.segs[0].path
	s.Close()
	b, _ := os.ReadFile(damaged)
	b[walHeader+2] ^= 0xff
	if err := os.WriteFile(damaged, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = OpenStore(path)
	if err == nil || !strings.Contains(err.Error(), filepath.Base(damaged)) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("opening a damaged log: %v", err)
	}
}

// TestStoreMovesTheBoltLog: a store written by an older version keeps its
// log in the bbolt file; opening it moves the entries into the
// write-ahead log, also when a first move was interrupted half-way.
func TestStoreMovesTheBoltLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "names.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint64]uint64{}
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketLogs)
		if err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists(bucketStable); err != nil {
			return err
		}
		for i := uint64(7); i <= 12; i++ {
			want[i] = 3
			if err := b.Put(indexKey(i), encodeLog(walLog(i, 3))); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketStable).Put([]byte("CurrentTerm"), indexKey(3))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	// A move interrupted after part of the log was appended.
	w, err := openWAL(LogDir(path), 0, func() {})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.append([]*raft.Log{walLog(7, 3), walLog(8, 3)}); err != nil {
		t.Fatal(err)
	}
	w.close()

	for range 2 { // the move, then a plain restart
		s, err := OpenStore(path)
		if err != nil {
			t.Fatal(err)
		}
		checkLog(t, s, want, 7, 12)
		if term, err := s.GetUint64([]byte("CurrentTerm")); err != nil || term != 3 {
			t.Fatalf("stable term %d, %v", term, err)
		}
		if err := s.db.View(func(tx *bolt.Tx) error {
			if tx.Bucket(bucketLogs) != nil {
				return fmt.Errorf("the old log bucket is still there")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
}

// TestWALRefusesAGap: raft appends after the last entry; anything else is
// a bug to refuse, not to store.
func TestWALRefusesAGap(t *testing.T) {
	s, err := OpenStore(filepath.Join(t.TempDir(), "names.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.StoreLogs([]*raft.Log{walLog(5, 1)}); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLogs([]*raft.Log{walLog(7, 1)}); err == nil {
		t.Fatal("a gap was stored")
	}
	if err := s.StoreLogs([]*raft.Log{walLog(6, 1), walLog(8, 1)}); err == nil {
		t.Fatal("a batch with a gap was stored")
	}
	if err := s.DeleteRange(5, 5); err != nil {
		t.Fatal(err)
	}
	checkLog(t, s, nil, 0, 0)
}

// BenchmarkWALAppend: one registry command appended and made durable, in
// the data directory's file system (TMPDIR): what the leader and each
// follower pay for every raft write.
func BenchmarkWALAppend(b *testing.B) {
	s, err := OpenStore(filepath.Join(b.TempDir(), "names.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	data := bytes.Repeat([]byte("x"), 300) // a hold, about as encoded
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		if err := s.StoreLogs([]*raft.Log{{Index: uint64(i), Term: 1, Type: raft.LogCommand, Data: data}}); err != nil {
			b.Fatal(err)
		}
	}
}

// A deletion may close the segment a sync of entries written ahead is
// about to sync (after the sync read it, before it took syncMu): here a
// new leader's entries override the tail, on a server that wrote its own
// ahead as leader. The sync finds the file closed and looks again. Until
// datasync held the file for the call, it synced the descriptor's raw
// number, -1 once closed, and the log failed for good on "bad file
// descriptor" (seen once in CI, in TestWALAgainstModel).
func TestWALSyncAheadOfAClosedSegmentLooksAgain(t *testing.T) {
	s, err := OpenStore(filepath.Join(t.TempDir(), "names.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.log.segSize = 100 // a segment or two an entry
	if err := s.StoreLogs([]*raft.Log{walLog(1, 1), walLog(2, 1)}); err != nil {
		t.Fatal(err)
	}
	cut := false
	s.log.wmu.Lock()
	s.log.testBeforeAheadSync = func() {
		if !cut {
			cut = true
			if err := s.DeleteRange(3, 6); err != nil { // the tail overridden
				t.Error(err)
			}
		}
	}
	s.log.wmu.Unlock()
	if err := s.log.appendAhead([]*raft.Log{walLog(3, 1), walLog(4, 1), walLog(5, 1), walLog(6, 1)}); err != nil {
		t.Fatal(err)
	}
	s.log.bg.Wait() // the sync ahead is done
	if !cut {
		t.Fatal("the sync ahead never ran")
	}
	if err := s.log.failed(); err != nil {
		t.Fatalf("the log failed: %v", err)
	}
	if err := s.StoreLogs([]*raft.Log{walLog(3, 2), walLog(4, 2)}); err != nil {
		t.Fatalf("append after the cut: %v", err)
	}
	checkLog(t, s, map[uint64]uint64{1: 1, 2: 1, 3: 2, 4: 2}, 1, 4)
}
