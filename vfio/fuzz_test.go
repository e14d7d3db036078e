package vfio_test

import (
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// FuzzParsers feeds arbitrary bytes to every sysfs value parser: they must
// return an error or a value, never panic, and what they accept must be
// what sysfs can print.
func FuzzParsers(f *testing.F) {
	for _, s := range []string{"0x10de\n", "0x030200\n", "-1\n", "(null)\n", "vfio-pci\n", "../../../bus/pci/drivers/nvidia",
		"../../../kernel/iommu_groups/12", "", "\x00", "0x", "0xffffffffffffffffff", "../", strings.Repeat("/", 5000)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := vfio.ParseClass(b); err == nil && v > 0xffffff {
			t.Errorf("parseClass(%q) = %#x, wider than 24 bits", b, v)
		}
		_, _ = vfio.ParseID(b)
		if n, err := vfio.ParseNUMANode(b); err == nil && n < -1 {
			t.Errorf("parseNUMANode(%q) = %d", b, n)
		}
		if s, err := vfio.ParseDriverOverride(b); err == nil && strings.Contains(s, "\n") {
			t.Errorf("parseDriverOverride(%q) = %q, more than one line", b, s)
		}
		if s, err := vfio.ParseDriverLink(string(b)); err == nil && (strings.Contains(s, "/") || s == ".." || s == ".") {
			t.Errorf("parseDriverLink(%q) = %q, not a path element", b, s)
		}
		if g, err := vfio.ParseGroupLink(string(b)); err == nil && g < 0 {
			t.Errorf("parseGroupLink(%q) = %d", b, g)
		}
	})
}

// FuzzValidateAddress checks that an accepted address builds a path that
// stays in its device's directory, and that nothing else is accepted.
func FuzzValidateAddress(f *testing.F) {
	for _, s := range []string{"0000:3b:00.0", "0000:3B:00.0", "../", "0000:3b:00.0/../../x", "", "\x00", "00000000:3B:00.0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := vfio.ValidateAddress(s)
		if (err == nil) != vfio.AddressRE.MatchString(s) {
			t.Fatalf("ValidateAddress(%q) = %v, disagrees with %s", s, err, vfio.AddressPattern)
		}
		if err == nil {
			name := vfio.DevicePath(s, "driver_override")
			_, rel, cerr := vfio.CleanName("write", name)
			if cerr != nil || rel != name {
				t.Errorf("path %q of a valid address cleans to %q, %v", name, rel, cerr)
			}
		} else if len(err.Error()) > 400 {
			t.Errorf("error for %d-byte input is %d bytes long", len(s), len(err.Error()))
		}
		if a, err := vfio.AddressFromNVMLBusID(s); err == nil && vfio.ValidateAddress(a) != nil {
			t.Errorf("AddressFromNVMLBusID(%q) = %q, not a valid address", s, a)
		}
	})
}

// FuzzCleanName checks the one rule every FS relies on: a cleaned name
// never leaves its root.
func FuzzCleanName(f *testing.F) {
	for _, s := range []string{"bus/pci/devices", "/dev/vfio/12", "../x", "/dev/../etc/passwd", "a/../../b", "/etc", "/dev", "/dev//", "/dev//vfio", "", "a\x00b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, rel, err := vfio.CleanName("open", s)
		if err != nil {
			return
		}
		if rel == ".." || strings.HasPrefix(rel, "../") || strings.HasPrefix(rel, "/") || strings.ContainsRune(rel, 0) {
			t.Errorf("CleanName(%q) = %q escapes its root", s, rel)
		}
	})
}

// FuzzKernelFS throws arbitrary names and data at the simulated kernel: it
// must answer with an error or a result, never panic, and whatever the
// writes did, the tree must still read back as well-formed devices.
func FuzzKernelFS(f *testing.F) {
	f.Add("bus/pci/devices/0000:3b:00.0/driver_override", "vfio-pci")
	f.Add("bus/pci/drivers_probe", "0000:3b:00.0\n")
	f.Add("bus/pci/devices/0000:3b:00.0/driver/unbind", "0000:3b:00.1")
	f.Add("bus/pci/drivers/vfio-pci/bind", "0000:3b:00.0")
	f.Add("devices/pci0000:00/0000:3b:00.0/iommu_group/devices/0000:3b:00.1/driver", "")
	f.Add("kernel/iommu_groups/12/devices/0000:3b:00.0/../../../../bus", "x")
	f.Add("/dev/vfio/12", "")
	f.Add("bus/pci/devices/0000:3b:00.0/driver_override", "0000 0000") // once hid the device
	f.Fuzz(func(t *testing.T, name, data string) {
		k, err := fakekernel.New(fakekernel.Config{Drivers: hostDrivers, Devices: []fakekernel.Function{gpu(gpuA, 12, "nvidia"), audio(audioA, 12, "")}})
		if err != nil {
			t.Fatal(err)
		}
		_ = k.WriteFile(name, []byte(data))
		_, _ = k.ReadFile(name)
		_, _ = k.Readlink(name)
		_, _ = k.ReadDir(name)
		_ = k.Exists(name)
		devs, err := vfio.New(k).Devices()
		if err != nil || len(devs) != 2 {
			t.Fatalf("after writing %q to %q: Devices() = %v, %v", data, name, devs, err)
		}
		onVFIO := false
		for _, d := range devs {
			onVFIO = onVFIO || d.Driver == vfio.DriverVFIO
		}
		if k.Exists("/dev/vfio/12") != onVFIO {
			t.Fatalf("after writing %q to %q: /dev/vfio/12 exists = %v, a member on vfio-pci = %v", data, name, !onVFIO, onVFIO)
		}
	})
}
