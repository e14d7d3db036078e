package fakekubelet

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// DeviceNode is a device node the container gets.
type DeviceNode struct {
	// Path is the path inside the container.
	Path string
	// HostPath is the node on the host (Path when the spec left it out).
	HostPath    string
	Type        string
	Major       int64
	Minor       int64
	Permissions string
}

// ContainerView is what a set of CDI devices does to a container, as a CDI
// aware runtime (containerd, CRI-O) would apply it.
type ContainerView struct {
	DeviceNodes []DeviceNode
	// Mounts maps a path in the container to the host path bound there.
	Mounts map[string]string
	// MountOptions holds each mount's options, by container path.
	MountOptions map[string][]string
	// Env is the environment the devices add.
	Env map[string]string
}

// HostPathFor returns the host file that appears in the container at
// containerPath, through a mount of the file itself or of a directory above
// it, and whether there is one.
func (v *ContainerView) HostPathFor(containerPath string) (string, bool) {
	p := filepath.Clean(containerPath)
	for dir := p; ; dir = filepath.Dir(dir) {
		if host, ok := v.Mounts[dir]; ok {
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return "", false
			}
			return filepath.Join(host, rel), true
		}
		if dir == "/" || dir == "." {
			return "", false
		}
	}
}

// Glob returns the container paths matching pattern (filepath.Match syntax,
// e.g. "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/r/*-metadata.json")
// among the mounted files and the files inside mounted directories, sorted:
// what a process in the container would see.
func (v *ContainerView) Glob(pattern string) ([]string, error) {
	var out []string
	for cpath, host := range v.Mounts {
		fi, err := os.Stat(host)
		if err != nil {
			continue // a dangling mount would fail the container; glob sees nothing
		}
		if !fi.IsDir() {
			if ok, err := filepath.Match(pattern, cpath); err != nil {
				return nil, err
			} else if ok {
				out = append(out, cpath)
			}
			continue
		}
		err = filepath.WalkDir(host, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(host, path)
			c := filepath.Join(cpath, rel)
			if ok, err := filepath.Match(pattern, c); err != nil {
				return err
			} else if ok && !d.IsDir() {
				out = append(out, c)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	sort.Strings(out)
	return slices.Compact(out), nil
}

// ApplyCDI reads the CDI spec files (*.json, *.yaml) in cdiDir, resolves
// the fully qualified device IDs ("vendor/class=name") and returns the
// container view they produce: spec-wide edits of each used spec plus each
// device's edits. Like a runtime it fails on an unknown or ambiguous ID,
// on a malformed spec, and on two devices binding different host paths to
// one container path or setting one variable to two values.
func ApplyCDI(cdiDir string, cdiDeviceIDs []string) (*ContainerView, error) {
	specs, err := readSpecs(cdiDir)
	if err != nil {
		return nil, err
	}
	view := &ContainerView{Mounts: map[string]string{}, MountOptions: map[string][]string{}, Env: map[string]string{}}
	appliedSpec := map[string]bool{}
	for _, id := range cdiDeviceIDs {
		kind, name, ok := strings.Cut(id, "=")
		if !ok || !strings.Contains(kind, "/") || name == "" {
			return nil, fmt.Errorf("CDI device ID %q is not of the form vendor/class=name", id)
		}
		var (
			found    *cdispec.Device
			fromFile string
		)
		for _, s := range specs {
			if s.spec.Kind != kind {
				continue
			}
			for i := range s.spec.Devices {
				if s.spec.Devices[i].Name != name {
					continue
				}
				if found != nil {
					return nil, fmt.Errorf("CDI device %q defined in both %s and %s", id, fromFile, s.file)
				}
				found, fromFile = &s.spec.Devices[i], s.file
				if !appliedSpec[s.file] {
					appliedSpec[s.file] = true
					if err := view.apply(s.spec.ContainerEdits, s.file); err != nil {
						return nil, err
					}
				}
			}
		}
		if found == nil {
			return nil, fmt.Errorf("unresolvable CDI device %q: no spec in %s defines it", id, cdiDir)
		}
		if err := view.apply(found.ContainerEdits, fromFile); err != nil {
			return nil, fmt.Errorf("device %q: %w", id, err)
		}
	}
	return view, nil
}

type specFile struct {
	file string
	spec *cdispec.Spec
}

func readSpecs(dir string) ([]specFile, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read CDI directory: %w", err)
	}
	var out []specFile
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || (ext != ".json" && ext != ".yaml") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var spec cdispec.Spec
		// sigs.k8s.io/yaml reads JSON too and honours the json tags.
		if err := yaml.UnmarshalStrict(data, &spec); err != nil {
			return nil, fmt.Errorf("CDI spec %s: %w", path, err)
		}
		if spec.Version == "" || spec.Kind == "" {
			return nil, fmt.Errorf("CDI spec %s: cdiVersion and kind are required", path)
		}
		out = append(out, specFile{file: path, spec: &spec})
	}
	return out, nil
}

func (v *ContainerView) apply(edits cdispec.ContainerEdits, file string) error {
	for _, kv := range edits.Env {
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("%s: env entry %q has no '='", file, kv)
		}
		if old, set := v.Env[k]; set && old != val {
			return fmt.Errorf("%s: env %s set to both %q and %q", file, k, old, val)
		}
		v.Env[k] = val
	}
	for _, m := range edits.Mounts {
		if m == nil {
			continue
		}
		if !filepath.IsAbs(m.ContainerPath) {
			return fmt.Errorf("%s: mount container path %q is not absolute", file, m.ContainerPath)
		}
		cpath := filepath.Clean(m.ContainerPath)
		if old, set := v.Mounts[cpath]; set && old != m.HostPath {
			return fmt.Errorf("%s: %s mounted from both %s and %s", file, cpath, old, m.HostPath)
		}
		v.Mounts[cpath] = m.HostPath
		v.MountOptions[cpath] = m.Options
	}
	for _, d := range edits.DeviceNodes {
		if d == nil {
			continue
		}
		node := DeviceNode{Path: d.Path, HostPath: d.HostPath, Type: d.Type, Major: d.Major, Minor: d.Minor, Permissions: d.Permissions}
		if node.HostPath == "" {
			node.HostPath = node.Path
		}
		if !slices.Contains(v.DeviceNodes, node) {
			v.DeviceNodes = append(v.DeviceNodes, node)
		}
	}
	return nil
}
