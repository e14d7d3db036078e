// Package vfio reads PCI devices from sysfs and moves them, a whole IOMMU
// group at a time, between their host drivers and vfio-pci.
//
// Every read and write goes through FS, rooted at a configurable path, so the
// same code runs against the real /sys, a directory tree laid out like it, or
// the in-memory kernel of package vfio/fakekernel, which obeys the kernel's
// semantics for driver_override, driver/unbind, drivers/*/bind,
// drivers_probe, iommu_group and /dev/vfio/N.
//
// The pieces:
//   - NewOSFS is the real FS; fakekernel.Kernel is the simulated one (with
//     fault injection: Hold, Remove, SetConfigAllOnes).
//   - PCI (New) enumerates devices and IOMMU groups and checks health.
//   - Binder (NewBinder) moves groups to vfio-pci (Bind) and back to the idle
//     policy (Release), refusing before any write when a group cannot be
//     made viable, and never writing to a device not on its AllowList.
//
// Safety rules that hold everywhere: an address is checked against
// AddressPattern before a path is built from it, whether it came from a
// caller or from sysfs; writes only target a device's own driver_override
// and driver/unbind, bus/pci/drivers_probe and bus/pci/drivers/<name>/bind;
// new_id is never used, since it would capture every card with that ID.
//
// A sysfs write can block forever (unbinding a GPU from nvidia while
// something holds it). The Binder gives each write a deadline and, when it
// passes, reports ErrStuck and leaves the blocked goroutine behind on
// purpose: a write(2) cannot be cancelled. It completes whenever the kernel
// returns; until then the device is listed by Binder.Stuck and nothing more
// is written to it.
package vfio
