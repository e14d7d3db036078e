package fakekernel

import (
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/gpuherd/gpuherd/vfio"
)

// Function describes one PCI function of a simulated machine as it is at
// boot: Driver is the driver it is bound to then ("" for none).
type Function struct {
	Address         string `json:"address" yaml:"address"`
	Vendor          uint16 `json:"vendor" yaml:"vendor"`
	Device          uint16 `json:"device" yaml:"device"`
	SubsystemVendor uint16 `json:"subsystem_vendor" yaml:"subsystem_vendor"`
	SubsystemDevice uint16 `json:"subsystem_device" yaml:"subsystem_device"`
	Class           uint32 `json:"class" yaml:"class"`
	IOMMUGroup      int    `json:"iommu_group" yaml:"iommu_group"` // -1: no IOMMU group
	NUMANode        int    `json:"numa_node" yaml:"numa_node"`
	Driver          string `json:"driver" yaml:"driver"`
	// PhysFn is the address of the physical function when this is an SR-IOV
	// virtual function; sysfs then has a physfn link.
	PhysFn string `json:"physfn,omitempty" yaml:"physfn,omitempty"`
	// NoReset: the kernel has no reset method for it (no reset and
	// reset_method files); otherwise it offers "flr bus".
	NoReset bool `json:"no_reset,omitempty" yaml:"no_reset,omitempty"`
}

// Config is a simulated machine at boot: the host drivers that are
// loaded (vfio-pci is always loaded) and the PCI functions.
type Config struct {
	Drivers []string   `json:"drivers" yaml:"drivers"`
	Devices []Function `json:"devices" yaml:"devices"`
}

// Write is one WriteFile call the Kernel received, successful or not.
type Write struct {
	Name string // the name as the caller passed it
	Data string
	Err  error // what the write returned; nil on success
}

// Kernel is an in-memory Linux PCI and vfio subsystem behind vfio.FS. It
// serves the sysfs tree gpuherd uses and obeys the kernel's semantics for
// driver_override, driver/unbind, drivers/*/bind|unbind, drivers_probe,
// iommu_group and /dev/vfio/N, with the same errno values, so vfio's Binder
// is tested against the rules it will meet on a host. Tests and
// `gpuherd agent --simulate` use it; Hold, Remove and SetConfigAllOnes
// inject the faults real cards show.
//
// It is safe for concurrent use. Like the kernel's device lock, a write
// that blocks (a held unbind) blocks later writes to the same device only.
type Kernel struct {
	mu      sync.Mutex
	path    string // state file; "" keeps the state in memory only
	drivers []string
	devs    map[string]*kdev
	holds   map[string]chan struct{} // closed by Unhold
	blocked map[string]chan struct{} // closed once an unbind waits on the hold (Blocked)
	writes  []Write

	// Simulated processes holding VFIO groups open (kernel_openers.go).
	opens       []*fakeOpen
	nextFD      int
	closed      chan struct{} // closed when a group is closed; nil when nobody waits
	unbindsOpen int

	lockMu sync.Mutex
	locks  map[string]chan struct{} // per-device one-slot semaphores: the kernel's device_lock

	host fakeHost  // interrupt remapping, vfio_iommu_type1 parameters
	subs []*uevSub // PCI uevent subscribers (WatchPCI)
}

// kdev is the live state of one simulated function.
type kdev struct {
	Function             // Driver: the current driver
	Override      string // driver_override; "" when unset
	HostDriver    string // driver that binds it by ID match; "" none
	ConfigAllOnes bool
}

// Host drivers the simulated kernel binds by device ID, after the kernel's
// own id tables: nvidia.ko claims display-class NVIDIA functions and
// NVSwitches, snd_hda_intel HD audio, xhci_hcd xHCI controllers,
// nvidia-gpu (i2c-nvidia-gpu) the UCSI function of a card, pcieport bridges.
func matchHostDriver(vendor uint16, class uint32) string {
	base := class >> 8
	switch {
	case vendor == vfio.VendorNVIDIA && (base == vfio.Class3D>>8 || base == vfio.ClassVGA>>8 || base == vfio.ClassNVSwitch>>8):
		return vfio.DriverNVIDIA
	case base == vfio.ClassAudio>>8:
		return "snd_hda_intel"
	case class == vfio.ClassUSB:
		return "xhci_hcd"
	case vendor == vfio.VendorNVIDIA && class == vfio.ClassSerialBus:
		return "nvidia-gpu"
	case base == vfio.ClassBridge>>8:
		return vfio.DriverPCIePort
	}
	return ""
}

// New boots a simulated machine from cfg. It refuses invalid or
// duplicate addresses, devices bound at boot to a driver that is not
// loaded, vfio-pci devices without an IOMMU group, and dangling physfn.
func New(cfg Config) (*Kernel, error) {
	devs := make([]kdev, 0, len(cfg.Devices))
	for _, fd := range cfg.Devices {
		host := matchHostDriver(fd.Vendor, fd.Class)
		if fd.Driver != "" && fd.Driver != vfio.DriverVFIO {
			// A device the table does not know keeps the driver it
			// booted on as its host driver (a NIC on ixgbe, ...).
			host = fd.Driver
		}
		devs = append(devs, kdev{Function: fd, HostDriver: host})
	}
	return newKernel(cfg.Drivers, devs)
}

func newKernel(drivers []string, devs []kdev) (*Kernel, error) {
	k := &Kernel{
		devs:  make(map[string]*kdev, len(devs)),
		holds: make(map[string]chan struct{}),
		locks: make(map[string]chan struct{}),
	}
	for _, d := range drivers {
		if err := vfio.ValidateDriverName(d); err != nil {
			return nil, fmt.Errorf("vfio: simulated kernel: driver: %w", err)
		}
		k.drivers = append(k.drivers, d)
	}
	k.drivers = append(k.drivers, vfio.DriverVFIO)
	slices.Sort(k.drivers)
	k.drivers = slices.Compact(k.drivers)

	for i := range devs {
		d := devs[i]
		where := fmt.Sprintf("vfio: simulated kernel: device %s", quote(d.Address))
		if err := vfio.ValidateAddress(d.Address); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if _, dup := k.devs[d.Address]; dup {
			return nil, fmt.Errorf("%s: listed twice", where)
		}
		switch {
		case d.Class > 0xffffff:
			return nil, fmt.Errorf("%s: class %#x is wider than 24 bits", where, d.Class)
		case d.IOMMUGroup < -1 || d.IOMMUGroup > vfio.MaxIOMMUGroup:
			return nil, fmt.Errorf("%s: IOMMU group %d out of range (-1 for none)", where, d.IOMMUGroup)
		case d.NUMANode < -1 || d.NUMANode > vfio.MaxNUMANode:
			return nil, fmt.Errorf("%s: NUMA node %d out of range (-1 for unknown)", where, d.NUMANode)
		case d.Driver != "" && !k.loaded(d.Driver):
			return nil, fmt.Errorf("%s: bound to driver %q, which is not loaded (add it to drivers)", where, d.Driver)
		case d.Driver == vfio.DriverVFIO && d.IOMMUGroup < 0:
			return nil, fmt.Errorf("%s: bound to vfio-pci without an IOMMU group, which the kernel never allows", where)
		}
		for _, name := range []string{d.Override, d.HostDriver} {
			if name != "" {
				if err := vfio.ValidateDriverName(name); err != nil {
					return nil, fmt.Errorf("%s: %w", where, err)
				}
			}
		}
		k.devs[d.Address] = &d
	}
	for _, d := range k.devs {
		if d.PhysFn == "" {
			continue
		}
		if _, ok := k.devs[d.PhysFn]; !ok || d.PhysFn == d.Address {
			return nil, fmt.Errorf("vfio: simulated kernel: device %s: physfn %s is not another device of the machine", d.Address, quote(d.PhysFn))
		}
	}
	return k, nil
}

func (k *Kernel) loaded(driver string) bool {
	_, ok := slices.BinarySearch(k.drivers, driver)
	return ok
}

func pathErr(op, name string, errno syscall.Errno) error {
	return &fs.PathError{Op: op, Path: shorten(name), Err: errno}
}

// split turns a cleaned relative name into its elements ("." is the root).
func split(rel string) []string {
	if rel == "." || rel == "" {
		return nil
	}
	return strings.Split(rel, "/")
}

// ReadFile implements vfio.FS.
func (k *Kernel) ReadFile(name string) ([]byte, error) {
	dev, rel, err := vfio.CleanName("read", name)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	var n node
	if dev {
		var ok bool
		if n, ok = k.devNode(split(rel)); !ok {
			return nil, pathErr("read", name, syscall.ENOENT)
		}
	} else if _, n, err = k.resolve("read", name, split(rel), true); err != nil {
		return nil, err
	}
	switch {
	case n.kind == kindDir:
		return nil, pathErr("read", name, syscall.EISDIR)
	case n.kind == kindCharDev:
		return nil, pathErr("read", name, syscall.EINVAL) // vfio group fds only take ioctls
	case !n.readable:
		return nil, pathErr("read", name, syscall.EACCES)
	}
	return slices.Clone(n.content), nil
}

// Readlink implements vfio.FS.
func (k *Kernel) Readlink(name string) (string, error) {
	dev, rel, err := vfio.CleanName("readlink", name)
	if err != nil {
		return "", err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if dev {
		if _, ok := k.devNode(split(rel)); !ok {
			return "", pathErr("readlink", name, syscall.ENOENT)
		}
		return "", pathErr("readlink", name, syscall.EINVAL)
	}
	_, n, err := k.resolve("readlink", name, split(rel), false)
	if err != nil {
		return "", err
	}
	if n.kind != kindLink {
		return "", pathErr("readlink", name, syscall.EINVAL)
	}
	return n.link, nil
}

// ReadDir implements vfio.FS. Names are sorted, as os.ReadDir sorts them.
func (k *Kernel) ReadDir(name string) ([]string, error) {
	dev, rel, err := vfio.CleanName("readdir", name)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	var n node
	if dev {
		var ok bool
		if n, ok = k.devNode(split(rel)); !ok {
			return nil, pathErr("readdir", name, syscall.ENOENT)
		}
	} else if _, n, err = k.resolve("readdir", name, split(rel), true); err != nil {
		return nil, err
	}
	if n.kind != kindDir {
		return nil, pathErr("readdir", name, syscall.ENOTDIR)
	}
	names := slices.Clone(n.entries())
	slices.Sort(names)
	return names, nil
}

// Exists implements vfio.FS; like stat(2) it follows links.
func (k *Kernel) Exists(name string) bool {
	dev, rel, err := vfio.CleanName("stat", name)
	if err != nil {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if dev {
		_, ok := k.devNode(split(rel))
		return ok
	}
	_, _, err = k.resolve("stat", name, split(rel), true)
	return err == nil
}
