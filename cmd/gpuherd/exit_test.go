package main

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/internal/srcconst"
)

// The peer API's refusals of who a caller is reach a script as plain
// errors: neither a usage error nor anything a retry could fix.
func TestExitCodeOfRefusedIdentity(t *testing.T) {
	for code, want := range map[string]int{
		api.CodeForbidden:   exitError,
		api.CodeLimit:       exitError,
		api.CodeUnavailable: exitUnavailable,
		api.CodeConflict:    exitConflict,
	} {
		err := fmt.Errorf("claim vm-1: %w", &api.Error{Code: code, Message: "m"})
		if got := exitCode(err); got != want {
			t.Errorf("exitCode(%s) = %d, want %d", code, got, want)
		}
	}
}

// Every error code, the API's (api.ErrorCodes) and the CLI's own (the
// code… constants of this package), ends in exactly one exit class, by a
// row of exitClasses: none reaches exit 1 by falling through. A code added
// to either without its place here fails.
func TestEveryErrorCodeHasItsExitCode(t *testing.T) {
	known := map[string]bool{}
	for _, c := range api.ErrorCodes() {
		known[c.Code] = true
	}
	for name, value := range cliCodes(t) {
		if known[value] {
			t.Errorf("%s is %q, an API error code too", name, value)
		}
		known[value] = true
	}
	classOf := map[string]int{}
	for i, c := range exitClasses {
		if c.code != i {
			t.Errorf("exitClasses[%d] is exit %d: the table lists every exit code once, in order", i, c.code)
		}
		for _, code := range c.codes {
			if prev, dup := classOf[code]; dup {
				t.Errorf("%s is in exit %d and in exit %d", code, prev, c.code)
			}
			classOf[code] = c.code
			if !known[code] {
				t.Errorf("exit %d lists %q, which is neither an API error code nor one of the CLI's", c.code, code)
			}
		}
	}
	for code := range known {
		if _, ok := classOf[code]; !ok {
			t.Errorf("error code %q has no exit code: add it to a row of exitClasses (exit.go)", code)
		}
	}
	for _, c := range api.ErrorCodes() {
		err := fmt.Errorf("claim vm-1: %w", &api.Error{Code: c.Code, Message: "m"})
		if want, ok := classOf[c.Code]; ok && exitCode(err) != want {
			t.Errorf("exitCode(%s) = %d, want %d", c.Code, exitCode(err), want)
		}
	}
	if got := exitCode(&api.Error{Code: "a_code_of_a_newer_agent"}); got != exitError {
		t.Errorf("an unknown code exits %d, want %d", got, exitError)
	}
}

// The README's exit code table lists exactly the exit classes: each code,
// its meaning starting with the class's name, and the error codes that end
// in it.
func TestREADMEListsTheExitCodes(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const header = "| code | meaning | API error codes |"
	_, table, ok := strings.Cut(string(readme), "\n"+header+"\n")
	if !ok {
		t.Fatalf("README.md has no exit code table (a line %q)", header)
	}
	var rows [][]string
	for line := range strings.SplitSeq(table, "\n") {
		if !strings.HasPrefix(line, "|") {
			break
		}
		if strings.HasPrefix(line, "|---") {
			continue
		}
		cells := strings.Split(strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|"), "|")
		if len(cells) != 3 {
			t.Fatalf("README.md's exit code table: %d cells in %q, want 3", len(cells), line)
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	if len(rows) != len(exitClasses) {
		t.Errorf("README.md lists %d exit codes, exitClasses %d", len(rows), len(exitClasses))
	}
	backticked := regexp.MustCompile("`([^`]*)`")
	for i, c := range exitClasses {
		if i >= len(rows) {
			t.Errorf("README.md does not list exit %d (%s)", c.code, c.name)
			continue
		}
		row := rows[i]
		if row[0] != strconv.Itoa(c.code) {
			t.Errorf("README.md's exit code row %d is %q, want %d", i+1, row[0], c.code)
		}
		if !regexp.MustCompile(`^` + regexp.QuoteMeta(c.name) + `($|[:,])`).MatchString(row[1]) {
			t.Errorf("README.md's exit %s: the meaning %q does not begin with %q", row[0], row[1], c.name)
		}
		var listed []string
		for _, m := range backticked.FindAllStringSubmatch(row[2], -1) {
			listed = append(listed, m[1])
		}
		want := slices.Clone(c.codes)
		slices.Sort(listed)
		slices.Sort(want)
		if !slices.Equal(listed, want) {
			t.Errorf("README.md's exit %s lists the error codes %q, want %q", row[0], listed, want)
		}
	}
}

// cliCodes reads this package's files for the CLI's own error codes: the
// code… constants with a string of their own (not an api.Code… alias).
func cliCodes(t *testing.T) map[string]string {
	t.Helper()
	found, err := srcconst.Find(".", regexp.MustCompile(`^code[A-Z]`))
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]string{}
	for _, c := range found {
		if c.Literal {
			codes[c.Name] = c.Value
		}
	}
	if len(codes) == 0 {
		t.Fatal("no code… constant found in the package's files")
	}
	return codes
}
