package ledger

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// t0 is the tests' epoch; the ledger has no clock, so time is whatever the
// test says it is.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

const (
	h100 = "H100 80GB"
	l40s = "L40S"
	// lease is the reservation lease most tests use.
	lease = time.Minute
)

// server is a small two-socket server: four H100 on each NUMA node and two
// L40S on node 0.
func server() []GPU {
	return []GPU{
		{Address: "0000:18:00.0", Model: h100, NUMANode: 0, Healthy: true},
		{Address: "0000:2a:00.0", Model: h100, NUMANode: 0, Healthy: true},
		{Address: "0000:3a:00.0", Model: h100, NUMANode: 0, Healthy: true},
		{Address: "0000:5d:00.0", Model: h100, NUMANode: 0, Healthy: true},
		{Address: "0000:9a:00.0", Model: h100, NUMANode: 1, Healthy: true},
		{Address: "0000:ab:00.0", Model: h100, NUMANode: 1, Healthy: true},
		{Address: "0000:ba:00.0", Model: h100, NUMANode: 1, Healthy: true},
		{Address: "0000:db:00.0", Model: h100, NUMANode: 1, Healthy: true},
		{Address: "0000:61:00.0", Model: l40s, NUMANode: 0, Healthy: true},
		{Address: "0000:62:00.0", Model: l40s, NUMANode: 0, Healthy: true},
	}
}

// openAt opens the ledger at path and closes it when the test ends.
func openAt(t testing.TB, path string, opts ...Option) *Ledger {
	t.Helper()
	l, err := Open(path, opts...)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// newLedger opens a fresh ledger on server().
func newLedger(t testing.TB, opts ...Option) *Ledger {
	t.Helper()
	l := openAt(t, filepath.Join(t.TempDir(), "ledger.db"), opts...)
	if err := l.SetInventory(server()); err != nil {
		t.Fatalf("SetInventory: %v", err)
	}
	return l
}

func req(items ...Item) Request { return Request{Items: items} }

func mustReserve(t testing.TB, l *Ledger, id string, r Request, now time.Time) Claim {
	t.Helper()
	c, err := l.Reserve(id, r, "coord-1", now, lease)
	if err != nil {
		t.Fatalf("Reserve(%s): %v", id, err)
	}
	return c
}

func mustCommit(t testing.TB, l *Ledger, id string, now time.Time) Claim {
	t.Helper()
	c, err := l.Commit(id, now)
	if err != nil {
		t.Fatalf("Commit(%s): %v", id, err)
	}
	return c
}

// ledgerFiles reads the ledger file at path and its journal: what a
// process killed at that instant leaves on disk.
func ledgerFiles(t testing.TB, path string) (file, journal []byte) {
	t.Helper()
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	journal, err = os.ReadFile(JournalPath(path))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return file, journal
}

// writeLedgerFiles writes what ledgerFiles read to a ledger at path.
func writeLedgerFiles(t testing.TB, path string, file, journal []byte) {
	t.Helper()
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	if journal != nil {
		if err := os.WriteFile(JournalPath(path), journal, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
