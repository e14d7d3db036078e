package handoff

import "github.com/gpuherd/gpuherd/vfio"

// SysfsDevices decides from sysfs alone, without the agent, whether a host
// PCI function is one of this server's GPUs: an NVIDIA display or 3D
// controller (the rule the agent's inventory uses), a function with one of
// the extra GPU IDs of the agent's gpu_devices setting, or an NVIDIA
// function sharing an IOMMU group with such a GPU (its audio or USB-C
// companion). The hook asks it so that a domain that uses none of them
// starts at once, whether the agent runs or not; a function that cannot be
// read is not one of them (libvirt refuses a hostdev that is not there).
type SysfsDevices struct {
	PCI *vfio.PCI
	// Extra lists vendor:device IDs counted as GPUs (gpu_devices).
	Extra vfio.AllowList
}

// Managed reports whether addr is one of this server's GPUs or a companion
// function of one.
func (s SysfsDevices) Managed(addr string) bool {
	d, err := s.PCI.Device(addr)
	if err != nil || d.VirtualFunction || d.Class>>8 == vfio.ClassBridge>>8 {
		return false
	}
	if d.IsGPU() || s.gpuByID(d) {
		return true
	}
	if d.Vendor != vfio.VendorNVIDIA || d.IOMMUGroup < 0 {
		return false
	}
	members, err := s.PCI.GroupMembers(d.IOMMUGroup)
	if err != nil {
		// A group that cannot be read in full may hold a GPU: the agent,
		// which the hook asks next, knows.
		return true
	}
	for _, m := range members {
		if m.IsGPU() || s.gpuByID(m) {
			return true
		}
	}
	return false
}

func (s SysfsDevices) gpuByID(d vfio.Device) bool {
	for _, e := range s.Extra {
		if !e.AnyDevice && e.Allows(d.Vendor, d.Device) && !d.VirtualFunction && d.Class>>16 != 0x06 {
			return true
		}
	}
	return false
}
