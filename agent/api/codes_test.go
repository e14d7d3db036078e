package api_test

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/internal/srcconst"
)

// Every Code… constant of the package is a row of the error-code table,
// once, and docs/protocol.md's "Error codes" lists exactly the table's rows:
// code, HTTP status and meaning. A code added without its row, or its row
// without the documentation's, fails here.
func TestEveryErrorCodeIsInTheTableAndTheDocs(t *testing.T) {
	rows := api.ErrorCodes()
	inTable := map[string]bool{}
	var want []string
	for _, c := range rows {
		if inTable[c.Code] {
			t.Errorf("%s has two rows in the error-code table", c.Code)
		}
		inTable[c.Code] = true
		if c.Meaning == "" || strings.Contains(c.Meaning, "|") {
			t.Errorf("%s: the meaning %q is empty or breaks the documentation's table", c.Code, c.Meaning)
		}
		want = append(want, fmt.Sprintf("| `%s` | %d | %s |", c.Code, c.Status, c.Meaning))
	}
	consts := codeConstants(t)
	if len(consts) == 0 {
		t.Fatal("no Code… constant found in the package's files")
	}
	for name, value := range consts {
		if !inTable[value] {
			t.Errorf("%s (%q) has no row in the error-code table (codes.go)", name, value)
		}
	}

	doc, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	got := docRows(string(doc), "## Error codes")
	if got == nil {
		t.Fatal("docs/protocol.md has no \"## Error codes\" table")
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("docs/protocol.md's error codes lack the row\n%s", w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			t.Errorf("docs/protocol.md's error codes have a row the table does not:\n%s", g)
		}
	}
	if !t.Failed() && !slices.Equal(got, want) {
		t.Errorf("docs/protocol.md lists the error codes in another order than the table; want\n%s", strings.Join(want, "\n"))
	}
}

// codeConstants reads the package's own files for its error codes: every
// constant named Code… and the string it stands for.
func codeConstants(t *testing.T) map[string]string {
	t.Helper()
	found, err := srcconst.Find(".", regexp.MustCompile(`^Code[A-Z]`))
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{}
	for _, c := range found {
		if !c.Literal {
			t.Errorf("%s: %s is not a string literal; write the code out", c.Pos, c.Name)
			continue
		}
		consts[c.Name] = c.Value
	}
	return consts
}

// docRows is the rows of the first table under heading in a Markdown
// document (not its header and separator); nil when there is none.
func docRows(doc, heading string) []string {
	_, after, ok := strings.Cut(doc, "\n"+heading+"\n")
	if !ok {
		return nil
	}
	if end := strings.Index(after, "\n## "); end >= 0 {
		after = after[:end]
	}
	var rows []string
	inTable := false
	for line := range strings.SplitSeq(after, "\n") {
		switch {
		case strings.HasPrefix(line, "|"):
			if inTable && !strings.HasPrefix(line, "|---") {
				rows = append(rows, line)
			}
			inTable = true // the header is not a row
		case inTable:
			return rows
		}
	}
	return rows
}
