package inventory

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

//go:embed models.yaml
var defaultCatalogYAML []byte

// VendorNVIDIA is NVIDIA's PCI vendor ID.
const VendorNVIDIA = 0x10de

// Model is one GPU model users can ask for.
type Model struct {
	Name        string   `json:"name"`                   // canonical name, e.g. "NVIDIA H100 80GB"
	DeviceIDs   []uint16 `json:"device_ids"`             // PCI device IDs (vendor 10de) sold as this model
	MemoryBytes uint64   `json:"memory_bytes,omitempty"` // nominal memory; 0 only for uncatalogued GPUs
	Notes       string   `json:"notes,omitempty"`
}

// Catalog maps PCI device IDs to models. A Catalog is immutable once built,
// so one value can be shared by the inventory, the API and the matcher
// without locking; Merge returns a new one.
type Catalog struct {
	models []Model           // sorted by name
	byID   map[uint16]int    // device ID -> index in models
	nonGPU map[uint16]string // device ID -> notes
	names  []string          // sorted canonical names
}

// catalogFile is the YAML layout of models.yaml and of operator additions.
type catalogFile struct {
	Models []struct {
		Name        string   `yaml:"name"`
		DeviceIDs   []string `yaml:"device_ids"`
		MemoryBytes uint64   `yaml:"memory_bytes"`
		Notes       string   `yaml:"notes"`
	} `yaml:"models"`
	NonGPU []struct {
		DeviceID string `yaml:"device_id"`
		Notes    string `yaml:"notes"`
	} `yaml:"non_gpu"`
}

// DefaultCatalog returns the catalog built into the binary (models.yaml).
func DefaultCatalog() *Catalog {
	c, err := ParseCatalog(defaultCatalogYAML)
	if err != nil {
		// models.yaml is compiled in and covered by tests; failing here
		// means the binary itself is broken.
		panic("inventory: built-in models.yaml is invalid: " + err.Error())
	}
	return c
}

// ParseCatalog parses and validates a catalog in the models.yaml format.
// Unknown keys are errors so that a typo in an operator's file is caught at
// start rather than silently ignored.
func ParseCatalog(data []byte) (*Catalog, error) {
	var f catalogFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("GPU model catalog: %w", err)
	}
	models := make([]Model, 0, len(f.Models))
	for i, m := range f.Models {
		where := fmt.Sprintf("model #%d %q", i+1, m.Name)
		ids := make([]uint16, 0, len(m.DeviceIDs))
		for _, s := range m.DeviceIDs {
			id, err := parseDeviceID(s)
			if err != nil {
				return nil, fmt.Errorf("GPU model catalog: %s: %w", where, err)
			}
			ids = append(ids, id)
		}
		models = append(models, Model{Name: m.Name, DeviceIDs: ids, MemoryBytes: m.MemoryBytes, Notes: m.Notes})
	}
	nonGPU := make(map[uint16]string, len(f.NonGPU))
	for i, n := range f.NonGPU {
		id, err := parseDeviceID(n.DeviceID)
		if err != nil {
			return nil, fmt.Errorf("GPU model catalog: non_gpu entry #%d: %w", i+1, err)
		}
		if _, dup := nonGPU[id]; dup {
			return nil, fmt.Errorf("GPU model catalog: non_gpu entry #%d: device ID %04x listed twice", i+1, id)
		}
		nonGPU[id] = n.Notes
	}
	c, err := build(models, nonGPU)
	if err != nil {
		return nil, fmt.Errorf("GPU model catalog: %w", err)
	}
	return c, nil
}

// NewCatalog builds and validates a catalog from models already decoded
// elsewhere (for example from the agent's own config file).
func NewCatalog(models ...Model) (*Catalog, error) {
	c, err := build(models, nil)
	if err != nil {
		return nil, fmt.Errorf("GPU model catalog: %w", err)
	}
	return c, nil
}

// parseDeviceID reads a 16-bit PCI device ID written as hex, with or
// without "0x", as the catalog and lspci write it.
func parseDeviceID(s string) (uint16, error) {
	t := strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "0x")
	if len(t) == 0 || len(t) > 4 {
		return 0, fmt.Errorf("device ID %q: want 4 hex digits such as \"2330\"", s)
	}
	v, err := strconv.ParseUint(t, 16, 16)
	if err != nil {
		return 0, fmt.Errorf("device ID %q: want 4 hex digits such as \"2330\"", s)
	}
	return uint16(v), nil
}

// build validates models and indexes them. Every rule that Match relies on
// is checked here, so a catalog that builds can always be matched against.
func build(models []Model, nonGPU map[uint16]string) (*Catalog, error) {
	c := &Catalog{
		byID:   make(map[uint16]int),
		nonGPU: make(map[uint16]string, len(nonGPU)),
	}
	for id, n := range nonGPU {
		c.nonGPU[id] = n
	}
	c.models = make([]Model, len(models))
	for i, m := range models {
		m.DeviceIDs = slices.Clone(m.DeviceIDs)
		c.models[i] = m
	}
	slices.SortStableFunc(c.models, func(a, b Model) int { return strings.Compare(a.Name, b.Name) })

	normOwner := make(map[string]string)
	idOwner := make(map[uint16]string)
	for i, m := range c.models {
		where := fmt.Sprintf("model %q", m.Name)
		if strings.TrimSpace(m.Name) == "" {
			return nil, errors.New("a model has no name: every model needs a canonical name such as \"NVIDIA L40S\"")
		}
		if m.Name != strings.TrimSpace(m.Name) {
			return nil, fmt.Errorf("%s: name has leading or trailing spaces", where)
		}
		if _, ok := parseUnknownName(m.Name); ok {
			return nil, fmt.Errorf("%s: names of the form 10de:<device> are reserved for GPUs that are not in the catalog", where)
		}
		norm := normalize(m.Name)
		if norm == "" {
			return nil, fmt.Errorf("%s: name is empty once spaces, dashes and the NVIDIA prefix are ignored", where)
		}
		if other, dup := normOwner[norm]; dup {
			return nil, fmt.Errorf("%s: same name as model %q (names are compared ignoring case, spaces, dashes, underscores and the NVIDIA prefix)", where, other)
		}
		normOwner[norm] = m.Name
		if len(m.DeviceIDs) == 0 {
			return nil, fmt.Errorf("%s: no device_ids: list the PCI device IDs (vendor 10de) of its boards", where)
		}
		if m.MemoryBytes == 0 {
			return nil, fmt.Errorf("%s: memory_bytes is 0: give the nominal memory in bytes", where)
		}
		for _, id := range m.DeviceIDs {
			if other, dup := idOwner[id]; dup {
				if other == m.Name {
					return nil, fmt.Errorf("%s: device ID %04x listed twice", where, id)
				}
				return nil, fmt.Errorf("%s: device ID %04x already belongs to model %q", where, id, other)
			}
			if _, bad := c.nonGPU[id]; bad {
				return nil, fmt.Errorf("%s: device ID %04x is listed under non_gpu", where, id)
			}
			idOwner[id] = m.Name
			c.byID[id] = i
		}
		c.names = append(c.names, m.Name)
	}
	return c, nil
}

// Merge returns a catalog holding c's models and extra's. A model of extra
// whose name equals one of c's (as Match compares names) replaces it, so an
// operator can add a board variant or correct memory without renaming; any
// other overlap, such as a device ID already owned by another model, is an
// error naming both. c is left unchanged.
func (c *Catalog) Merge(extra *Catalog) (*Catalog, error) {
	if extra == nil {
		return c, nil
	}
	replaced := make(map[string]bool)
	for _, m := range extra.models {
		replaced[normalize(m.Name)] = true
	}
	models := make([]Model, 0, len(c.models)+len(extra.models))
	for _, m := range c.models {
		if !replaced[normalize(m.Name)] {
			models = append(models, m)
		}
	}
	models = append(models, extra.models...)
	nonGPU := make(map[uint16]string, len(c.nonGPU)+len(extra.nonGPU))
	for id, n := range c.nonGPU {
		nonGPU[id] = n
	}
	for id, n := range extra.nonGPU {
		nonGPU[id] = n
	}
	merged, err := build(models, nonGPU)
	if err != nil {
		return nil, fmt.Errorf("GPU model catalog: operator models: %w", err)
	}
	return merged, nil
}

// ByDeviceID returns the model an NVIDIA PCI device ID is sold as.
func (c *Catalog) ByDeviceID(id uint16) (Model, bool) {
	i, ok := c.byID[id]
	if !ok {
		return Model{}, false
	}
	return c.models[i].clone(), true
}

// ModelOf returns the model of an NVIDIA GPU with the given device ID. A GPU
// missing from the catalog is never dropped: it gets the model
// "10de:<device>" with unknown memory, and known is false.
func (c *Catalog) ModelOf(id uint16) (m Model, known bool) {
	if m, ok := c.ByDeviceID(id); ok {
		return m, true
	}
	return Model{Name: UnknownModelName(VendorNVIDIA, id), DeviceIDs: []uint16{id}}, false
}

// IsNonGPU reports whether an NVIDIA device ID is a function that is never
// offered as a GPU (an NVSwitch), whatever class code it reports.
func (c *Catalog) IsNonGPU(id uint16) bool {
	_, ok := c.nonGPU[id]
	return ok
}

// Names returns the canonical model names, sorted.
func (c *Catalog) Names() []string { return slices.Clone(c.names) }

// Exact returns the catalog model whose canonical name is name, spelled
// exactly as Names spells it: what Match answers for that name (canonical
// names differ even once folded, build checks), without folding every name
// of the catalog.
func (c *Catalog) Exact(name string) (Model, bool) {
	i, ok := slices.BinarySearch(c.names, name)
	if !ok {
		return Model{}, false
	}
	return c.models[i].clone(), true
}

// Models returns the models, sorted by name.
func (c *Catalog) Models() []Model {
	out := make([]Model, len(c.models))
	for i, m := range c.models {
		out[i] = m.clone()
	}
	return out
}

func (m Model) clone() Model {
	m.DeviceIDs = slices.Clone(m.DeviceIDs)
	return m
}

// UnknownModelName is the model name of a GPU that is not in the catalog,
// "10de:26ff": stable for as long as the card is in the machine, which is
// what claims need, and exactly what `lspci -n` shows an operator.
func UnknownModelName(vendor, device uint16) string {
	return fmt.Sprintf("%04x:%04x", vendor, device)
}

// parseUnknownName recognises names made by UnknownModelName for NVIDIA.
func parseUnknownName(name string) (uint16, bool) {
	s := strings.ToLower(strings.TrimSpace(name))
	rest, ok := strings.CutPrefix(s, "10de:")
	if !ok || len(rest) != 4 {
		return 0, false
	}
	v, err := strconv.ParseUint(rest, 16, 16)
	if err != nil {
		return 0, false
	}
	return uint16(v), true
}

// ParseDeviceID reads a 16-bit PCI device ID written as 4 hex digits, with
// or without "0x" ("2330"), as models.yaml and lspci write it.
func ParseDeviceID(s string) (uint16, error) { return parseDeviceID(s) }
