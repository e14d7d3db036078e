package sim

import (
	"embed"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
)

// builtins holds the built-in profiles, written in the same format as a
// profile file so that they prove it.
//
//go:embed profiles/*.yaml
var builtins embed.FS

// Names lists the built-in profiles in sorted order.
func Names() []string {
	entries, err := builtins.ReadDir("profiles")
	if err != nil {
		panic(fmt.Sprintf("sim: embedded profiles: %v", err)) // the build embeds them
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	slices.Sort(names)
	return names
}

// Builtin returns the built-in profile called name.
func Builtin(name string) (*Profile, error) {
	if !slices.Contains(Names(), name) {
		return nil, fmt.Errorf("no built-in simulation profile %q; built-in profiles: %s (or give the path of a profile file)",
			name, strings.Join(Names(), ", "))
	}
	data, err := builtins.ReadFile(path.Join("profiles", name+".yaml"))
	if err != nil {
		return nil, fmt.Errorf("built-in profile %s: %w", name, err)
	}
	p, err := Parse(data, "builtin "+name)
	if err != nil {
		return nil, err
	}
	if p.Name != name {
		return nil, fmt.Errorf("built-in profile %s: its name key says %q", name, p.Name)
	}
	p.Source = "builtin"
	return p, nil
}

// Load returns a built-in profile by name, or reads a profile file when
// nameOrPath contains a slash or ends in .yaml or .yml.
func Load(nameOrPath string) (*Profile, error) {
	if !strings.ContainsRune(nameOrPath, '/') && !strings.HasSuffix(nameOrPath, ".yaml") && !strings.HasSuffix(nameOrPath, ".yml") {
		return Builtin(nameOrPath)
	}
	data, err := os.ReadFile(nameOrPath)
	if err != nil {
		return nil, fmt.Errorf("simulation profile: %w", err)
	}
	return Parse(data, nameOrPath)
}
