package fakekernel

import (
	"fmt"
	"strconv"

	"github.com/gpuherd/gpuherd/vfio"
)

// fakeHost is what the simulated host reports about passthrough as a
// whole. The zero value is a host ready for it: one Intel DMAR unit with
// interrupt remapping, allow_unsafe_interrupts off.
type fakeHost struct {
	noInterruptRemap bool
	unsafeInterrupts bool
}

// fakeECAP is the extended capability register a simulated DMAR unit
// reports: QEMU's intel-iommu with intremap=on, whose bit 3 is interrupt
// remapping.
const fakeECAP = 0xf00f5e

// intelECAPIRBit is the extended capability register's interrupt remapping
// bit.
const intelECAPIRBit = 1 << 3

// SetInterruptRemapping makes the simulated DMAR unit report interrupt
// remapping (on, the default) or not.
func (k *Kernel) SetInterruptRemapping(on bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.host.noInterruptRemap = !on
}

// SetUnsafeInterrupts sets vfio_iommu_type1's allow_unsafe_interrupts, as
// writing Y or N to its parameter does.
func (k *Kernel) SetUnsafeInterrupts(on bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.host.unsafeInterrupts = on
}

// classNode serves class/iommu/dmar0/intel-iommu/ecap.
func (k *Kernel) classNode(p []string) (node, bool) {
	names := []string{"iommu", "dmar0", "intel-iommu", "ecap"}
	if len(p) > len(names) {
		return node{}, false
	}
	for i, e := range p {
		if e != names[i] {
			return node{}, false
		}
	}
	if len(p) == len(names) {
		ecap := uint64(fakeECAP)
		if k.host.noInterruptRemap {
			ecap &^= intelECAPIRBit
		}
		return roFile([]byte(strconv.FormatUint(ecap, 16) + "\n")), true
	}
	return dirNode(names[len(p)]), true
}

// moduleNode serves module/vfio_iommu_type1/parameters/allow_unsafe_interrupts
// and module/vfio_pci.
func (k *Kernel) moduleNode(p []string) (node, bool) {
	if len(p) == 0 {
		return dirNode("vfio_iommu_type1", "vfio_pci"), true
	}
	switch {
	case p[0] == "vfio_pci" && len(p) == 1:
		return dirNode(), true
	case p[0] != "vfio_iommu_type1":
		return node{}, false
	case len(p) == 1:
		return dirNode("parameters"), true
	case p[1] != "parameters":
		return node{}, false
	case len(p) == 2:
		return dirNode("allow_unsafe_interrupts"), true
	case len(p) == 3 && p[2] == "allow_unsafe_interrupts":
		v := "N\n"
		if k.host.unsafeInterrupts {
			v = "Y\n"
		}
		return roFile([]byte(v)), true
	}
	return node{}, false
}

// resetNode serves a device's reset (write-only) and reset_method files,
// which exist only while the kernel can reset the device.
func resetNode(d *kdev, name string) (node, bool) {
	if d.NoReset {
		return node{}, false
	}
	if name == "reset" {
		return node{kind: kindFile}, true // writable only by the kernel's rules, never by gpuherd
	}
	return roFile([]byte("flr bus\n")), true
}

// Add hot-plugs a PCI function, as a hot-add or a rescan that finds a new
// device does: it appears in its IOMMU group and, when fd.Driver is set,
// bound to that driver (its host driver from then on). The watchers of
// WatchPCI get "add", then "bind".
func (k *Kernel) Add(fd Function) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	where := fmt.Sprintf("vfio: simulated kernel: add %s", quote(fd.Address))
	if err := vfio.ValidateAddress(fd.Address); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if _, dup := k.devs[fd.Address]; dup {
		return fmt.Errorf("%s: already on the bus", where)
	}
	switch {
	case fd.Class > 0xffffff || fd.IOMMUGroup < -1 || fd.IOMMUGroup > vfio.MaxIOMMUGroup || fd.NUMANode < -1 || fd.NUMANode > vfio.MaxNUMANode:
		return fmt.Errorf("%s: class, IOMMU group or NUMA node out of range", where)
	case fd.Driver == vfio.DriverVFIO:
		return fmt.Errorf("%s: a new device does not come up on vfio-pci", where)
	case fd.Driver != "" && !k.loaded(fd.Driver):
		return fmt.Errorf("%s: driver %q is not loaded", where, fd.Driver)
	case fd.PhysFn != "":
		return fmt.Errorf("%s: virtual functions are not hot-added here", where)
	}
	host := matchHostDriver(fd.Vendor, fd.Class)
	if fd.Driver != "" {
		host = fd.Driver
	}
	d := &kdev{Function: fd, HostDriver: host}
	k.devs[fd.Address] = d
	if err := k.save(); err != nil {
		delete(k.devs, fd.Address)
		return fmt.Errorf("%s: save state: %w", where, err)
	}
	k.emit(vfio.PCIEvent{Action: vfio.UeventAdd, Address: fd.Address})
	if fd.Driver != "" {
		k.emit(vfio.PCIEvent{Action: vfio.UeventBind, Address: fd.Address, Driver: fd.Driver})
	}
	return nil
}
