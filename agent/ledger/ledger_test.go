package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func TestOpenCreatesPrivateFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l := openAt(t, path)
	if l.Path() != path {
		t.Fatalf("Path = %q", l.Path())
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600: the ledger says who holds what", fi.Mode().Perm())
	}
	if l.Revision() != 0 || len(l.List()) != 0 || len(l.GPUStates(t0)) != 0 {
		t.Fatal("a new ledger is not empty")
	}
}

func TestPersistence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 2}), t0)
	committed := mustCommit(t, l, "vm-1", t0)
	reserved := mustReserve(t, l, "vm-2", Request{Items: []Item{{Model: l40s, Count: 1}}, Labels: map[string]string{"k": "v"}}, t0)
	if err := l.Drain("0000:db:00.0", "ECC errors", t0); err != nil {
		t.Fatal(err)
	}
	if err := l.PutFacts("0000:18:00.0", []byte(`{"uuid":"GPU-1"}`)); err != nil {
		t.Fatal(err)
	}
	rev := l.Revision()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l = openAt(t, path)
	// The drain was the last change, and it wrote the file: the revision
	// carries on from there.
	if l.Revision() != rev {
		t.Fatalf("revision after reopen = %d, want %d", l.Revision(), rev)
	}
	// The committed claim survives; the reservation does not.
	want := []Claim{committed}
	if got := l.List(); !reflect.DeepEqual(got, want) {
		t.Fatalf("after reopen List = %+v\nwant %+v", got, want)
	}
	facts, err := l.Facts()
	if err != nil || string(facts["0000:18:00.0"]) != `{"uuid":"GPU-1"}` {
		t.Fatalf("Facts after reopen = %q, %v", facts, err)
	}
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	st := stateOf(t, l, "0000:db:00.0")
	if st.Status != GPUDrained || st.DrainReason != "ECC errors" || !st.DrainedAt.Equal(t0) {
		t.Fatalf("drain after reopen: %+v", st)
	}
	// Well within its lease, the reservation is gone: its coordinator
	// cannot commit it, and its GPU is free.
	if _, err := l.Commit("vm-2", t0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Commit of a reservation made before the reopen = %v, want ErrNotFound", err)
	}
	if st := stateOf(t, l, reserved.GPUs[0]); st.Status != GPUFree {
		t.Fatalf("GPU of the reservation after reopen: %+v, want free", st)
	}
}

// TestReservationsDoNotSurviveReopen: a reservation lives in memory only, a
// committed claim in the file. After Close and Open the committed claim is
// there with its GPUs, the reservation is not (not even within its lease),
// its GPUs can be reserved again, and committing it finds nothing.
func TestReservationsDoNotSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 1}), t0)
	committed := mustCommit(t, l, "vm-1", t0)
	reserved := mustReserve(t, l, "vm-2", req(Item{Model: l40s, Count: 2}), t0)
	extended, err := l.Extend("vm-2", t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l = openAt(t, path)
	if got := l.List(); !reflect.DeepEqual(got, []Claim{committed}) {
		t.Fatalf("after reopen List = %+v\nwant only the committed claim %+v", got, committed)
	}
	if _, err := l.Get("vm-2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a reservation after reopen = %v, want ErrNotFound", err)
	}
	// Within the lease it had (extended to an hour): still nothing to commit.
	if _, err := l.Commit("vm-2", extended.ExpiresAt.Add(-time.Minute)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Commit after reopen = %v, want ErrNotFound", err)
	}
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	// Its GPUs are free again; the committed claim's are not.
	again := mustReserve(t, l, "vm-3", req(Item{Model: l40s, Count: 2}), t0)
	if !reflect.DeepEqual(again.GPUs, reserved.GPUs) {
		t.Fatalf("vm-3 got %v, want the GPUs the dropped reservation held, %v", again.GPUs, reserved.GPUs)
	}
	if st := stateOf(t, l, committed.GPUs[0]); st.Status != GPUClaimed || st.ClaimID != "vm-1" {
		t.Fatalf("GPU of the committed claim after reopen: %+v", st)
	}
	if _, err := l.Reserve("vm-4", req(Item{Model: h100, Count: 8}), "c", t0, lease); !errors.Is(err, ErrNotAvailable) {
		t.Fatalf("Reserve of all 8 H100 while one is committed = %v, want ErrNotAvailable", err)
	}
}

func TestOpenLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	openAt(t, path)
	_, err := Open(path, WithLockTimeout(100*time.Millisecond))
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	for _, s := range []string{path, "is locked by another process", "another gpuherd agent"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("message %q lacks %q", err, s)
		}
	}
}

// rawUpdate changes the file behind the ledger's back, as a bug, a newer
// gpuherd or a disk would.
func rawUpdate(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
}

// ledgerFile makes a closed ledger holding one committed claim.
func ledgerFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.db")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 1}), t0)
	mustCommit(t, l, "vm-1", t0)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// openMustFail opens path, expects an error and checks that the file was
// left byte for byte as it was.
func openMustFail(t *testing.T, path string) error {
	t.Helper()
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Open(path)
	if err == nil {
		l.Close()
		t.Fatal("Open succeeded")
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Fatal("a failed Open changed the file")
	}
	return err
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	path := ledgerFile(t)
	rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySchema, []byte("3")) })
	err := openMustFail(t, path)
	if !errors.Is(err, ErrSchemaTooNew) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "schema 3") {
		t.Fatalf("Open = %v, want ErrSchemaTooNew naming the file and schema 3", err)
	}
}

func TestOpenRefusesCorruptRecords(t *testing.T) {
	tests := []struct {
		name   string
		bucket []byte
		key    string
		value  []byte
	}{
		{"not JSON", bucketClaims, "vm-1", []byte("{garbage")},
		{"wrong key", bucketClaims, "vm-2", mustJSON(t, claimRecord{Claim: Claim{ID: "vm-1", State: StateCommitted, GPUs: []string{"0000:18:00.0"}}})},
		{"unknown state", bucketClaims, "vm-3", mustJSON(t, claimRecord{Claim: Claim{ID: "vm-3", State: "limbo", GPUs: []string{"0000:18:00.0"}}})},
		{"reservation without deadline", bucketClaims, "vm-4", mustJSON(t, claimRecord{Claim: Claim{ID: "vm-4", State: StateReserved, GPUs: []string{"0000:18:00.0"}}})},
		{"no GPUs", bucketClaims, "vm-5", mustJSON(t, claimRecord{Claim: Claim{ID: "vm-5", State: StateCommitted}})},
		{"bad drain", bucketDrains, "0000:18:00.0", []byte("[]")},
		{"bad schema", bucketMeta, "schema", []byte("one")},
		{"bad revision", bucketMeta, "revision", []byte{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := ledgerFile(t)
			rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(tt.bucket).Put([]byte(tt.key), tt.value) })
			err := openMustFail(t, path)
			var ce *CorruptError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open = %v, want *CorruptError", err)
			}
			if ce.Path != path || ce.Bucket != string(tt.bucket) || ce.Key != tt.key {
				t.Fatalf("CorruptError names %s %s/%s, want %s %s/%s", ce.Path, ce.Bucket, ce.Key, path, tt.bucket, tt.key)
			}
			for _, s := range []string{path, tt.key, "not changed"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("message %q lacks %q", err, s)
				}
			}
		})
	}
}

func TestOpenRefusesMissingBucket(t *testing.T) {
	path := ledgerFile(t)
	rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketClaims) })
	var ce *CorruptError
	if err := openMustFail(t, path); !errors.As(err, &ce) || ce.Bucket != "claims" {
		t.Fatalf("Open without the claims bucket = %v, want *CorruptError on claims", err)
	}
}

func TestOpenRefusesForeignBoltFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "other.db")
	rawUpdate(t, path, func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("vault")); return err })
	err := openMustFail(t, path)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "not a gpuherd ledger") {
		t.Fatalf("Open = %v, want ErrCorrupt saying it is not a ledger", err)
	}
}

func TestOpenRefusesGarbageFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	if err := os.WriteFile(path, bytes.Repeat([]byte("not a database "), 2048), 0o600); err != nil {
		t.Fatal(err)
	}
	err := openMustFail(t, path)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open = %v, want ErrCorrupt naming the file", err)
	}
}

func TestOpenMissingDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope", "ledger.db")
	_, err := Open(path)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open = %v, want an error naming %s", err, path)
	}
}

func TestFacts(t *testing.T) {
	l := newLedger(t)
	rev := l.Revision()
	if err := l.PutFacts("0000:18:00.0", []byte(`{"serial":"1"}`)); err != nil {
		t.Fatal(err)
	}
	if err := l.PutFacts("0000:2a:00.0", []byte(`{"serial":"2"}`)); err != nil {
		t.Fatal(err)
	}
	if err := l.PutFacts("0000:18:00.0", []byte(`{"serial":"1b"}`)); err != nil {
		t.Fatal(err)
	}
	got, err := l.Facts()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{"0000:18:00.0": []byte(`{"serial":"1b"}`), "0000:2a:00.0": []byte(`{"serial":"2"}`)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Facts = %q, want %q", got, want)
	}
	if l.Revision() != rev {
		t.Fatal("facts moved the revision")
	}
	if err := l.PutFacts("0000:18:00.0", []byte(`{`)); err == nil || !strings.Contains(err.Error(), "0000:18:00.0") {
		t.Fatalf("PutFacts(bad JSON) = %v, want an error naming the GPU", err)
	}
	if err := l.PutFacts("../x", []byte(`{}`)); err == nil {
		t.Fatal("PutFacts accepted a bad address")
	}
	if err := l.PutFacts("0000:18:00.0", bytes.Repeat([]byte(" "), MaxFactsLen+1)); err == nil {
		t.Fatal("PutFacts accepted an oversized blob")
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
