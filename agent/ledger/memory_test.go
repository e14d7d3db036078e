package ledger

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Reservations live in memory only: the calls that change nothing but
// reservations never open a write transaction on the file, and a claim costs
// one, its Commit.

// fileTxID is the number of the last write to l's files: every write is
// one journal record (the checkpoints that move records into bbolt
// write nothing new), so it moves by one with every write acknowledged,
// and with nothing else.
func fileTxID(l *Ledger) (int, error) {
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	return int(l.journal.seq), nil
}

// fileMark is what tells whether anything wrote l's file: the last committed
// transaction and the pages bbolt has written since Open.
type fileMark struct {
	txid  int
	pages int64
}

func markFile(t *testing.T, l *Ledger) fileMark {
	t.Helper()
	id, err := fileTxID(l)
	if err != nil {
		t.Fatal(err)
	}
	st := l.db.Stats()
	return fileMark{txid: id, pages: st.TxStats.GetWrite()}
}

// withoutFileWrites runs do while the test holds the file's writer lock
// (fileMu, which every write to the journal or to bbolt takes), so that a
// call that would write, even one that then writes nothing, blocks and is
// reported instead of finishing. It also checks that nothing was written
// to the file.
func withoutFileWrites(t *testing.T, l *Ledger, name string, do func() error) error {
	t.Helper()
	before := markFile(t, l)
	l.fileMu.Lock()
	done := make(chan error, 1)
	go func() { done <- do() }()
	var callErr error
	select {
	case callErr = <-done:
		l.fileMu.Unlock()
	case <-time.After(2 * time.Second):
		// A change in memory takes microseconds: this one is waiting for
		// the writer lock the test holds.
		t.Errorf("%s waited for the ledger file's writer lock", name)
		l.fileMu.Unlock()
		callErr = <-done
	}
	if after := markFile(t, l); after != before {
		t.Errorf("%s wrote the ledger file: %+v → %+v", name, before, after)
	}
	return callErr
}

// writesOnce runs do and checks that it committed exactly one write
// transaction to the file.
func writesOnce(t *testing.T, l *Ledger, name string, do func() error) error {
	t.Helper()
	before := markFile(t, l)
	err := do()
	if after := markFile(t, l); after.txid != before.txid+1 {
		t.Errorf("%s committed %d write transactions, want 1", name, after.txid-before.txid)
	}
	return err
}

func TestReservationsWriteNoFile(t *testing.T) {
	l := newLedger(t)
	mustReserve(t, l, "vm-c", req(Item{Model: l40s, Count: 1}), t0)
	mustCommit(t, l, "vm-c", t0)
	r := req(Item{Model: h100, Count: 2})
	later := t0.Add(2 * lease)

	steps := []struct {
		name string
		do   func() error
		want error // nil, or the sentinel the call must fail with
	}{
		{"Reserve", func() error { _, err := l.Reserve("vm-1", r, "coord", t0, lease); return err }, nil},
		{"Reserve retried", func() error { _, err := l.Reserve("vm-1", r, "coord", t0, lease); return err }, nil},
		{"Reserve with another request", func() error {
			_, err := l.Reserve("vm-1", req(Item{Model: h100, Count: 1}), "coord", t0, lease)
			return err
		}, ErrConflict},
		{"Reserve that does not fit", func() error {
			_, err := l.Reserve("vm-big", req(Item{Model: l40s, Count: 2}), "coord", t0, lease)
			return err
		}, ErrNotAvailable},
		{"Extend", func() error { _, err := l.Extend("vm-1", t0.Add(time.Second), lease); return err }, nil},
		{"Extend of a committed claim", func() error { _, err := l.Extend("vm-c", t0, lease); return err }, nil},
		{"Commit of a committed claim", func() error { _, err := l.Commit("vm-c", t0); return err }, nil},
		{"Release of a reservation", func() error { _, err := l.Release("vm-1", t0); return err }, nil},
		{"Release of an unknown claim", func() error { _, err := l.Release("vm-1", t0); return err }, ErrNotFound},
		{"Reserve again", func() error { _, err := l.Reserve("vm-2", r, "coord", t0, lease); return err }, nil},
		{"Reserve a third", func() error { _, err := l.Reserve("vm-3", r, "coord", t0, lease); return err }, nil},
		{"Reserve a fourth", func() error { _, err := l.Reserve("vm-4", r, "coord", t0, lease); return err }, nil},
		{"Reserve a fifth", func() error {
			_, err := l.Reserve("vm-5", req(Item{Model: h100, Count: 1}), "coord", t0, lease)
			return err
		}, nil},
		{"Commit after the lease", func() error { _, err := l.Commit("vm-2", later); return err }, ErrLeaseExpired},
		{"Extend after the lease", func() error { _, err := l.Extend("vm-3", later, lease); return err }, ErrLeaseExpired},
		{"Release after the lease", func() error { _, err := l.Release("vm-4", later); return err }, ErrNotFound},
		{"Expire", func() error {
			got, err := l.Expire(later)
			if err == nil && (len(got) != 1 || got[0].ID != "vm-5") {
				t.Errorf("Expire = %+v, want vm-5", got)
			}
			return err
		}, nil},
		{"Expire with nothing to do", func() error { _, err := l.Expire(later); return err }, nil},
		{"SetInventory", func() error { return l.SetInventory(server()[:9]) }, nil},
		{"Drain with the same reason", func() error { return l.Drain("0000:9a:00.0", "fan", t0) }, nil},
		{"Undrain of a GPU in service", func() error { return l.Undrain("0000:18:00.0") }, nil},
		{"Resize to the same request", func() error { _, err := l.Resize("vm-c", req(Item{Model: l40s, Count: 1}), later); return err }, nil},
	}
	if err := l.Drain("0000:9a:00.0", "fan", t0); err != nil {
		t.Fatal(err)
	}

	for _, s := range steps {
		rev := l.Revision()
		err := withoutFileWrites(t, l, s.name, s.do)
		if s.want == nil && err != nil || s.want != nil && !errors.Is(err, s.want) {
			t.Fatalf("%s = %v, want %v", s.name, err, s.want)
		}
		if l.Revision() < rev {
			t.Fatalf("%s: revision went back from %d to %d", s.name, rev, l.Revision())
		}
	}
	if got := l.List(); len(got) != 1 || got[0].ID != "vm-c" {
		t.Fatalf("left %+v, want only vm-c", got)
	}
}

// TestClaimCostsOneWrite: Reserve writes nothing and Commit writes the
// claim in one transaction; releasing the committed claim is one more.
// The revision the file holds is the ledger's at the last write.
func TestClaimCostsOneWrite(t *testing.T) {
	l := newLedger(t)
	var c Claim
	err := withoutFileWrites(t, l, "Reserve", func() error {
		var err error
		c, err = l.Reserve("vm-1", req(Item{Model: h100, Count: 2}), "coord", t0, lease)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := writesOnce(t, l, "Commit", func() error { _, err := l.Commit("vm-1", t0); return err }); err != nil {
		t.Fatal(err)
	}
	if got := fileRevision(t, l); got != l.Revision() {
		t.Fatalf("file holds revision %d after Commit, ledger %d", got, l.Revision())
	}
	got, err := l.Get("vm-1")
	if err != nil || got.State != StateCommitted || !reflect.DeepEqual(got.GPUs, c.GPUs) {
		t.Fatalf("after Commit: %+v, %v", got, err)
	}
	if err := writesOnce(t, l, "Release", func() error { _, err := l.Release("vm-1", t0); return err }); err != nil {
		t.Fatal(err)
	}
	if err := writesOnce(t, l, "Drain", func() error { return l.Drain("0000:9a:00.0", "fan", t0) }); err != nil {
		t.Fatal(err)
	}
	if err := writesOnce(t, l, "Undrain", func() error { return l.Undrain("0000:9a:00.0") }); err != nil {
		t.Fatal(err)
	}
	if got := fileRevision(t, l); got != l.Revision() {
		t.Fatalf("file holds revision %d, ledger %d", got, l.Revision())
	}
}

// TestFileWriteKeepsReservations: a write of the file (a commit, a drain)
// while other reservations are live keeps them, and they still count as
// taken for the next check-and-take.
func TestFileWriteKeepsReservations(t *testing.T) {
	l := newLedger(t)
	a := mustReserve(t, l, "vm-a", req(Item{Model: h100, Count: 4}), t0)
	mustReserve(t, l, "vm-b", req(Item{Model: h100, Count: 3}), t0)
	mustCommit(t, l, "vm-b", t0)
	if err := l.Drain("0000:61:00.0", "fan", t0); err != nil {
		t.Fatal(err)
	}
	if got, err := l.Get("vm-a"); err != nil || !reflect.DeepEqual(got, a) {
		t.Fatalf("reservation after two file writes: %+v, %v; want %+v", got, err, a)
	}
	// 8 H100: 4 reserved, 3 committed. One is left.
	if _, err := l.Reserve("vm-c", req(Item{Model: h100, Count: 2}), "c", t0, lease); !errors.Is(err, ErrNotAvailable) {
		t.Fatalf("Reserve of 2 H100 with 7 of 8 taken = %v, want ErrNotAvailable", err)
	}
	mustReserve(t, l, "vm-c", req(Item{Model: h100, Count: 1}), t0)
	if free := l.Free(t0); free[h100] != 0 || free[l40s] != 1 {
		t.Fatalf("Free = %v", free)
	}
	// A resize (a file write) cannot take the reserved GPUs either.
	if _, err := l.Resize("vm-b", req(Item{Model: h100, Count: 4}), t0); !errors.Is(err, ErrNotAvailable) {
		t.Fatalf("Resize onto reserved GPUs = %v, want ErrNotAvailable", err)
	}
}

// fileRevision reads the revision stored in l's file.
func fileRevision(t *testing.T, l *Ledger) uint64 {
	t.Helper()
	var rev uint64
	if err := l.view(func(tx recordReader) error {
		rev = binary.BigEndian.Uint64(tx.get(bucketMeta, keyRevision))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return rev
}

// olderLedgerFile makes a closed ledger file as an older gpuherd left it:
// committed claim vm-1, and reservations vm-2 (live at t0) and vm-3 (its
// lease ran out), written the way that gpuherd wrote them.
func olderLedgerFile(t *testing.T) (path string, rev uint64) {
	t.Helper()
	path = ledgerFile(t)
	rev = 41
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		claims := tx.Bucket(bucketClaims)
		if err := claims.Put([]byte("vm-2"), []byte(`{"id":"vm-2","state":"reserved","items":[{"model":"L40S","count":1}],"gpus":["0000:61:00.0"],"coordinator":"coord-9","created_at":"2025-03-01T12:00:00Z","expires_at":"2025-03-01T12:01:00Z","gpu_models":{"0000:61:00.0":"L40S"}}`)); err != nil {
			return err
		}
		if err := claims.Put([]byte("vm-3"), []byte(`{"id":"vm-3","state":"reserved","items":[{"model":"H100 80GB","count":1}],"gpus":["0000:9a:00.0"],"created_at":"2025-03-01T11:00:00Z","expires_at":"2025-03-01T11:01:00Z","gpu_models":{"0000:9a:00.0":"H100 80GB"}}`)); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keyRevision, encodeRevision(rev))
	})
	return path, rev
}

// fileClaimIDs lists the keys of the claims bucket of the closed file at path.
func fileClaimIDs(t *testing.T, path string) []string {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var ids []string
	err = db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketClaims).ForEach(func(k, _ []byte) error { ids = append(ids, string(k)); return nil })
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestOpenDropsReservationsOfAnOlderFile: a file written by an older
// gpuherd, which wrote reservations, opens without them, and they are gone
// from the file too, so no later Open sees them again.
func TestOpenDropsReservationsOfAnOlderFile(t *testing.T) {
	path, rev := olderLedgerFile(t)
	// Inspect reads the file as it is, reservations and all.
	rep, err := Inspect(path, 0)
	if err != nil || len(rep.Claims) != 3 || rep.Claims[1].State != StateReserved {
		t.Fatalf("Inspect of an older file = %+v, %v; want its 3 claims", rep, err)
	}

	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.List(); len(got) != 1 || got[0].ID != "vm-1" || got[0].State != StateCommitted {
		t.Fatalf("after Open of an older file List = %+v, want only committed vm-1", got)
	}
	if _, err := l.Commit("vm-2", t0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Commit of an older run's reservation = %v, want ErrNotFound", err)
	}
	if l.Revision() <= rev {
		t.Fatalf("revision %d after dropping reservations, want above %d", l.Revision(), rev)
	}
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	if st := stateOf(t, l, "0000:61:00.0"); st.Status != GPUFree {
		t.Fatalf("GPU of the dropped reservation: %+v, want free", st)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	// Gone from the file, not just hidden.
	if ids := fileClaimIDs(t, path); !reflect.DeepEqual(ids, []string{"vm-1"}) {
		t.Fatalf("claims in the file after Open = %v, want [vm-1]", ids)
	}
	rep, err = Inspect(path, 0)
	if err != nil || len(rep.Claims) != 1 || rep.Revision <= rev {
		t.Fatalf("Inspect after Open = %+v, %v", rep, err)
	}
	backup := filepath.Join(t.TempDir(), "backup.db")
	if rep, err := BackupFile(path, backup, 0); err != nil || len(rep.Claims) != 1 {
		t.Fatalf("BackupFile after Open = %+v, %v", rep, err)
	}

	// A second Open has nothing to drop and writes nothing.
	l = openAt(t, path)
	before, err := fileTxID(l)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.List(); len(got) != 1 || got[0].ID != "vm-1" {
		t.Fatalf("after a second Open: %+v", got)
	}
	if l.Revision() != rep.Revision {
		t.Fatalf("revision %d after a second Open, want %d as stored", l.Revision(), rep.Revision)
	}
	l.Close()
	l = openAt(t, path)
	if after, err := fileTxID(l); err != nil || after != before {
		t.Fatalf("Open of a file without reservations wrote it: transaction %d → %d (%v)", before, after, err)
	}
}

// TestDroppedAtOpen: the reservations Open removed are reported, once per
// Open, so that the agent can log them; a file of this gpuherd has none.
func TestDroppedAtOpen(t *testing.T) {
	path, _ := olderLedgerFile(t)
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	got := l.DroppedAtOpen()
	if len(got) != 2 || got[0].ID != "vm-2" || got[1].ID != "vm-3" ||
		got[0].Coordinator != "coord-9" || !reflect.DeepEqual(got[0].GPUs, []string{"0000:61:00.0"}) || got[0].State != StateReserved {
		t.Fatalf("DroppedAtOpen = %+v, want vm-2 and vm-3", got)
	}
	got[0].GPUs[0] = "changed"
	if again := l.DroppedAtOpen(); again[0].GPUs[0] != "0000:61:00.0" {
		t.Fatal("DroppedAtOpen returned the ledger's own slices")
	}
	l.Close()
	l = openAt(t, path)
	if got := l.DroppedAtOpen(); got != nil {
		t.Fatalf("DroppedAtOpen on the second Open = %+v, want nil", got)
	}
	fresh := newLedger(t)
	mustReserve(t, fresh, "vm-1", req(Item{Model: h100, Count: 1}), t0)
	if got := fresh.DroppedAtOpen(); got != nil {
		t.Fatalf("DroppedAtOpen of a new ledger = %+v", got)
	}
}
