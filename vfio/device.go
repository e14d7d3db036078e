package vfio

// Device is one PCI function as sysfs describes it. Each field names the file
// it comes from.
type Device struct {
	Address         string `json:"address"`          // directory name under bus/pci/devices
	Vendor          uint16 `json:"vendor"`           // vendor
	Device          uint16 `json:"device"`           // device
	SubsystemVendor uint16 `json:"subsystem_vendor"` // subsystem_vendor
	SubsystemDevice uint16 `json:"subsystem_device"` // subsystem_device
	Class           uint32 `json:"class"`            // class, 24 bits: 0x030200
	Driver          string `json:"driver"`           // basename of the driver link; "" when unbound
	DriverOverride  string `json:"driver_override"`  // driver_override; "" when "(null)"
	IOMMUGroup      int    `json:"iommu_group"`      // basename of the iommu_group link; -1 when none
	NUMANode        int    `json:"numa_node"`        // numa_node; -1 when unknown
	VirtualFunction bool   `json:"virtual_function"` // physfn link exists
	// PCIeRoot is the PCI root complex the device hangs off ("pci0000:3a",
	// from the devices link's target); "" when the link does not say.
	PCIeRoot string `json:"pcie_root,omitempty"`
}

// PCI vendor IDs and class codes gpuherd cares about.
const (
	VendorNVIDIA = 0x10de

	ClassVGA       = 0x030000 // display controller, VGA compatible
	Class3D        = 0x030200 // display controller, 3D (data-centre GPUs)
	ClassAudio     = 0x040300 // HD audio function of a card
	ClassUSB       = 0x0c0330 // USB-C controller of a card (xHCI)
	ClassSerialBus = 0x0c8000 // UCSI function of a card
	ClassBridge    = 0x060400 // PCI bridge
	ClassNVSwitch  = 0x068000 // bridge, other: NVSwitch
)

// Driver names gpuherd knows.
const (
	DriverVFIO   = "vfio-pci"
	DriverNVIDIA = "nvidia"
)

// IsGPU reports whether d is an NVIDIA physical function of display class
// (VGA or 3D controller). NVSwitches (class 0x0680) and the card's companion
// functions (audio, USB) are not GPUs.
func (d Device) IsGPU() bool {
	base := d.Class >> 8
	return d.Vendor == VendorNVIDIA && !d.VirtualFunction && (base == 0x0300 || base == 0x0302)
}
