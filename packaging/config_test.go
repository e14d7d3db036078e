package packaging_test

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent"
)

// commentedKey is a key of the packaged config shown with its default,
// commented out: "#key: value".
var commentedKey = regexp.MustCompile(`^#([a-z_]+):( .*)?$`)

// exampleOnly are keys whose default cannot be written down: the packaged
// file shows an example instead.
var exampleOnly = map[string]string{
	"node_name": "the default is the host name, known only at run time",
}

// TestPackagedConfigListsEveryKeyWithItsDefault keeps
// /etc/gpuherd/gpuherd.yaml honest: every key of agent.Config is there, and
// uncommenting all of them changes nothing.
func TestPackagedConfigListsEveryKeyWithItsDefault(t *testing.T) {
	data, err := os.ReadFile("gpuherd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	var uncommented []string
	for _, line := range strings.Split(string(data), "\n") {
		m := commentedKey.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if listed[m[1]] {
			t.Errorf("key %s listed twice", m[1])
		}
		listed[m[1]] = true
		if _, ok := exampleOnly[m[1]]; !ok {
			uncommented = append(uncommented, line[1:])
		}
	}

	for _, key := range configKeys(t) {
		if !listed[key] {
			t.Errorf("agent.Config has %s but packaging/gpuherd.yaml does not list it (add it, commented, with its default)", key)
		}
		delete(listed, key)
	}
	for key := range listed {
		t.Errorf("packaging/gpuherd.yaml lists %s, which agent.Config does not know: the agent would refuse the file once it is uncommented", key)
	}

	path := filepath.Join(t.TempDir(), "gpuherd.yaml")
	if err := os.WriteFile(path, []byte(strings.Join(uncommented, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := agent.DefaultConfig()
	if err := agent.LoadConfigFile(path, &got); err != nil {
		t.Fatalf("the packaged config with every key uncommented does not load: %v", err)
	}
	want := agent.DefaultConfig()
	// Addressable, so that values print through pointer-receiver String
	// methods (Duration) in the messages below.
	gv, wv := reflect.ValueOf(&got).Elem(), reflect.ValueOf(&want).Elem()
	for i := range gv.NumField() {
		f := gv.Type().Field(i)
		key := yamlKey(f)
		if key == "" {
			continue
		}
		if !sameValue(gv.Field(i), wv.Field(i)) {
			t.Errorf("packaging/gpuherd.yaml shows %s: %v, but the default is %v", key, gv.Field(i).Addr().Interface(), wv.Field(i).Addr().Interface())
		}
	}
}

// sameValue is reflect.DeepEqual except that an empty list written as []
// equals a nil default.
func sameValue(a, b reflect.Value) bool {
	if a.Kind() == reflect.Slice && a.Len() == 0 && b.Len() == 0 {
		return true
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}

func configKeys(t *testing.T) []string {
	t.Helper()
	var keys []string
	typ := reflect.TypeFor[agent.Config]()
	for i := range typ.NumField() {
		if k := yamlKey(typ.Field(i)); k != "" {
			keys = append(keys, k)
		}
	}
	if len(keys) < 10 {
		t.Fatalf("found only %d yaml keys in agent.Config", len(keys))
	}
	return keys
}

func yamlKey(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" || !f.IsExported() {
		return ""
	}
	return name
}
