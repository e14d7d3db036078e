package sim

import (
	"errors"
	"fmt"
	"github.com/gpuherd/gpuherd/internal/atomicfile"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// Files of a simulated machine in the agent's state dir.
const (
	KernelStateFile  = "sim-kernel.json" // the fake kernel's state, which outlives the agent process
	ProfileStateFile = "sim-profile"     // the name of the profile that state was booted from
)

// Machine is a simulated server: its kernel and, where the profile has it, NVML.
type Machine struct {
	Profile *Profile
	Kernel  *fakekernel.Kernel
	NVML    nvml.Interface // nil when the profile has nvml: false
}

// Start boots the simulated machine of p, or resumes the one in stateDir, as
// a real server keeps its driver bindings while the agent restarts. It refuses
// a state dir that holds the machine of another profile.
func Start(p *Profile, stateDir string) (*Machine, error) {
	if err := os.MkdirAll(stateDir, 0o750); err != nil {
		return nil, fmt.Errorf("simulation: %w", err)
	}
	kernelPath := filepath.Join(stateDir, KernelStateFile)
	markPath := filepath.Join(stateDir, ProfileStateFile)

	_, err := os.Stat(kernelPath)
	resuming := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("simulation: %w", err)
	}
	mark, err := os.ReadFile(markPath)
	haveMark := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("simulation: %w", err)
	}
	if owner := strings.TrimSpace(string(mark)); resuming && haveMark && owner != p.Name {
		return nil, foreignState(stateDir, owner, p.Name)
	}
	writeMark := func() error {
		if err := atomicfile.Write(markPath, []byte(p.Name+"\n"), 0o600); err != nil {
			return fmt.Errorf("simulation: %w", err)
		}
		return nil
	}
	if !resuming {
		// Written before the kernel boots, so that a kernel state never
		// exists without the name of its profile beside it.
		if err := writeMark(); err != nil {
			return nil, err
		}
	}

	k, err := fakekernel.Open(kernelPath, p.KernelConfig())
	if err != nil {
		return nil, fmt.Errorf("simulation: kernel state %s: %w", kernelPath, err)
	}
	if resuming {
		// The name alone misses a profile file edited since the last boot.
		if err := sameDevices(k, p); err != nil {
			return nil, fmt.Errorf("simulation: the machine in %s no longer matches profile %q (%w): start with a fresh data dir, or remove %s and %s to boot it anew",
				stateDir, p.Name, err, KernelStateFile, ProfileStateFile)
		}
		if !haveMark {
			if err := writeMark(); err != nil {
				return nil, err
			}
		}
	}
	return &Machine{Profile: p, Kernel: k, NVML: p.NVML(k)}, nil
}

func foreignState(stateDir, owner, want string) error {
	return fmt.Errorf("simulation: %s holds the simulated machine of profile %q, not %q: start with a fresh data dir, or remove %s and %s to boot %q there",
		stateDir, owner, want, KernelStateFile, ProfileStateFile, want)
}

// sameDevices checks that the kernel has exactly the profile's PCI functions,
// with the same vendor and device IDs.
func sameDevices(k vfio.FS, p *Profile) error {
	want := map[string][2]uint16{}
	for _, d := range p.kernel.Devices {
		want[d.Address] = [2]uint16{d.Vendor, d.Device}
	}
	have, err := k.ReadDir("bus/pci/devices")
	if err != nil {
		return err
	}
	var diffs []string
	for _, addr := range have {
		w, ok := want[addr]
		if !ok {
			diffs = append(diffs, addr+" is not in the profile")
			continue
		}
		delete(want, addr)
		vendor, err1 := readHexID(k, addr, "vendor")
		device, err2 := readHexID(k, addr, "device")
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		if vendor != w[0] || device != w[1] {
			diffs = append(diffs, fmt.Sprintf("%s is %04x:%04x, the profile says %04x:%04x", addr, vendor, device, w[0], w[1]))
		}
	}
	for addr := range want {
		diffs = append(diffs, addr+" is missing")
	}
	if len(diffs) > 0 {
		slices.Sort(diffs)
		return errors.New(strings.Join(diffs, "; "))
	}
	return nil
}

func readHexID(k vfio.FS, addr, file string) (uint16, error) {
	b, err := k.ReadFile("bus/pci/devices/" + addr + "/" + file)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(string(b)), "0x"), 16, 16)
	if err != nil {
		return 0, fmt.Errorf("%s/%s: %w", addr, file, err)
	}
	return uint16(v), nil
}
