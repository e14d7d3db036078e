package vfio

import (
	"encoding/json"
	"fmt"
)

// MarshalJSON writes a device in the vocabulary of every gpuherd command:
// pci_address, and IDs and class as the lower-case hex people read in
// lspci ("10de", "26b9", "030200"), not as decimal numbers.
func (d Device) MarshalJSON() ([]byte, error) {
	type plain Device // the same fields, without this method
	return json.Marshal(struct {
		PCIAddress string `json:"pci_address"`
		plain
		Address         string `json:"address,omitempty"` // hidden by the empty value below
		Vendor          string `json:"vendor"`
		Device          string `json:"device"`
		SubsystemVendor string `json:"subsystem_vendor"`
		SubsystemDevice string `json:"subsystem_device"`
		Class           string `json:"class"`
	}{
		PCIAddress:      d.Address,
		plain:           plain(d),
		Vendor:          fmt.Sprintf("%04x", d.Vendor),
		Device:          fmt.Sprintf("%04x", d.Device),
		SubsystemVendor: fmt.Sprintf("%04x", d.SubsystemVendor),
		SubsystemDevice: fmt.Sprintf("%04x", d.SubsystemDevice),
		Class:           fmt.Sprintf("%06x", d.Class),
	})
}
