package gossip

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func key(b byte, n int) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, n))
}

func writeKeyFile(t *testing.T, mode os.FileMode, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gossip.key")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // umask may have trimmed it
		t.Fatal(err)
	}
	return path
}

func TestLoadKeyringFirstKeyIsPrimary(t *testing.T) {
	path := writeKeyFile(t, 0o600,
		"# rotation in progress: new key first, old key kept for decrypting",
		"",
		"  "+key(2, 32)+"  ",
		key(1, 16),
		"# comment",
		key(3, 24),
	)
	kr, err := LoadKeyring(path)
	if err != nil {
		t.Fatal(err)
	}
	keys := kr.GetKeys()
	if len(keys) != 3 {
		t.Fatalf("%d keys loaded, want 3", len(keys))
	}
	if !bytes.Equal(kr.GetPrimaryKey(), bytes.Repeat([]byte{2}, 32)) {
		t.Error("the primary key is not the first key of the file")
	}
}

func TestLoadKeyringRefuses(t *testing.T) {
	tests := []struct {
		name  string
		mode  os.FileMode
		lines []string
		want  []string
	}{
		{"readable by others", 0o644, []string{key(1, 32)}, []string{"0644", "chmod 600"}},
		{"readable by group", 0o640, []string{key(1, 32)}, []string{"0640"}},
		{"no key", 0o600, []string{"# nothing yet"}, []string{"holds no key"}},
		{"not base64", 0o600, []string{key(1, 32), "not-a-key!"}, []string{"line 2", "base64"}},
		{"wrong size", 0o600, []string{"# c", key(1, 20)}, []string{"line 2", "20 bytes", "16, 24 or 32"}},
		{"duplicate", 0o400, []string{key(1, 32), key(1, 32)}, []string{"line 2", "earlier line"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeKeyFile(t, tt.mode, tt.lines...)
			_, err := LoadKeyring(path)
			if err == nil {
				t.Fatal("loaded, want an error")
			}
			for _, w := range append(tt.want, path) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestLoadKeyringMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent.key")
	if _, err := LoadKeyring(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("error %v does not name the missing file", err)
	}
}

func TestGenerateKey(t *testing.T) {
	a, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	b, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := base64.StdEncoding.DecodeString(a)
	if err != nil || len(raw) != 32 {
		t.Fatalf("GenerateKey() = %q: %d bytes, %v; want 32 bytes of base64", a, len(raw), err)
	}
	if a == b {
		t.Error("two generated keys are equal")
	}
	if _, err := LoadKeyring(writeKeyFile(t, 0o600, a)); err != nil {
		t.Errorf("a generated key does not load: %v", err)
	}
}
