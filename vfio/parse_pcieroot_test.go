package vfio

import "testing"

func TestPCIeRootFromTheDevicesLink(t *testing.T) {
	for target, want := range map[string]string{
		"../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0": "pci0000:3a",
		"../../../devices/pci0000:00/0000:00:02.0":              "pci0000:00",
		"../../../devices/pcia000:0f/a000:0f:00.0":              "pcia000:0f",
		"../../../devices/platform/fpga/0000:01:00.0":           "",
		"../../../devices/pci0000:3G/0000:3a:00.0":              "",
		"": "",
	} {
		if got := pcieRoot(target); got != want {
			t.Errorf("pcieRoot(%q) = %q, want %q", target, got, want)
		}
	}
}
