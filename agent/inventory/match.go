package inventory

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// UnknownModelError is returned when a model name matches nothing.
type UnknownModelError struct {
	Query string   // what the user typed
	Known []string // the names it was matched against, sorted
}

func (e *UnknownModelError) Error() string {
	known := "the catalog is empty"
	if len(e.Known) > 0 {
		known = "known: " + strings.Join(e.Known, ", ")
	}
	if normalize(e.Query) == "" {
		return fmt.Sprintf("no GPU model given (%s)", known)
	}
	return fmt.Sprintf("unknown GPU model %s (%s)", quoteShort(e.Query), known)
}

// AmbiguousModelError is returned when a model name is a prefix of several
// models and none of them exactly.
type AmbiguousModelError struct {
	Query      string   // what the user typed
	Candidates []string // the models it could mean, sorted
	Known      []string // the names it was matched against, sorted
}

func (e *AmbiguousModelError) Error() string {
	return fmt.Sprintf("GPU model %s is ambiguous: %s", quoteShort(e.Query), strings.Join(e.Candidates, ", "))
}

// maxQuoted bounds how much of a user's query goes into an error message:
// the message ends up in logs and terminals, and the query may be anything.
const maxQuoted = 64

func quoteShort(s string) string {
	if utf8.RuneCountInString(s) <= maxQuoted {
		return fmt.Sprintf("%q", s)
	}
	r := []rune(s)
	return fmt.Sprintf("%q…", string(r[:maxQuoted]))
}

// normalize folds a model name the way people type it: case, white space,
// dashes and underscores are ignored, and so is a leading "NVIDIA", so that
// "nvidia h100-80gb", "H100 80GB" and "h100_80GB" are the same name.
func normalize(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if unicode.IsSpace(r) || r == '-' || r == '_' {
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return strings.TrimPrefix(b.String(), "nvidia")
}

// Match finds the catalog model a user means by query. An exact match
// (ignoring case, spaces, dashes, underscores and the "NVIDIA" prefix) wins;
// otherwise query must be the beginning of exactly one model's name. It
// returns *UnknownModelError or *AmbiguousModelError when it cannot decide.
func (c *Catalog) Match(query string) (Model, error) {
	return c.MatchIn(query, nil)
}

// MatchIn is Match over the catalog plus extra model names, typically the
// "10de:<device>" names of uncatalogued GPUs this agent has seen, so that
// those can be asked for too. An extra name equal to a catalog name adds
// nothing. A match on an extra name returns a Model with only the name (and,
// for a 10de:<device> name, its device ID).
func (c *Catalog) MatchIn(query string, names []string) (Model, error) {
	type cand struct {
		name  string
		norm  string
		model int // index in c.models, or -1 for an extra name
	}
	cands := make([]cand, 0, len(c.models)+len(names))
	seen := make(map[string]bool, len(c.models)+len(names))
	for i, m := range c.models {
		n := normalize(m.Name)
		cands = append(cands, cand{m.Name, n, i})
		seen[n] = true
	}
	for _, name := range names {
		n := normalize(name)
		if n == "" || seen[n] {
			continue
		}
		seen[n] = true
		cands = append(cands, cand{strings.TrimSpace(name), n, -1})
	}
	known := make([]string, len(cands))
	for i, cd := range cands {
		known[i] = cd.name
	}
	slices.Sort(known)

	q := normalize(query)
	if q == "" {
		return Model{}, &UnknownModelError{Query: query, Known: known}
	}
	var prefixed []cand
	for _, cd := range cands {
		if cd.norm == q {
			return c.candModel(cd.name, cd.model), nil
		}
		if strings.HasPrefix(cd.norm, q) {
			prefixed = append(prefixed, cd)
		}
	}
	switch len(prefixed) {
	case 0:
		return Model{}, &UnknownModelError{Query: query, Known: known}
	case 1:
		return c.candModel(prefixed[0].name, prefixed[0].model), nil
	}
	names = make([]string, len(prefixed))
	for i, cd := range prefixed {
		names[i] = cd.name
	}
	slices.Sort(names)
	return Model{}, &AmbiguousModelError{Query: query, Candidates: names, Known: known}
}

func (c *Catalog) candModel(name string, i int) Model {
	if i >= 0 {
		return c.models[i].clone()
	}
	m := Model{Name: name}
	if id, ok := parseUnknownName(name); ok {
		m.Name = UnknownModelName(VendorNVIDIA, id)
		m.DeviceIDs = []uint16{id}
	}
	return m
}
