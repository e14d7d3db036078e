package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// withJournalSize preallocates the journal with n bytes, so that a test
// makes it checkpoint after a few writes.
func withJournalSize(n int64) Option {
	return func(o *options) { o.journalSize = n }
}

// openWithClaims opens the ledger at path on server() and commits a
// claim of one H100 for each of ids.
func openWithClaims(t *testing.T, path string, ids ...string) *Ledger {
	t.Helper()
	l := openAt(t, path)
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		mustReserve(t, l, id, req(Item{Model: h100, Count: 1}), t0)
		mustCommit(t, l, id, t0)
	}
	return l
}

// durable is what a ledger must hold after a restart: what its
// acknowledged writes left, without the reservations.
type durable struct {
	Claims   []Claim
	Released []Released
	Facts    map[string][]byte
	States   []GPUState
}

func durableOf(t *testing.T, l *Ledger) durable {
	t.Helper()
	var d durable
	for _, c := range l.List() {
		if c.State == StateCommitted {
			d.Claims = append(d.Claims, c)
		}
	}
	var err error
	if d.Released, err = l.RecallAll(t0, time.Hour); err != nil {
		t.Fatal(err)
	}
	if d.Facts, err = l.Facts(); err != nil {
		t.Fatal(err)
	}
	d.States = l.GPUStates(t0)
	return d
}

// someWrites makes every kind of write the journal takes: commits,
// releases that are remembered, a drain, facts, a claim given its name
// token; n rounds of them.
func someWrites(t *testing.T, l *Ledger, n int) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("vm-%d", i)
		mustReserve(t, l, id, req(Item{Model: h100, Count: 1}), t0)
		mustCommit(t, l, id, t0)
		if _, err := l.SetNameToken(id, uint64(i+1)); err != nil {
			t.Fatal(err)
		}
		if err := l.PutFacts("0000:18:00.0", []byte(fmt.Sprintf(`{"round":%d}`, i))); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if _, err := l.ReleaseRemembering(id, t0, time.Hour); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := l.Drain("0000:62:00.0", "fan", t0); err != nil {
		t.Fatal(err)
	}
}

// TestKilledLedgerKeepsEveryAcknowledgedWrite: a ledger killed without
// Close (its journal not stored in the file, or stored part-way through
// its checkpoints) opens again holding every acknowledged write, and the
// operator's tools (check, backup, remove-claim) see them too without
// writing the file.
func TestKilledLedgerKeepsEveryAcknowledgedWrite(t *testing.T) {
	for _, size := range []int64{journalSize, 2 << 10} {
		t.Run(fmt.Sprintf("journal of %d bytes", size), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "ledger.db")
			l, err := Open(path, withJournalSize(size))
			if err != nil {
				t.Fatal(err)
			}
			if err := l.SetInventory(server()); err != nil {
				t.Fatal(err)
			}
			someWrites(t, l, 6)
			want := durableOf(t, l)
			// A reservation, which no restart keeps.
			mustReserve(t, l, "vm-reserved", req(Item{Model: l40s, Count: 1}), t0)
			if err := l.Abandon(); err != nil {
				t.Fatal(err)
			}
			file, journal := ledgerFiles(t, path)

			rep, err := Inspect(path, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(rep.Claims, want.Claims) || rep.JournalPending == 0 {
				t.Errorf("Inspect of a killed ledger = %+v, want its claims %+v and the journal's records pending", rep, want.Claims)
			}
			if f, j := ledgerFiles(t, path); !bytes.Equal(f, file) || !bytes.Equal(j, journal) {
				t.Error("Inspect wrote the ledger or its journal")
			}
			backup := filepath.Join(dir, "backup.db")
			if _, err := BackupFile(path, backup, 0); err != nil {
				t.Fatal(err)
			}
			if f, j := ledgerFiles(t, path); !bytes.Equal(f, file) || !bytes.Equal(j, journal) {
				t.Error("BackupFile wrote the ledger or its journal")
			}

			for _, p := range []string{path, backup} {
				again := openAt(t, p)
				if err := again.SetInventory(server()); err != nil {
					t.Fatal(err)
				}
				if got := durableOf(t, again); !reflect.DeepEqual(got, want) {
					t.Errorf("%s after a kill holds\n%+v\nwant\n%+v", filepath.Base(p), got, want)
				}
			}
		})
	}
}

// TestRemoveClaimAppliesTheJournalFirst: the claim to remove may be in
// the journal only; applied after the removal, it would come back.
func TestRemoveClaimAppliesTheJournalFirst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l := openWithClaims(t, path, "vm-1", "vm-2")
	if err := l.Abandon(); err != nil {
		t.Fatal(err)
	}
	if _, err := RemoveClaim(path, "vm-1", 0); err != nil {
		t.Fatal(err)
	}
	again := openAt(t, path)
	if _, err := again.Get("vm-1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("vm-1 after remove-claim: %v, want not found", err)
	}
	if c, err := again.Get("vm-2"); err != nil || c.State != StateCommitted {
		t.Errorf("vm-2 after remove-claim: %+v, %v", c, err)
	}
}

// TestTornJournalRecord: a crash part-way through an append leaves a
// record cut short; it was never acknowledged, and the ledger opens
// without it, whatever byte the write stopped at. A record damaged
// after a whole record was appended behind it is refused, not dropped
// with the records after it.
func TestTornJournalRecord(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ledger.db")
	l := openWithClaims(t, path, "vm-1")
	_, before := ledgerFiles(t, path)
	mustReserve(t, l, "vm-2", req(Item{Model: h100, Count: 1}), t0)
	mustCommit(t, l, "vm-2", t0)
	file, journal := ledgerFiles(t, path)
	_, start, ok := frameAt(before, 0)
	if !ok {
		t.Fatal("no first record")
	}
	_, end, ok := frameAt(journal, start)
	if !ok {
		t.Fatal("no second record")
	}
	holds := func(j []byte) (vm1, vm2 bool, err error) {
		p := filepath.Join(t.TempDir(), "ledger.db")
		writeLedgerFiles(t, p, file, j)
		after, err := Open(p)
		if err != nil {
			return false, false, err
		}
		defer after.Close()
		_, e1 := after.Get("vm-1")
		_, e2 := after.Get("vm-2")
		return e1 == nil, e2 == nil, nil
	}
	for cut := start; cut <= end; cut++ {
		j := bytes.Clone(journal)
		clear(j[cut:end]) // the preallocation's zeros where the write did not reach
		vm1, vm2, err := holds(j)
		if err != nil || !vm1 || vm2 != (cut == end) {
			t.Fatalf("record cut at byte %d of %d..%d: vm-1 %v, vm-2 %v, %v; want vm-1, and vm-2 only when whole", cut, start, end, vm1, vm2, err)
		}
	}
	j := bytes.Clone(journal)
	j[end-1] ^= 0xff
	if vm1, vm2, err := holds(j); err != nil || !vm1 || vm2 {
		t.Errorf("last record failing its checksum: vm-1 %v, vm-2 %v, %v; want it dropped", vm1, vm2, err)
	}
	j = bytes.Clone(journal)
	j[start-1] ^= 0xff
	_, _, err := holds(j)
	var ce *CorruptError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), JournalPath("")) || !strings.Contains(err.Error(), "follows it") {
		t.Errorf("a damaged record with one behind it: %v, want a CorruptError naming the journal", err)
	}
}

// TestFailedAppendIsNeverReadBack: an append whose fdatasync fails is not
// acknowledged; its bytes, written already, must not come back after a
// crash, and the next append takes its place.
func TestFailedAppendIsNeverReadBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l := openWithClaims(t, path, "vm-1")
	mustReserve(t, l, "vm-2", req(Item{Model: h100, Count: 1}), t0)
	testJournalSync = func() error { return errors.New("injected fdatasync failure") }
	_, err := l.Commit("vm-2", t0)
	testJournalSync = nil
	if err == nil || !strings.Contains(err.Error(), "not acknowledged") {
		t.Fatalf("Commit whose fdatasync failed = %v, want not acknowledged", err)
	}
	if c, err := l.Get("vm-2"); err != nil || c.State != StateReserved {
		t.Fatalf("vm-2 after a failed commit: %+v, %v; want still reserved", c, err)
	}
	// The next append takes the failed one's place.
	mustReserve(t, l, "vm-3", req(Item{Model: h100, Count: 1}), t0)
	mustCommit(t, l, "vm-3", t0)
	if err := l.Abandon(); err != nil {
		t.Fatal(err)
	}
	again := openAt(t, path)
	if _, err := again.Get("vm-2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("vm-2, whose commit failed, after a crash: %v; want not found", err)
	}
	for _, id := range []string{"vm-1", "vm-3"} {
		if c, err := again.Get(id); err != nil || c.State != StateCommitted {
			t.Fatalf("%s after a crash: %+v, %v", id, c, err)
		}
	}
}

// TestSchemaSaysWhenTheJournalMayHoldWrites: while the journal holds
// writes the file lacks, the file's schema is one an older gpuherd
// refuses; once Close stored them, it is the schema every gpuherd reads.
func TestSchemaSaysWhenTheJournalMayHoldWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	schema := func() string {
		db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var s string
		_ = db.View(func(tx *bolt.Tx) error { s = string(tx.Bucket(bucketMeta).Get(keySchema)); return nil })
		return s
	}
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if s := schema(); s != "1" {
		t.Fatalf("schema after a Close with nothing written: %s, want 1", s)
	}
	l = openWithClaims(t, path, "vm-1")
	if err := l.Abandon(); err != nil {
		t.Fatal(err)
	}
	if s := schema(); s != "2" {
		t.Fatalf("schema of a killed ledger with writes in its journal: %s, want 2", s)
	}
	l, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if s := func() string { _ = l.Close(); return schema() }(); s != "1" {
		t.Fatalf("schema after a clean Close: %s, want 1", s)
	}
}

// TestMissingLedgerWithAJournalIsRefused: a journal holding writes
// without its ledger file means the file was moved or lost; starting
// empty would forget acknowledged claims.
func TestMissingLedgerWithAJournalIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l := openWithClaims(t, path, "vm-1")
	if err := l.Abandon(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path, path+".bad"); err != nil {
		t.Fatal(err)
	}
	_, err := Open(path)
	var ce *CorruptError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), JournalPath(path)) {
		t.Fatalf("Open without the file but with its journal = %v, want a CorruptError naming the journal", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused Open created the file: %v", err)
	}
	if err := os.Rename(JournalPath(path), JournalPath(path)+".bad"); err != nil {
		t.Fatal(err)
	}
	empty := openAt(t, path)
	if got := empty.List(); len(got) != 0 {
		t.Fatalf("a new ledger holds %+v", got)
	}
}

// TestCheckpointsKeepTheJournalSmall: the journal is stored in the file
// and reused from its start, so it stays at its preallocated size over
// many writes, each of which cost one fdatasync.
func TestCheckpointsKeepTheJournalSmall(t *testing.T) {
	const size = 4 << 10
	path := filepath.Join(t.TempDir(), "ledger.db")
	l := openAt(t, path, withJournalSize(size))
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	const rounds = 200
	before, syncs := l.Fdatasyncs(), l.Syncs()
	for i := range rounds {
		id := fmt.Sprintf("vm-%d", i)
		mustReserve(t, l, id, req(Item{Model: h100, Count: 1}), t0)
		mustCommit(t, l, id, t0)
		if _, err := l.Release(id, t0); err != nil {
			t.Fatal(err)
		}
	}
	if got := l.Syncs() - syncs; got != 2*rounds {
		t.Errorf("%d durable writes for %d claims and releases, want %d", got, rounds, 2*rounds)
	}
	writes, checkpoints := 2*rounds, (l.Fdatasyncs()-before-2*rounds)/2
	if checkpoints == 0 || checkpoints > rounds/5 {
		t.Errorf("%d fdatasyncs for %d writes: %d checkpoints, want some, and far fewer than writes", l.Fdatasyncs()-before, writes, checkpoints)
	}
	fi, err := os.Stat(JournalPath(path))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != size {
		t.Errorf("journal is %d bytes after %d writes, want its preallocated %d", fi.Size(), writes, size)
	}
}

// TestJournalOfOperationsTheLedgerNeverWritesIsRefused: a record that
// would write another bucket, the schema, or an empty key is damage (or a
// hand edit), and Open refuses it, naming the journal and the record,
// before it touches the file.
func TestJournalOfOperationsTheLedgerNeverWritesIsRefused(t *testing.T) {
	for _, op := range []journalOp{
		{Bucket: "elsewhere", Key: "k", Value: []byte("v")},
		{Bucket: "meta", Key: "schema", Value: []byte("1")},
		{Bucket: "claims", Key: "", Value: []byte("{}")},
		{Bucket: "claims", Key: "vm-1"},
	} {
		path := filepath.Join(t.TempDir(), "ledger.db")
		l := openWithClaims(t, path)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		file, _ := ledgerFiles(t, path)
		rec, err := encodeJournalRecord(journalRecord{Seq: 1, Ops: []journalOp{op}})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(JournalPath(path), rec, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err = Open(path)
		var ce *CorruptError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), JournalPath(path)) || !strings.Contains(err.Error(), "record 1") {
			t.Errorf("journal writing %+v: Open = %v, want a CorruptError naming the journal and the record", op, err)
		}
		if after, _ := ledgerFiles(t, path); !bytes.Equal(after, file) {
			t.Errorf("journal writing %+v: the refused Open changed the file", op)
		}
	}
}

// TestJournalThatIsNoFileOrTooLargeIsRefused: Open reads the journal
// whole, so a directory, or a file far larger than the ledger ever
// writes, is refused with an error naming it rather than read.
func TestJournalThatIsNoFileOrTooLargeIsRefused(t *testing.T) {
	for name, mk := range map[string]func(jpath string) error{
		"a directory": func(jpath string) error { return os.Mkdir(jpath, 0o700) },
		"too large": func(jpath string) error {
			f, err := os.Create(jpath)
			if err != nil {
				return err
			}
			defer f.Close()
			return f.Truncate(maxJournalSize + 1) // sparse: no disk used
		},
	} {
		path := filepath.Join(t.TempDir(), "ledger.db")
		l := openWithClaims(t, path, "vm-1")
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(JournalPath(path)); err != nil {
			t.Fatal(err)
		}
		if err := mk(JournalPath(path)); err != nil {
			t.Fatal(err)
		}
		_, err := Open(path)
		var ce *CorruptError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), JournalPath(path)) {
			t.Errorf("%s as the journal: Open = %v, want a CorruptError naming it", name, err)
		}
	}
}
