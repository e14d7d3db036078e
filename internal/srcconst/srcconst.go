// Package srcconst reads a package's own source for its constants, for the
// tests that check a vocabulary defined in code against its table and its
// docs (error codes, exit codes).
package srcconst

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Const is one constant whose name matched.
type Const struct {
	Name string
	// Value is the string it stands for; Literal is false (and Value
	// empty) when it is not written as a string literal (an alias of
	// another constant, an expression, an implicit repetition).
	Value   string
	Literal bool
	// Pos is where it is declared, for messages.
	Pos string
}

// Find lists the constants of the non-test Go files in dir whose names
// match name, in the order of the files and their declarations.
func Find(dir string, name *regexp.Regexp) ([]Const, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	var out []Const
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
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
					c := Const{Name: id.Name, Pos: fset.Position(id.Pos()).String()}
					if i < len(vs.Values) {
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							c.Value, _ = strconv.Unquote(lit.Value)
							c.Literal = true
						}
					}
					out = append(out, c)
				}
			}
		}
	}
	return out, nil
}
