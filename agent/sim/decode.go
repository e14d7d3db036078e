package sim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// decodeStrict decodes one YAML document into out, rejecting unknown keys.
// yaml.v3 names only a line in its errors, so the tree is first walked next to
// out's type to name the key path of the first unknown key or ill-typed value.
func decodeStrict(data []byte, out any) error {
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("the file is empty")
		}
		return err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errors.New("holds more than one YAML document")
	}
	if err := checkShape(&root, reflect.TypeOf(out).Elem(), ""); err != nil {
		return err
	}
	strict := yaml.NewDecoder(bytes.NewReader(data))
	strict.KnownFields(true)
	return strict.Decode(out)
}

// checkShape reports, by its key path, the first mapping key in n that t has
// no field for, or the first scalar that does not decode into its field.
func checkShape(n *yaml.Node, t reflect.Type, path string) error {
	for n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return fmt.Errorf("%s: must be a mapping (line %d)", orTop(path), n.Line)
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, value := n.Content[i], n.Content[i+1]
			ft, ok := fields[key.Value]
			if !ok {
				return fmt.Errorf("%s: unknown key (line %d); known keys: %s",
					join(path, key.Value), key.Line, strings.Join(sortedKeys(fields), ", "))
			}
			if err := checkShape(value, ft, join(path, key.Value)); err != nil {
				return err
			}
		}
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return fmt.Errorf("%s: must be a list (line %d)", orTop(path), n.Line)
		}
		for i, item := range n.Content {
			if err := checkShape(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	default:
		if n.Kind != yaml.ScalarNode {
			return fmt.Errorf("%s: must be %s (line %d)", orTop(path), kindName(t), n.Line)
		}
		if err := n.Decode(reflect.New(t).Interface()); err != nil {
			return fmt.Errorf("%s: must be %s, not %q (line %d)", orTop(path), kindName(t), n.Value, n.Line)
		}
	}
	return nil
}

// yamlFields maps the yaml key of each field of struct type t to its type.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	fields := make(map[string]reflect.Type, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fields[name] = f.Type
	}
	return fields
}

func sortedKeys(m map[string]reflect.Type) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.String:
		return "a string"
	default:
		return "a " + t.Kind().String()
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orTop(path string) string {
	if path == "" {
		return "(top level)"
	}
	return path
}
