package inventory

import (
	"slices"
	"strings"
	"testing"
)

const gib = 1 << 30

func TestDefaultCatalogDeviceIDs(t *testing.T) {
	c := DefaultCatalog()
	tests := []struct {
		id     uint16
		model  string
		memory uint64
	}{
		{0x26b9, "NVIDIA L40S", 48 * gib},
		{0x26b5, "NVIDIA L40", 48 * gib},
		{0x27b8, "NVIDIA L4", 24 * gib},
		{0x20b5, "NVIDIA A100 80GB", 80 * gib},
		{0x20b2, "NVIDIA A100 80GB", 80 * gib},
		{0x20f1, "NVIDIA A100 40GB", 40 * gib},
		{0x20b0, "NVIDIA A100 40GB", 40 * gib},
		{0x2331, "NVIDIA H100 80GB", 80 * gib},
		{0x2330, "NVIDIA H100 80GB", 80 * gib},
		{0x2321, "NVIDIA H100 NVL", 94 * gib},
		{0x2335, "NVIDIA H200", 141 * gib},
		{0x233b, "NVIDIA H200 NVL", 141 * gib},
		{0x2bb5, "NVIDIA RTX 6000 Pro", 96 * gib},
		{0x2bb1, "NVIDIA RTX 6000 Pro", 96 * gib},
		{0x2bb4, "NVIDIA RTX 6000 Pro", 96 * gib},
		{0x2901, "NVIDIA B200", 180 * gib},
		{0x2235, "NVIDIA A40", 48 * gib},
		{0x2236, "NVIDIA A10", 24 * gib},
		{0x1eb8, "NVIDIA T4", 16 * gib},
		{0x26b1, "NVIDIA RTX 6000 Ada", 48 * gib},
		{0x2342, "NVIDIA GH200", 96 * gib},
	}
	for _, tt := range tests {
		m, ok := c.ByDeviceID(tt.id)
		if !ok {
			t.Errorf("device %04x: not in the default catalog, want %q", tt.id, tt.model)
			continue
		}
		if m.Name != tt.model || m.MemoryBytes != tt.memory {
			t.Errorf("device %04x: got %q %d bytes, want %q %d bytes", tt.id, m.Name, m.MemoryBytes, tt.model, tt.memory)
		}
		if !slices.Contains(m.DeviceIDs, tt.id) {
			t.Errorf("device %04x: model %q does not list it: %x", tt.id, m.Name, m.DeviceIDs)
		}
	}
	for _, id := range []uint16{0x1af1, 0x22a3} {
		if !c.IsNonGPU(id) {
			t.Errorf("NVSwitch %04x: IsNonGPU = false", id)
		}
		if _, ok := c.ByDeviceID(id); ok {
			t.Errorf("NVSwitch %04x is a model", id)
		}
	}
	if c.IsNonGPU(0x2330) {
		t.Error("H100 is listed as a non-GPU")
	}
	names := c.Names()
	if !slices.IsSorted(names) || len(names) != 16 {
		t.Errorf("Names() = %q, want 11 sorted names", names)
	}
}

func TestModelOfUnknownGPU(t *testing.T) {
	c := DefaultCatalog()
	m, known := c.ModelOf(0x1DB4)
	if known || m.Name != "10de:1db4" || m.MemoryBytes != 0 || !slices.Equal(m.DeviceIDs, []uint16{0x1db4}) {
		t.Errorf("ModelOf(1db4) = %+v, %v; want 10de:1db4, unknown", m, known)
	}
	m, known = c.ModelOf(0x26b9)
	if !known || m.Name != "NVIDIA L40S" {
		t.Errorf("ModelOf(26b9) = %+v, %v", m, known)
	}
	if got := UnknownModelName(0x10de, 0x000a); got != "10de:000a" {
		t.Errorf("UnknownModelName = %q, want zero-padded 10de:000a", got)
	}
}

func TestCatalogReturnsCopies(t *testing.T) {
	c := DefaultCatalog()
	m, _ := c.ByDeviceID(0x2330)
	m.DeviceIDs[0] = 0xffff
	c.Names()[0] = "mutated"
	if again, _ := c.ByDeviceID(0x2330); again.DeviceIDs[0] == 0xffff {
		t.Error("ByDeviceID shares the catalog's slice")
	}
	if c.Names()[0] == "mutated" {
		t.Error("Names shares the catalog's slice")
	}
}

func TestParseCatalogErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want string // substring of the error
	}{
		{"not yaml", "models: [", "GPU model catalog"},
		{"unknown key", "models:\n  - name: X\n    device_id: [\"1234\"]\n", "device_id"},
		{"no name", "models:\n  - device_ids: [\"1234\"]\n    memory_bytes: 1\n", "no name"},
		{"blank name", "models:\n  - name: \"  \"\n    device_ids: [\"1234\"]\n    memory_bytes: 1\n", "no name"},
		{"padded name", "models:\n  - name: \" X\"\n    device_ids: [\"1234\"]\n    memory_bytes: 1\n", `" X"`},
		{"only NVIDIA", "models:\n  - name: NVIDIA\n    device_ids: [\"1234\"]\n    memory_bytes: 1\n", `"NVIDIA": name is empty`},
		{"reserved name", "models:\n  - name: 10de:1234\n    device_ids: [\"1234\"]\n    memory_bytes: 1\n", "reserved"},
		{"duplicate name", "models:\n  - name: NVIDIA L40S\n    device_ids: [\"26b9\"]\n    memory_bytes: 1\n  - name: l40-s\n    device_ids: [\"26ba\"]\n    memory_bytes: 1\n", `same name as model`},
		{"no ids", "models:\n  - name: X\n    memory_bytes: 1\n", `model "X": no device_ids`},
		{"zero memory", "models:\n  - name: X\n    device_ids: [\"1234\"]\n", `model "X": memory_bytes is 0`},
		{"bad hex", "models:\n  - name: X\n    device_ids: [\"12g4\"]\n    memory_bytes: 1\n", `model #1 "X": device ID "12g4"`},
		{"too long", "models:\n  - name: X\n    device_ids: [\"12345\"]\n    memory_bytes: 1\n", `device ID "12345"`},
		{"empty id", "models:\n  - name: X\n    device_ids: [\"\"]\n    memory_bytes: 1\n", `device ID ""`},
		{"id twice in one model", "models:\n  - name: X\n    device_ids: [\"1234\", \"0x1234\"]\n    memory_bytes: 1\n", `model "X": device ID 1234 listed twice`},
		{"id in two models", "models:\n  - name: A\n    device_ids: [\"1234\"]\n    memory_bytes: 1\n  - name: B\n    device_ids: [\"1234\"]\n    memory_bytes: 1\n", `model "B": device ID 1234 already belongs to model "A"`},
		{"id also non-GPU", "models:\n  - name: X\n    device_ids: [\"22a3\"]\n    memory_bytes: 1\nnon_gpu:\n  - device_id: \"22a3\"\n", `model "X": device ID 22a3 is listed under non_gpu`},
		{"non-GPU twice", "non_gpu:\n  - device_id: \"22a3\"\n  - device_id: \"22A3\"\n", "non_gpu entry #2: device ID 22a3 listed twice"},
		{"non-GPU bad", "non_gpu:\n  - device_id: \"nv\"\n", "non_gpu entry #1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseCatalog([]byte(tt.yaml))
			if err == nil {
				t.Fatalf("ParseCatalog accepted it: %v", c.Names())
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

func TestParseCatalogAccepts(t *testing.T) {
	// Unquoted IDs are read as written, as hex, never as decimal numbers.
	c, err := ParseCatalog([]byte("models:\n  - name: Tesla V100\n    device_ids: [1db4, 2330, 0x20B0]\n    memory_bytes: 17179869184\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint16{0x1db4, 0x2330, 0x20b0} {
		if m, ok := c.ByDeviceID(id); !ok || m.Name != "Tesla V100" {
			t.Errorf("device %04x: got %+v %v", id, m, ok)
		}
	}
	empty, err := ParseCatalog(nil)
	if err != nil || len(empty.Names()) != 0 {
		t.Errorf("empty catalog: %v %v", empty, err)
	}
}

func TestMerge(t *testing.T) {
	base := DefaultCatalog()
	extra, err := ParseCatalog([]byte(`
models:
  - name: NVIDIA V100
    device_ids: ["1db4"]
    memory_bytes: 17179869184
  - name: nvidia l40s            # same model as the built-in one: replaces it
    device_ids: ["26b9", "26ba"]
    memory_bytes: 51539607552
`))
	if err != nil {
		t.Fatal(err)
	}
	merged, err := base.Merge(extra)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := merged.ByDeviceID(0x1db4); !ok || m.Name != "NVIDIA V100" {
		t.Errorf("T4 not added: %+v", m)
	}
	if m, ok := merged.ByDeviceID(0x26ba); !ok || m.Name != "nvidia l40s" {
		t.Errorf("L40S variant not added: %+v", m)
	}
	if m, ok := merged.ByDeviceID(0x2330); !ok || m.Name != "NVIDIA H100 80GB" {
		t.Errorf("built-in H100 lost: %+v", m)
	}
	if !merged.IsNonGPU(0x22a3) {
		t.Error("non-GPU list lost")
	}
	if len(merged.Names()) != len(base.Names())+1 {
		t.Errorf("merged names %q", merged.Names())
	}
	if _, ok := base.ByDeviceID(0x1db4); ok {
		t.Error("Merge changed its receiver")
	}
	if same, err := base.Merge(nil); err != nil || same != base {
		t.Errorf("Merge(nil) = %p, %v", same, err)
	}

	clash, err := NewCatalog(Model{Name: "Custom H100", DeviceIDs: []uint16{0x2330}, MemoryBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = base.Merge(clash)
	if err == nil || !strings.Contains(err.Error(), `model "NVIDIA H100 80GB": device ID 2330 already belongs to model "Custom H100"`) &&
		!strings.Contains(err.Error(), `model "Custom H100": device ID 2330 already belongs to model "NVIDIA H100 80GB"`) {
		t.Errorf("clash: got %v", err)
	}
	if err != nil && !strings.Contains(err.Error(), "operator models") {
		t.Errorf("clash error does not say it comes from the operator's models: %v", err)
	}
}

func TestNewCatalogValidates(t *testing.T) {
	if _, err := NewCatalog(Model{Name: "X", DeviceIDs: []uint16{1}}); err == nil || !strings.Contains(err.Error(), `model "X": memory_bytes is 0`) {
		t.Errorf("got %v", err)
	}
}

func TestModels(t *testing.T) {
	c := DefaultCatalog()
	ms := c.Models()
	if len(ms) != len(c.Names()) {
		t.Fatalf("%d models, %d names", len(ms), len(c.Names()))
	}
	for i, m := range ms {
		if m.Name != c.Names()[i] || len(m.DeviceIDs) == 0 || m.MemoryBytes == 0 || m.Notes == "" {
			t.Errorf("model %d: %+v", i, m)
		}
	}
	ms[0].DeviceIDs[0] = 0xffff
	if c.Models()[0].DeviceIDs[0] == 0xffff {
		t.Error("Models shares the catalog's slices")
	}
}
