package inventory

import (
	"slices"
	"testing"

	"github.com/gpuherd/gpuherd/vfio"
)

// emulatedHost is what QEMU shows a test kernel: no NVIDIA card at all, but
// devices that may stand in for GPUs (tools/test/realkernel).
func emulatedHost() *fakePCI {
	return &fakePCI{devs: []vfio.Device{
		fn("0000:00:03.0", 0x1234, 0x11e8, 0x00ff00, 3, ""),           // edu
		fn("0000:00:04.0", 0x1b36, 0x0005, 0x00ff00, 4, ""),           // pci-testdev
		fn("0000:00:05.0", 0x1af4, 0x1005, 0x00ff00, 5, "virtio-pci"), // virtio-rng
		fn("0000:00:06.0", 0x1b36, 0x000e, vfio.ClassBridge, 6, ""),   // pcie-pci-bridge
		fn("0000:00:07.0", 0x1b36, 0x0005, 0x00ff00, 7, ""),           // another pci-testdev
		fn("0000:00:08.0", 0x1af4, 0x1002, 0x00ff00, 8, "virtio-pci"), // virtio-balloon: not listed
		{Address: "0000:00:09.0", Vendor: 0x1b36, Device: 0x0005, Class: 0x00ff00, IOMMUGroup: 9, NUMANode: -1, VirtualFunction: true},
		fn("0000:00:0a.0", 0x10de, 0x22a3, vfio.ClassNVSwitch, 10, ""), // an NVSwitch listed by mistake
	}}
}

func TestDiscoverGPUDevices(t *testing.T) {
	ids, err := vfio.ParseAllowList([]string{"1234:11e8", "1b36:0005", "1af4:1005", "1b36:000e", "10de:22a3"})
	if err != nil {
		t.Fatal(err)
	}
	gs, err := New(emulatedHost(), WithGPUDevices(ids)).Discover()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"0000:00:03.0", "0000:00:04.0", "0000:00:05.0", "0000:00:07.0"}
	if got := addrs(gs); !slices.Equal(got, want) {
		t.Fatalf("GPUs %v, want %v (no bridge, VF, NVSwitch or unlisted device)", got, want)
	}
	edu := byAddr(t, gs, "0000:00:03.0")
	if edu.Model != "1234:11e8" || edu.KnownModel || edu.VendorID != 0x1234 || edu.MemoryBytes != 0 || !edu.Healthy || edu.IOMMUGroup != 3 {
		t.Errorf("edu: %+v", edu)
	}
	if rng := byAddr(t, gs, "0000:00:05.0"); rng.Model != "1af4:1005" || rng.Driver != "virtio-pci" {
		t.Errorf("virtio-rng: %+v", rng)
	}
	// The catalog is NVIDIA's: a foreign device ID that happens to be an
	// NVIDIA model's must not take that model's name.
	cat, err := ParseCatalog([]byte("models:\n  - name: Fake\n    device_ids: [\"0005\"]\n    memory_bytes: 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	gs, err = New(emulatedHost(), WithGPUDevices(ids), WithCatalog(cat)).Discover()
	if err != nil {
		t.Fatal(err)
	}
	if td := byAddr(t, gs, "0000:00:04.0"); td.Model != "1b36:0005" || td.KnownModel {
		t.Errorf("pci-testdev named from the NVIDIA catalog: %+v", td)
	}
}

func TestDiscoverGPUDevicesDefault(t *testing.T) {
	for name, opts := range map[string][]Option{
		"none":     nil,
		"empty":    {WithGPUDevices(nil)},
		"wildcard": {WithGPUDevices(vfio.AllowList{{Vendor: 0x1b36, AnyDevice: true}})},
	} {
		gs, err := New(emulatedHost(), opts...).Discover()
		if err != nil {
			t.Fatal(err)
		}
		if len(gs) != 0 {
			t.Errorf("%s: emulated devices offered as GPUs: %v", name, addrs(gs))
		}
	}
	// NVIDIA's own GPUs are found as before.
	ids, _ := vfio.ParseAllowList([]string{"1b36:0005"})
	gs, err := New(mixedHost(), WithGPUDevices(ids)).Discover()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := addrs(gs), []string{"0000:1b:00.0", "0000:3b:00.0", "0000:af:00.0"}; !slices.Equal(got, want) {
		t.Errorf("GPUs %v, want %v", got, want)
	}
}
