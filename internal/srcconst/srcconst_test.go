package srcconst

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

func TestFindReadsStringConstants(t *testing.T) {
	dir := t.TempDir()
	src := `package p

import "other"

const (
	CodeA = "a"
	CodeB = other.CodeB
	notCode = "x"
)

const CodeC = "c"
`
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "p_test.go"), []byte("package p\n\nconst CodeT = \"t\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Find(dir, regexp.MustCompile(`^Code[A-Z]`))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("found %+v, want CodeA, CodeB and CodeC", got)
	}
	if got[0].Name != "CodeA" || got[0].Value != "a" || !got[0].Literal {
		t.Errorf("CodeA: %+v", got[0])
	}
	if got[1].Name != "CodeB" || got[1].Literal {
		t.Errorf("CodeB, an alias: %+v", got[1])
	}
	if got[2].Name != "CodeC" || got[2].Value != "c" {
		t.Errorf("CodeC: %+v", got[2])
	}
}
