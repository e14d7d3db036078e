package packaging_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runScript runs a maintainer script with its absolute paths moved under
// root, so that it acts on a test tree instead of this machine.
func runScript(t *testing.T, script, root string, args ...string) string {
	t.Helper()
	data, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	// /run/ covers systemd's directory and libvirtd's pid file: nothing here
	// may reach a daemon of this machine.
	for _, p := range []string{"/var/lib/gpuherd", "/etc/gpuherd", "/etc/systemd/", "/run/"} {
		text = strings.ReplaceAll(text, p, root+p)
	}
	path := filepath.Join(root, filepath.Base(script))
	if err := os.WriteFile(path, []byte(text), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("sh", append([]string{path}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", script, args, err, out)
	}
	return string(out)
}

// TestPurgeKeepsLedgerAndKeys: purging the deb, or erasing the rpm, never
// deletes the claims ledger or the operator's keys, and says where they
// stay; with nothing of the operator's left it leaves no directory behind.
func TestPurgeKeepsLedgerAndKeys(t *testing.T) {
	for _, tc := range []struct {
		script string
		args   []string
	}{
		{"scripts/deb/postrm", []string{"purge"}},
		{"scripts/rpm/postun", []string{"0"}},
	} {
		t.Run(tc.script, func(t *testing.T) {
			root := t.TempDir()
			ledger := filepath.Join(root, "var/lib/gpuherd/ledger.db")
			key := filepath.Join(root, "etc/gpuherd/tls/node.key")
			for _, f := range []string{ledger, key} {
				if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			out := runScript(t, tc.script, root, tc.args...)
			for _, f := range []string{ledger, key} {
				if _, err := os.Stat(f); err != nil {
					t.Errorf("%s deleted %s: %v", tc.script, f, err)
				}
			}
			for _, dir := range []string{"/var/lib/gpuherd", "/etc/gpuherd"} {
				if !strings.Contains(out, "kept "+root+dir) {
					t.Errorf("%s does not say that %s stays:\n%s", tc.script, dir, out)
				}
			}
			t.Logf("%s %v:\n%s", tc.script, tc.args, out)

			// Nothing of the operator's: nothing left, nothing said.
			empty := t.TempDir()
			for _, d := range []string{"var/lib/gpuherd", "etc/gpuherd"} {
				if err := os.MkdirAll(filepath.Join(empty, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if out := runScript(t, tc.script, empty, tc.args...); strings.Contains(out, "kept") {
				t.Errorf("%s with empty directories says %q", tc.script, out)
			}
			for _, d := range []string{"var/lib/gpuherd", "etc/gpuherd"} {
				if _, err := os.Stat(filepath.Join(empty, d)); err == nil {
					t.Errorf("%s left an empty %s", tc.script, d)
				}
			}
		})
	}
}
