package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/ledger"
)

// runLedger runs `gpuherd ledger ARGS` (the command is wired into the root
// by main.go; here it runs on its own) and returns the exit code and output.
func runLedger(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	g := &globals{stdout: &out, stderr: &out, output: "table"}
	cmd := newLedgerCmd(g)
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		out.WriteString("gpuherd: " + err.Error() + "\n")
		return exitCode(err), out.String()
	}
	return 0, out.String()
}

func TestLedgerCheckAndBackup(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ledger.db")
	l, err := ledger.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetInventory([]ledger.GPU{{Address: "0000:18:00.0", Model: "NVIDIA H100 80GB", Healthy: true}}); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if _, err := l.Reserve("vm-1", ledger.Request{Items: []ledger.Item{{Model: "NVIDIA H100 80GB", Count: 1}}}, "", now, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Commit("vm-1", now); err != nil {
		t.Fatal(err)
	}

	// While the agent (here: the open ledger) holds the file.
	code, out := runLedger(t, "check", "--data-dir", dir, "--lock-wait", "50ms")
	if code != exitError || !strings.Contains(out, "stop the agent") {
		t.Fatalf("check of a held ledger: exit %d\n%s", code, out)
	}
	l.Close()

	code, out = runLedger(t, "check", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "vm-1") || !strings.Contains(out, "committed") || !strings.Contains(out, "0000:18:00.0") {
		t.Fatalf("check: exit %d\n%s", code, out)
	}
	backup := filepath.Join(t.TempDir(), "ledger-backup.db")
	code, out = runLedger(t, "backup", "--data-dir", dir, "--out", backup)
	if code != 0 || !strings.Contains(out, "1 claims") {
		t.Fatalf("backup: exit %d\n%s", code, out)
	}
	if code, out := runLedger(t, "check", "--file", backup); code != 0 || !strings.Contains(out, "vm-1") {
		t.Fatalf("check of the backup: exit %d\n%s", code, out)
	}
	if code, _ := runLedger(t, "backup", "--data-dir", dir); code != exitUsage {
		t.Fatalf("backup without --out: exit %d, want 2", code)
	}

	// Damage: the exact problem, exit 1, and the file untouched.
	if err := os.Truncate(path, 8192); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	code, out = runLedger(t, "check", "--data-dir", dir)
	if code != exitError || !strings.Contains(out, path) || !strings.Contains(out, "truncated") {
		t.Fatalf("check of a truncated ledger: exit %d\n%s", code, out)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("check changed the file")
	}
	if code, out := runLedger(t, "backup", "--data-dir", dir, "--out", filepath.Join(dir, "x.db")); code != exitError || !strings.Contains(out, "truncated") {
		t.Fatalf("backup of a truncated ledger: exit %d\n%s", code, out)
	}
}
