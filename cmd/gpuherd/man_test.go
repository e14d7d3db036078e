package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestManPages: `gpuherd man` writes a page for every command a user can
// run, each carrying that command's own help, and none for hidden ones.
func TestManPages(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("SOURCE_DATE_EPOCH", "1767225600") // 2026-01-01: reproducible
	ok(t, "/nonexistent.sock", "man", "--dir", dir)

	root := newRoot(nil, nil)
	var pages int
	var walk func(prefix string, cmds []*cobra.Command)
	walk = func(prefix string, cmds []*cobra.Command) {
		for _, c := range cmds {
			if !c.IsAvailableCommand() || c.IsAdditionalHelpTopicCommand() {
				continue
			}
			name := prefix + "-" + c.Name()
			data, err := os.ReadFile(filepath.Join(dir, name+".1"))
			if err != nil {
				t.Errorf("no man page for %q: %v", strings.ReplaceAll(name, "-", " "), err)
				continue
			}
			pages++
			text := string(data)
			if !strings.Contains(text, ".TH \""+strings.ToUpper(name)+"\" \"1\" \"Jan 2026\"") {
				t.Errorf("%s.1: no .TH header dated Jan 2026:\n%.200s", name, text)
			}
			if first := strings.Fields(c.Short)[0]; !strings.Contains(text, first) {
				t.Errorf("%s.1 does not carry the command's help (%q)", name, c.Short)
			}
			walk(name, c.Commands())
		}
	}
	walk("gpuherd", root.Commands())
	if _, err := os.Stat(filepath.Join(dir, "gpuherd.1")); err != nil {
		t.Errorf("no gpuherd.1: %v", err)
	}
	for _, hidden := range []string{"gpuherd-man.1"} {
		if _, err := os.Stat(filepath.Join(dir, hidden)); err == nil {
			t.Errorf("%s written for a hidden command", hidden)
		}
	}
	claim, _ := os.ReadFile(filepath.Join(dir, "gpuherd-claim.1"))
	if !strings.Contains(string(claim), "one server of the cluster") {
		t.Errorf("gpuherd-claim.1 does not say the GPUs are taken on one server of the cluster")
	}
	root1, _ := os.ReadFile(filepath.Join(dir, "gpuherd.1"))
	words := strings.Join(strings.Fields(string(root1)), " ")
	for _, c := range exitClasses {
		if code := fmt.Sprintf("%d %s", c.code, c.name); !strings.Contains(words, code) {
			t.Errorf("gpuherd.1 does not document exit code %q", code)
		}
	}
	if r := gpuherd(t, "/nonexistent.sock", "man"); r.code != exitUsage {
		t.Errorf("man without --dir: %s, want exit 2", r)
	}
	t.Logf("%d man pages, one per command", pages+1)
}
