package api_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
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
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`^Code[A-Z]`)
	consts := map[string]string{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !name.MatchString(id.Name) {
						continue
					}
					lit, ok := valueAt(vs, i).(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Errorf("%s: %s is not a string literal; write the code out", fset.Position(id.Pos()), id.Name)
						continue
					}
					consts[id.Name], _ = strconv.Unquote(lit.Value)
				}
			}
		}
	}
	return consts
}

func valueAt(vs *ast.ValueSpec, i int) ast.Expr {
	if i < len(vs.Values) {
		return vs.Values[i]
	}
	return nil
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
