package agent

import (
	"fmt"

	"github.com/gpuherd/gpuherd/agent/inventory"
)

// ModelConfig is one operator model of the configuration's models list, in
// the layout of models.yaml: the PCI device IDs (vendor 10de) sold under a
// name, and its marketed memory.
type ModelConfig struct {
	Name      string   `yaml:"name"`
	DeviceIDs []string `yaml:"device_ids"`
	// MemoryGB is the marketed memory in GB, read as GiB as models.yaml
	// does (an "80GB" card is 80 GiB); MemoryBytes gives it exactly
	// instead. Exactly one of them.
	MemoryGB    uint64 `yaml:"memory_gb"`
	MemoryBytes uint64 `yaml:"memory_bytes"`
	Notes       string `yaml:"notes"`
}

// Catalog is the model catalog this configuration names GPUs with: the
// built-in one extended (or corrected) by the models list.
func (c *Config) Catalog() (*inventory.Catalog, error) {
	base := inventory.DefaultCatalog()
	if len(c.Models) == 0 {
		return base, nil
	}
	models := make([]inventory.Model, 0, len(c.Models))
	for i, m := range c.Models {
		key := fmt.Sprintf("models[%d]", i)
		if (m.MemoryGB == 0) == (m.MemoryBytes == 0) {
			return nil, &ConfigError{Key: key, Reason: fmt.Sprintf("model %q: give its memory as memory_gb (e.g. 48) or memory_bytes, one of them", m.Name)}
		}
		mem := m.MemoryBytes
		if m.MemoryGB != 0 {
			if m.MemoryGB > 1<<20 {
				return nil, &ConfigError{Key: key, Reason: fmt.Sprintf("model %q: memory_gb %d is not a GPU's memory", m.Name, m.MemoryGB)}
			}
			mem = m.MemoryGB << 30
		}
		ids := make([]uint16, 0, len(m.DeviceIDs))
		for _, s := range m.DeviceIDs {
			id, err := inventory.ParseDeviceID(s)
			if err != nil {
				return nil, &ConfigError{Key: key, Reason: fmt.Sprintf("model %q: %v", m.Name, err)}
			}
			ids = append(ids, id)
		}
		models = append(models, inventory.Model{Name: m.Name, DeviceIDs: ids, MemoryBytes: mem, Notes: m.Notes})
	}
	extra, err := inventory.NewCatalog(models...)
	if err != nil {
		return nil, &ConfigError{Key: "models", Reason: err.Error()}
	}
	merged, err := base.Merge(extra)
	if err != nil {
		return nil, &ConfigError{Key: "models", Reason: err.Error()}
	}
	return merged, nil
}

// canonicalOffered resolves offered_models against the catalog to their
// canonical names, so that "l40s" and "NVIDIA L40S" are one model in
// `availability`; a name the catalog does not know is an error naming it.
func (c *Config) canonicalOffered(cat *inventory.Catalog) ([]string, error) {
	out := make([]string, 0, len(c.OfferedModels))
	seen := map[string]bool{}
	for _, q := range c.OfferedModels {
		m, err := cat.Match(q)
		if err != nil {
			return nil, &ConfigError{Key: "offered_models", Reason: fmt.Sprintf("%v: list catalog models, or add the model under models:", err)}
		}
		if !seen[m.Name] {
			seen[m.Name] = true
			out = append(out, m.Name)
		}
	}
	return out, nil
}
