package vfio

import (
	"encoding/json"
	"testing"
)

// A device in JSON uses gpuherd's vocabulary: pci_address, hex IDs.
func TestDeviceJSON(t *testing.T) {
	d := Device{Address: "0000:18:00.1", Vendor: 0x10de, Device: 0x22ba, SubsystemVendor: 0x10de, Class: 0x040300,
		Driver: "snd_hda_intel", IOMMUGroup: 16, NUMANode: -1}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"pci_address":"0000:18:00.1","driver":"snd_hda_intel","driver_override":"","iommu_group":16,"numa_node":-1,"virtual_function":false,"vendor":"10de","device":"22ba","subsystem_vendor":"10de","subsystem_device":"0000","class":"040300"}`
	if string(b) != want {
		t.Errorf("JSON:\n got %s\nwant %s", b, want)
	}
}
