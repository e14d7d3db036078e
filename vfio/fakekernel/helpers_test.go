package fakekernel_test

import (
	"context"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// Addresses of the simulated machine used across the tests, as in vfio's.
const (
	gpuA   = "0000:3b:00.0" // H100 SXM5, group 12
	audioA = "0000:3b:00.1" // its HD audio function, group 12
	gpuB   = "0000:5e:00.0" // L40S, group 30
)

func gpu(addr string, group int, driver string) fakekernel.Function {
	return fakekernel.Function{Address: addr, Vendor: vfio.VendorNVIDIA, Device: 0x2330, SubsystemVendor: vfio.VendorNVIDIA, SubsystemDevice: 0x16c1,
		Class: vfio.Class3D, IOMMUGroup: group, NUMANode: 0, Driver: driver}
}

func audio(addr string, group int, driver string) fakekernel.Function {
	return fakekernel.Function{Address: addr, Vendor: vfio.VendorNVIDIA, Device: 0x22ba, Class: vfio.ClassAudio, IOMMUGroup: group, NUMANode: 0, Driver: driver}
}

// hostDrivers are loaded on the simulated hosts unless a test says otherwise.
var hostDrivers = []string{"nvidia", "snd_hda_intel", "xhci_hcd", "ixgbe", "pcieport"}

func bootKernel(t *testing.T, devs ...fakekernel.Function) *fakekernel.Kernel {
	t.Helper()
	k, err := fakekernel.New(fakekernel.Config{Drivers: hostDrivers, Devices: devs})
	if err != nil {
		t.Fatalf("fakekernel.New: %v", err)
	}
	return k
}

// driverOf reads where a device is bound through vfio's reader.
func driverOf(t *testing.T, f vfio.FS, addr string) (driver, override string) {
	t.Helper()
	d, err := vfio.New(f).Device(addr)
	if err != nil {
		t.Fatalf("Device(%s): %v", addr, err)
	}
	return d.Driver, d.DriverOverride
}

// testCtx is a context that ends before the test binary's own timeout, so a
// hang fails one test with a message instead of killing the run.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// devicePath is the sysfs name of attr in the directory of the device at
// addr, as vfio builds it.
func devicePath(addr, attr string) string {
	if attr == "" {
		return "bus/pci/devices/" + addr
	}
	return "bus/pci/devices/" + addr + "/" + attr
}

// driversProbe is the PCI bus's drivers_probe attribute.
const driversProbe = "bus/pci/drivers_probe"
