package agent

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// UnknownKeyError is a key of the configuration file that gpuherd does not
// know, with the known key it most likely meant.
type UnknownKeyError struct {
	Key     string // as written, with its parent for a nested key ("models[0].memory")
	Suggest string // the closest known key, or ""
	Line    int
}

func (e *UnknownKeyError) Error() string {
	msg := fmt.Sprintf("unknown key %s (line %d)", e.Key, e.Line)
	if e.Suggest != "" {
		msg += ": did you mean " + e.Suggest + "?"
	}
	return msg
}

// yamlKeys lists the yaml tags of a struct type's fields.
func yamlKeys(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); tag != "" && tag != "-" {
			out = append(out, tag)
		}
	}
	return out
}

// checkKeys finds every key of a configuration document that Config does
// not have, at the top level and inside models entries, so that a typo
// names the key it was meant to be rather than failing as yaml's "field
// metrics_adr not found in type agent.Config".
func checkKeys(data []byte) error {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil // the decoder reports what is wrong with the document itself
	}
	var errs []error
	top := yamlKeys(reflect.TypeFor[Config]())
	model := yamlKeys(reflect.TypeFor[ModelConfig]())
	m := doc.Content[0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if !slices.Contains(top, k.Value) {
			errs = append(errs, &UnknownKeyError{Key: k.Value, Suggest: closest(k.Value, top), Line: k.Line})
			continue
		}
		if k.Value == "kubernetes" && v.Kind == yaml.MappingNode {
			known := yamlKeys(reflect.TypeFor[KubernetesConfig]())
			for n := 0; n+1 < len(v.Content); n += 2 {
				if ik := v.Content[n]; !slices.Contains(known, ik.Value) {
					errs = append(errs, &UnknownKeyError{Key: "kubernetes." + ik.Value, Suggest: closest(ik.Value, known), Line: ik.Line})
				}
			}
			continue
		}
		if k.Value != "models" || v.Kind != yaml.SequenceNode {
			continue
		}
		for j, item := range v.Content {
			if item.Kind != yaml.MappingNode {
				continue
			}
			for n := 0; n+1 < len(item.Content); n += 2 {
				ik := item.Content[n]
				if !slices.Contains(model, ik.Value) {
					errs = append(errs, &UnknownKeyError{Key: fmt.Sprintf("models[%d].%s", j, ik.Value), Suggest: closest(ik.Value, model), Line: ik.Line})
				}
			}
		}
	}
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return &ConfigErrors{Errs: errs}
}

// ConfigErrors is several problems of one configuration, each its own line.
type ConfigErrors struct{ Errs []error }

func (e *ConfigErrors) Error() string {
	lines := make([]string, len(e.Errs))
	for i, err := range e.Errs {
		lines[i] = err.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap gives errors.Is and errors.As every problem.
func (e *ConfigErrors) Unwrap() []error { return e.Errs }

// closest is the known key nearest to key by edit distance, when near
// enough to be a typo (at most a third of its length, and at least 2).
func closest(key string, known []string) string {
	best, bestD := "", max(2, len(key)/3)+1
	for _, k := range known {
		if d := editDistance(strings.ToLower(key), k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
