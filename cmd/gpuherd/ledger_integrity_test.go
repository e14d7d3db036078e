package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/gpuherd/gpuherd/agent/ledger"
)

const (
	gpu, model = "0000:18:00.0", "NVIDIA H100 80GB"
)

var now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// ledgerWithVM1 opens a ledger at path with one GPU, gpu, claimed by vm-1.
func ledgerWithVM1(t *testing.T, path string) *ledger.Ledger {
	t.Helper()
	l, err := ledger.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetInventory([]ledger.GPU{{Address: gpu, Model: model, Healthy: true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Reserve("vm-1", ledger.Request{Items: []ledger.Item{{Model: model, Count: 1}}}, "", now, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Commit("vm-1", now); err != nil {
		t.Fatal(err)
	}
	return l
}

// `ledger check` lists every problem of a ledger the agent refuses (issue
// 11, "Ledger integrity") and exits 1; `ledger remove-claim` repairs it.
func TestLedgerCheckListsProblemsAndRemoveClaimRepairs(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ledger.db")
	l := ledgerWithVM1(t, path)
	l.Close()

	// A second claim on the same GPU, and one on a GPU without a model.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for id, addr := range map[string]string{"vm-2": gpu, "vm-3": "0000:9a:00.0"} {
			rec := map[string]any{"id": id, "state": "committed", "items": []ledger.Item{{Model: model, Count: 1}},
				"gpus": []string{addr}, "created_at": now, "gpu_models": map[string]string{gpu: model}}
			v, _ := json.Marshal(rec)
			if err := tx.Bucket([]byte("claims")).Put([]byte(id), v); err != nil {
				return err
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	code, out := runLedger(t, "check", "--data-dir", dir)
	for _, s := range []string{"2 problem(s)", "claims/vm-2", "which claim vm-1 holds too", "claims/vm-3", "0000:9a:00.0", "does not hold", "remove-claim"} {
		if !strings.Contains(out, s) {
			t.Errorf("check output lacks %q", s)
		}
	}
	if code != exitError {
		t.Errorf("check of a contradictory ledger: exit %d, want 1\n%s", code, out)
	}
	if code, out := runLedger(t, "remove-claim", "vm-9", "--data-dir", dir); code != exitNotFound {
		t.Errorf("remove-claim of an unknown claim: exit %d, want 4\n%s", code, out)
	}
	for _, id := range []string{"vm-2", "vm-3"} {
		if code, out := runLedger(t, "remove-claim", id, "--data-dir", dir); code != 0 || !strings.Contains(out, "removed claim "+id) {
			t.Fatalf("remove-claim %s: exit %d\n%s", id, code, out)
		}
	}
	if code, out := runLedger(t, "check", "--data-dir", dir); code != 0 || !strings.Contains(out, "vm-1") || strings.Contains(out, "vm-2") {
		t.Fatalf("check after the repair: exit %d\n%s", code, out)
	}
}

// `ledger check` of an agent killed with writes in its journal shows
// them, says so, and writes nothing; `ledger backup` copies them into a
// ledger that needs no journal.
func TestLedgerCheckAndBackupIncludeTheJournal(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ledger.db")
	l := ledgerWithVM1(t, path)
	if err := l.Abandon(); err != nil { // kill -9
		t.Fatal(err)
	}
	code, out := runLedger(t, "check", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "vm-1") || !strings.Contains(out, "journal: 1 writes not yet in the file") {
		t.Fatalf("check of a killed agent's ledger: exit %d\n%s", code, out)
	}
	backup := filepath.Join(t.TempDir(), "backup.db")
	if code, out := runLedger(t, "backup", "--data-dir", dir, "--out", backup); code != 0 {
		t.Fatalf("backup: exit %d\n%s", code, out)
	}
	if code, out := runLedger(t, "check", "--file", backup); code != 0 || !strings.Contains(out, "vm-1") || strings.Contains(out, "journal:") {
		t.Fatalf("check of the backup: exit %d\n%s", code, out)
	}
}
