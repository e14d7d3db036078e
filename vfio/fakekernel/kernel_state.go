package fakekernel

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/gpuherd/gpuherd/internal/atomicfile"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gpuherd/gpuherd/vfio"
)

// kernelStateVersion is the version of the state file format. A file of any
// other version is refused rather than guessed at.
const kernelStateVersion = 1

// kernelState is the state file: the simulated machine as it is now.
type kernelState struct {
	Version int           `json:"version"`
	Drivers []string      `json:"drivers"`
	Devices []stateDevice `json:"devices"`
}

type stateDevice struct {
	Function              // Driver: the current driver
	DriverOverride string `json:"driver_override,omitempty"`
	HostDriver     string `json:"host_driver,omitempty"`
	ConfigAllOnes  bool   `json:"config_all_ones,omitempty"`
}

// Open opens the simulated machine kept in the state file at path.
// If the file exists, the machine is as the file says, whatever cfg says:
// it kept running while its agent was down, drivers and overrides as they
// were. Otherwise it boots from cfg and writes the file. Every later change
// (a write that changes a device, Remove, SetConfigAllOnes) is saved before
// it becomes visible, atomically (temporary file, fsync, rename, fsync of
// the directory), so killing the process at any moment leaves the previous
// or the new state, never a torn one.
func Open(path string, cfg Config) (*Kernel, error) {
	removeStaleTemps(path)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		k, err := New(cfg)
		if err != nil {
			return nil, err
		}
		k.path = path
		if err := k.save(); err != nil {
			return nil, fmt.Errorf("vfio: simulated kernel: write initial state: %w", err)
		}
		return k, nil
	}
	if err != nil {
		return nil, fmt.Errorf("vfio: simulated kernel: read state: %w", err)
	}
	var st kernelState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("vfio: simulated kernel: state file %s is corrupt: %w (delete it to boot the machine afresh)", path, err)
	}
	if st.Version != kernelStateVersion {
		return nil, fmt.Errorf("vfio: simulated kernel: state file %s has version %d, this build reads %d (delete it to boot afresh)",
			path, st.Version, kernelStateVersion)
	}
	devs := make([]kdev, len(st.Devices))
	for i, d := range st.Devices {
		devs[i] = kdev{Function: d.Function, Override: d.DriverOverride, HostDriver: d.HostDriver, ConfigAllOnes: d.ConfigAllOnes}
	}
	k, err := newKernel(st.Drivers, devs)
	if err != nil {
		return nil, fmt.Errorf("vfio: simulated kernel: state file %s: %w", path, err)
	}
	k.path = path
	return k, nil
}

// state returns the machine as the state file records it. k.mu must be held.
func (k *Kernel) state() kernelState {
	st := kernelState{Version: kernelStateVersion}
	for _, d := range k.drivers {
		if d != vfio.DriverVFIO { // always loaded; not configuration
			st.Drivers = append(st.Drivers, d)
		}
	}
	for _, a := range k.addrs(nil) {
		d := k.devs[a]
		st.Devices = append(st.Devices, stateDevice{Function: d.Function, DriverOverride: d.Override, HostDriver: d.HostDriver, ConfigAllOnes: d.ConfigAllOnes})
	}
	return st
}

// save writes the state file, if there is one. k.mu must be held: the state
// on disk then changes in the same order as the state in memory.
func (k *Kernel) save() error {
	if k.path == "" {
		return nil
	}
	b, err := json.MarshalIndent(k.state(), "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(k.path, append(b, '\n'), 0o600)
}

// removeStaleTemps deletes temporary files a killed process left behind.
func removeStaleTemps(path string) {
	matches, _ := filepath.Glob(globEscape(path) + ".tmp*")
	for _, m := range matches {
		os.Remove(m)
	}
}

// globEscape quotes glob metacharacters in a literal path.
func globEscape(s string) string {
	var out []byte
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', '\\':
			out = append(out, '\\')
		}
		out = append(out, s[i])
	}
	return string(out)
}
