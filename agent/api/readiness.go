package api

// StateUnusable is a GPU that is healthy but cannot be passed through now:
// its IOMMU group holds a device the host uses, the IOMMU is off, vfio-pci
// is missing, or interrupt remapping is off. It is never offered.
const StateUnusable = "unusable"

// Readiness is whether a GPU can be given to a VM, as `gpuherd inventory`
// and the agent decide it alike: blocking problems keep it unusable,
// warnings do not.
type Readiness struct {
	Ready    bool      `json:"ready"`
	Blocking []Problem `json:"blocking,omitempty"`
	Warnings []Problem `json:"warnings,omitempty"`
}

// Problem is one reason a GPU is not ready, or one warning about it, with
// what the operator can do.
type Problem struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Fix     string `json:"fix"`
	// BlockingDevice is the PCI function that blocks the GPU, when one does.
	BlockingDevice *PCIDevice `json:"blocking_device,omitempty"`
}

// PCIDevice names a PCI function; IDs and class in lower-case hex.
type PCIDevice struct {
	PCIAddress string `json:"pci_address"`
	Vendor     string `json:"vendor"`
	Device     string `json:"device"`
	Class      string `json:"class"`
	Driver     string `json:"driver"`
}
