package vfio

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"strconv"
)

// PCI reads PCI functions and IOMMU groups through an FS.
type PCI struct {
	fs  FS
	log *slog.Logger
}

// Option configures a PCI.
type Option func(*PCI)

// WithLogger sets the logger for what the scan skips or finds odd.
func WithLogger(l *slog.Logger) Option {
	return func(p *PCI) {
		if l != nil {
			p.log = l
		}
	}
}

// New returns a PCI reader over fs (NewOSFS("/sys", "/dev") on a host, a
// *fakekernel.Kernel in tests and simulation).
func New(fs FS, opts ...Option) *PCI {
	p := &PCI{fs: fs, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Devices returns every PCI function under bus/pci/devices, sorted by
// address. A function that cannot be read (a hostile name, garbage in an
// attribute, or one that vanished mid-scan) is logged at warning level and
// left out: one bad device must not hide every good one from the inventory.
// Only a failure to list the directory itself is an error.
func (p *PCI) Devices() ([]Device, error) {
	names, err := p.fs.ReadDir(pciDevicesDir)
	if err != nil {
		return nil, fmt.Errorf("vfio: list PCI devices in %s: %w (is the sysfs root right?)", pciDevicesDir, err)
	}
	devs := make([]Device, 0, len(names))
	for _, name := range names {
		if err := ValidateAddress(name); err != nil {
			p.log.Warn("skipping PCI device with an invalid name", "name", quote(name), "err", err)
			continue
		}
		d, err := p.Device(name)
		if err != nil {
			level := slog.LevelWarn
			if errors.Is(err, ErrVanished) {
				level = slog.LevelInfo // hot-unplug during the scan is not a fault
			}
			p.log.Log(context.Background(), level, "skipping unreadable PCI device", "pci_address", name, "err", err)
			continue
		}
		devs = append(devs, d)
	}
	slices.SortFunc(devs, byAddress)
	return devs, nil
}

// Device reads the function at addr. The error wraps ErrInvalidAddress for a
// bad address (nothing is read then), ErrVanished when the device directory
// does not exist, ErrMalformed when an attribute holds garbage.
func (p *PCI) Device(addr string) (Device, error) {
	r, d, err := p.openDevice(addr)
	if err != nil {
		return Device{}, err
	}
	ids := []struct {
		attr     string
		dst      *uint16
		optional bool
	}{
		{"vendor", &d.Vendor, false},
		{"device", &d.Device, false},
		{"subsystem_vendor", &d.SubsystemVendor, true},
		{"subsystem_device", &d.SubsystemDevice, true},
	}
	for _, id := range ids {
		if *id.dst, err = r.id(id.attr, id.optional); err != nil {
			return Device{}, err
		}
	}

	b, err := p.fs.ReadFile(devicePath(addr, "class"))
	if err != nil {
		return Device{}, r.fail("read class", err)
	}
	if d.Class, err = parseClass(b); err != nil {
		return Device{}, r.fail("parse class", err)
	}

	// numa_node only exists on NUMA kernels, driver_override on kernels
	// since 3.16; both are optional.
	if b, err := p.fs.ReadFile(devicePath(addr, "numa_node")); err == nil {
		if d.NUMANode, err = parseNUMANode(b); err != nil {
			return Device{}, r.fail("parse numa_node", err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Device{}, r.fail("read numa_node", err)
	}
	if b, err := p.fs.ReadFile(devicePath(addr, "driver_override")); err == nil {
		if d.DriverOverride, err = parseDriverOverride(b); err != nil {
			return Device{}, r.fail("parse driver_override", err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Device{}, r.fail("read driver_override", err)
	}

	if d.Driver, err = p.driver(addr); err != nil {
		return Device{}, r.fail("read driver link", err)
	}
	if d.IOMMUGroup, err = r.group(); err != nil {
		return Device{}, err
	}
	d.VirtualFunction = p.fs.Exists(devicePath(addr, "physfn"))
	// Optional: a tree without the devices link (a fixture, a container)
	// simply has no root to name.
	if t, err := p.fs.Readlink(devicePath(addr, "")); err == nil {
		d.PCIeRoot = pcieRoot(t)
	}
	if err := r.stillThere(); err != nil {
		return Device{}, err
	}
	return d, nil
}

// identity reads of the function at addr only what its group's lock is
// taken by: its vendor and device IDs, for the allow list, and its IOMMU
// group (-1 without one). Its errors are Device's for the same attributes.
// The Device it returns holds nothing else: the rest is read under the lock.
func (p *PCI) identity(addr string) (Device, error) {
	r, d, err := p.openDevice(addr)
	if err != nil {
		return Device{}, err
	}
	if d.Vendor, err = r.id("vendor", false); err != nil {
		return Device{}, err
	}
	if d.Device, err = r.id("device", false); err != nil {
		return Device{}, err
	}
	if d.IOMMUGroup, err = r.group(); err != nil {
		return Device{}, err
	}
	if err := r.stillThere(); err != nil {
		return Device{}, err
	}
	return d, nil
}

// deviceReader reads the attributes of one function; its errors are
// *DeviceError.
type deviceReader struct {
	p         *PCI
	addr, dir string
}

// openDevice checks addr and that its directory exists, and returns a
// reader of its attributes and a Device that knows only its address.
func (p *PCI) openDevice(addr string) (deviceReader, Device, error) {
	if err := ValidateAddress(addr); err != nil {
		return deviceReader{}, Device{}, err
	}
	r := deviceReader{p: p, addr: addr, dir: devicePath(addr, "")}
	if !p.fs.Exists(r.dir) {
		return deviceReader{}, Device{}, &DeviceError{Address: addr, Op: "read", Err: ErrVanished}
	}
	return r, Device{Address: addr, IOMMUGroup: -1, NUMANode: -1}, nil
}

// fail is the error of op on the function.
func (r deviceReader) fail(op string, err error) error {
	// An attribute read failing because the whole directory went away
	// is a hot-unplug, not a malformed device.
	if errors.Is(err, fs.ErrNotExist) && !r.p.fs.Exists(r.dir) {
		err = ErrVanished
	}
	return &DeviceError{Address: r.addr, Op: op, Err: err}
}

// id reads a hex ID attribute; an optional one that does not exist is 0.
func (r deviceReader) id(attr string, optional bool) (uint16, error) {
	b, err := r.p.fs.ReadFile(devicePath(r.addr, attr))
	if err != nil {
		if optional && errors.Is(err, fs.ErrNotExist) && r.p.fs.Exists(r.dir) {
			return 0, nil
		}
		return 0, r.fail("read "+attr, err)
	}
	v, err := parseID(b)
	if err != nil {
		return 0, r.fail("parse "+attr, err)
	}
	return v, nil
}

// group reads the IOMMU group link: -1 when there is none.
func (r deviceReader) group() (int, error) {
	t, err := r.p.fs.Readlink(devicePath(r.addr, "iommu_group"))
	if errors.Is(err, fs.ErrNotExist) {
		return -1, nil
	}
	if err != nil {
		return -1, r.fail("read iommu_group link", err)
	}
	g, err := parseGroupLink(t)
	if err != nil {
		return -1, r.fail("parse iommu_group link", err)
	}
	return g, nil
}

// stillThere is the last check of a read: the directory may have gone
// while it was read, and a half-read device must not be reported present.
func (r deviceReader) stillThere() error {
	if !r.p.fs.Exists(r.dir) {
		return r.fail("read", ErrVanished)
	}
	return nil
}

// driver returns the name of the driver addr is bound to, "" when none.
func (p *PCI) driver(addr string) (string, error) {
	t, err := p.fs.Readlink(devicePath(addr, "driver"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return parseDriverLink(t)
}

// GroupMembers returns the functions of IOMMU group group, sorted by
// address. Unlike Devices it fails when any member cannot be read: callers
// decide whether a group may be handed to a VM, and a member they cannot
// see is a member they cannot vouch for.
func (p *PCI) GroupMembers(group int) ([]Device, error) {
	if group < 0 || group > MaxIOMMUGroup {
		return nil, fmt.Errorf("vfio: IOMMU group %d: %w: not a group number", group, ErrMalformed)
	}
	dir := iommuGroupDir + "/" + strconv.Itoa(group) + "/devices"
	names, err := p.fs.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("vfio: IOMMU group %d: list %s: %w", group, dir, err)
	}
	devs := make([]Device, 0, len(names))
	for _, name := range names {
		if err := ValidateAddress(name); err != nil {
			return nil, fmt.Errorf("vfio: IOMMU group %d: member name: %w", group, err)
		}
		d, err := p.Device(name)
		if err != nil {
			return nil, fmt.Errorf("vfio: IOMMU group %d: %w", group, err)
		}
		if d.IOMMUGroup != group {
			return nil, fmt.Errorf("vfio: IOMMU group %d: member %s says it is in group %d: %w (groups changed during the read, retry)",
				group, name, d.IOMMUGroup, ErrMalformed)
		}
		devs = append(devs, d)
	}
	slices.SortFunc(devs, byAddress)
	return devs, nil
}

// configAllOnesLen is how much of config space Health looks at: vendor and
// device ID, which read as 0xffff each once a card stops answering.
const configAllOnesLen = 4

// Health reports whether the function at addr is still on the bus: it
// returns an error wrapping ErrVanished when its directory is gone and
// ErrConfigAllOnes when its config space reads ff ff ff ff (the card fell
// off the bus: link down, reset failed, or it lost power).
func (p *PCI) Health(addr string) error {
	if err := ValidateAddress(addr); err != nil {
		return err
	}
	dir := devicePath(addr, "")
	if !p.fs.Exists(dir) {
		return &DeviceError{Address: addr, Op: "health", Err: ErrVanished}
	}
	b, err := p.fs.ReadFile(devicePath(addr, "config"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && !p.fs.Exists(dir) {
			err = ErrVanished
		}
		return &DeviceError{Address: addr, Op: "health: read config", Err: err}
	}
	if len(b) < configAllOnesLen {
		return &DeviceError{Address: addr, Op: "health: read config",
			Err: fmt.Errorf("%w: config space is %d bytes, want at least %d", ErrMalformed, len(b), configAllOnesLen)}
	}
	if b[0] == 0xff && b[1] == 0xff && b[2] == 0xff && b[3] == 0xff {
		return &DeviceError{Address: addr, Op: "health", Err: ErrConfigAllOnes}
	}
	return nil
}

func byAddress(a, b Device) int { return cmp.Compare(a.Address, b.Address) }
