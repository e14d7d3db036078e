package host

import (
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/vfio"
)

func TestDetectFabric(t *testing.T) {
	sw := func(addr string, dev uint16, driver string) vfio.Device {
		return vfio.Device{Address: addr, Vendor: vfio.VendorNVIDIA, Device: dev, Class: vfio.ClassNVSwitch, Driver: driver}
	}
	gpu := vfio.Device{Address: "0000:18:00.0", Vendor: vfio.VendorNVIDIA, Device: 0x2330, Class: 0x030200, Driver: "vfio-pci"}
	cat := inventory.DefaultCatalog()
	for _, tt := range []struct {
		name     string
		devs     []vfio.Device
		stated   string
		mode     string
		stateful bool
		warn     string
	}{
		{"no switch", []vfio.Device{gpu}, FabricAuto, FabricNone, false, ""},
		{"H100 switches on nvidia", []vfio.Device{gpu, sw("0000:05:00.0", 0x22a3, "nvidia"), sw("0000:06:00.0", 0x22a3, "nvidia")}, FabricAuto, FabricShared, false, ""},
		{"A100 switches on vfio-pci", []vfio.Device{gpu, sw("0000:05:00.0", 0x1af1, "vfio-pci")}, FabricAuto, FabricFullPassthrough, false, "never NVSwitches"},
		{"switches without a driver", []vfio.Device{gpu, sw("0000:05:00.0", 0x22a3, "")}, FabricAuto, FabricUnknown, false, "nvidia-fabricmanager"},
		{"switches on two drivers", []vfio.Device{sw("0000:05:00.0", 0x22a3, "nvidia"), sw("0000:06:00.0", 0x22a3, "vfio-pci")}, FabricAuto, FabricUnknown, false, "no NVLink"},
		// An NVSwitch whose firmware reports another class is still one by ID.
		{"switch by ID", []vfio.Device{{Address: "0000:05:00.0", Vendor: vfio.VendorNVIDIA, Device: 0x22a3, Class: 0x058000, Driver: "nvidia"}}, FabricAuto, FabricShared, false, ""},
		{"stated and agreeing", []vfio.Device{sw("0000:05:00.0", 0x22a3, "nvidia")}, FabricShared, FabricShared, true, ""},
		{"stated and disagreeing", []vfio.Device{sw("0000:05:00.0", 0x22a3, "vfio-pci")}, FabricShared, FabricShared, true, "detection says full-passthrough"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := DetectFabric(tt.devs, cat, tt.stated)
			if f.Mode != tt.mode || f.Stated != tt.stateful {
				t.Errorf("mode %s stated %v, want %s %v (%s)", f.Mode, f.Stated, tt.mode, tt.stateful, f.Why)
			}
			if (tt.warn == "") != (f.Warning == "") || !strings.Contains(f.Warning, tt.warn) {
				t.Errorf("warning %q, want one containing %q", f.Warning, tt.warn)
			}
		})
	}
}

// On a DGX H100 run in shared-NVSwitch mode, a claim that is not one
// Fabric Manager partition is refused when the mode is stated, and served
// with a warning when it was only detected.
