package fakekernel_test

import (
	"errors"
	"io/fs"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// TestKernelSemantics checks the simulated kernel against the PCI core's
// sysfs ABI (Documentation/ABI/testing/sysfs-bus-pci) one write at a time.
func TestKernelSemantics(t *testing.T) {
	type write struct{ name, data string }
	tests := []struct {
		name    string
		dev     fakekernel.Function
		writes  []write // all but the last must succeed
		wantErr error   // of the last write
		driver  string  // afterwards
		ovr     string  // afterwards
	}{
		{
			name:   "driver_override alone does not unbind",
			dev:    gpu(gpuA, 12, "nvidia"),
			writes: []write{{devicePath(gpuA, "driver_override"), "vfio-pci"}},
			driver: "nvidia", ovr: "vfio-pci",
		},
		{
			name:   "a newline clears driver_override",
			dev:    gpu(gpuA, 12, "nvidia"),
			writes: []write{{devicePath(gpuA, "driver_override"), "vfio-pci"}, {devicePath(gpuA, "driver_override"), "\n"}},
			driver: "nvidia",
		},
		{
			name:   "an empty write clears driver_override",
			dev:    gpu(gpuA, 12, "nvidia"),
			writes: []write{{devicePath(gpuA, "driver_override"), "vfio-pci\n"}, {devicePath(gpuA, "driver_override"), ""}},
			driver: "nvidia",
		},
		{
			name:   "drivers_probe binds the override driver",
			dev:    gpu(gpuA, 12, ""),
			writes: []write{{devicePath(gpuA, "driver_override"), "vfio-pci"}, {driversProbe, gpuA + "\n"}},
			driver: vfio.DriverVFIO, ovr: vfio.DriverVFIO,
		},
		{
			name:   "drivers_probe binds the host driver by ID without an override",
			dev:    gpu(gpuA, 12, ""),
			writes: []write{{driversProbe, gpuA}},
			driver: "nvidia",
		},
		{
			name:   "drivers_probe on a bound device is a no-op",
			dev:    gpu(gpuA, 12, "nvidia"),
			writes: []write{{devicePath(gpuA, "driver_override"), "vfio-pci"}, {driversProbe, gpuA}},
			driver: "nvidia", ovr: vfio.DriverVFIO,
		},
		{
			name:   `override "none" keeps every driver away`,
			dev:    gpu(gpuA, 12, ""),
			writes: []write{{devicePath(gpuA, "driver_override"), "none"}, {driversProbe, gpuA}},
			driver: "", ovr: "none",
		},
		{
			name:   "vfio-pci without an IOMMU group: probe succeeds, binds nothing",
			dev:    gpu(gpuA, -1, ""),
			writes: []write{{devicePath(gpuA, "driver_override"), "vfio-pci"}, {driversProbe, gpuA}},
			driver: "", ovr: vfio.DriverVFIO,
		},
		{
			name:    "vfio-pci bind without an IOMMU group is EINVAL",
			dev:     gpu(gpuA, -1, ""),
			writes:  []write{{devicePath(gpuA, "driver_override"), "vfio-pci"}, {"bus/pci/drivers/vfio-pci/bind", gpuA}},
			wantErr: syscall.EINVAL,
			ovr:     vfio.DriverVFIO,
		},
		{
			name:    "vfio-pci never binds by ID",
			dev:     gpu(gpuA, 12, ""),
			writes:  []write{{"bus/pci/drivers/vfio-pci/bind", gpuA}},
			wantErr: syscall.ENODEV,
		},
		{
			name:    "bind to a driver other than the override is ENODEV",
			dev:     gpu(gpuA, 12, ""),
			writes:  []write{{devicePath(gpuA, "driver_override"), "vfio-pci"}, {"bus/pci/drivers/nvidia/bind", gpuA}},
			wantErr: syscall.ENODEV,
			ovr:     vfio.DriverVFIO,
		},
		{
			name:    "bind to a driver that does not match is ENODEV",
			dev:     gpu(gpuA, 12, ""),
			writes:  []write{{"bus/pci/drivers/snd_hda_intel/bind", gpuA}},
			wantErr: syscall.ENODEV,
		},
		{
			name:    "bind of a bound device is EBUSY",
			dev:     gpu(gpuA, 12, "nvidia"),
			writes:  []write{{"bus/pci/drivers/nvidia/bind", gpuA}},
			wantErr: syscall.EBUSY,
			driver:  "nvidia",
		},
		{
			name:    "unbind from a driver the device is not on is ENODEV",
			dev:     gpu(gpuA, 12, "nvidia"),
			writes:  []write{{"bus/pci/drivers/vfio-pci/unbind", gpuA}},
			wantErr: syscall.ENODEV,
			driver:  "nvidia",
		},
		{
			name:   "unbind through the drivers directory",
			dev:    gpu(gpuA, 12, "nvidia"),
			writes: []write{{"bus/pci/drivers/nvidia/unbind", gpuA}},
		},
		{
			name:    "driver/unbind of an unbound device does not exist",
			dev:     gpu(gpuA, 12, ""),
			writes:  []write{{devicePath(gpuA, "driver/unbind"), gpuA}},
			wantErr: fs.ErrNotExist,
		},
		{
			name:    "bind of an unknown device is ENODEV",
			dev:     gpu(gpuA, 12, ""),
			writes:  []write{{"bus/pci/drivers/nvidia/bind", "0000:99:00.0"}},
			wantErr: syscall.ENODEV,
		},
		{
			name:    "read-only attributes are EACCES",
			dev:     gpu(gpuA, 12, "nvidia"),
			writes:  []write{{devicePath(gpuA, "vendor"), "0x1002"}},
			wantErr: syscall.EACCES,
			driver:  "nvidia",
		},
		{
			name:    "new_id does not exist: gpuherd never needs it",
			dev:     gpu(gpuA, 12, ""),
			writes:  []write{{"bus/pci/drivers/vfio-pci/new_id", "10de 2330"}},
			wantErr: fs.ErrNotExist,
		},
		{
			name:    "a driver that is not loaded has no directory",
			dev:     gpu(gpuA, 12, ""),
			writes:  []write{{"bus/pci/drivers/nouveau/bind", gpuA}},
			wantErr: fs.ErrNotExist,
		},
		{
			name:    "names outside the root are refused",
			dev:     gpu(gpuA, 12, "nvidia"),
			writes:  []write{{"bus/pci/../../../etc/passwd", "x"}},
			wantErr: vfio.ErrInvalidPath,
			driver:  "nvidia",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := bootKernel(t, tt.dev)
			for i, w := range tt.writes {
				err := k.WriteFile(w.name, []byte(w.data))
				if i < len(tt.writes)-1 && err != nil {
					t.Fatalf("write %q to %s: %v", w.data, w.name, err)
				}
				if i == len(tt.writes)-1 && (!errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil)) {
					t.Fatalf("last write: %v, want %v", err, tt.wantErr)
				}
			}
			if d, o := driverOf(t, k, tt.dev.Address); d != tt.driver || o != tt.ovr {
				t.Errorf("on %q override %q, want %q override %q", d, o, tt.driver, tt.ovr)
			}
		})
	}
}

func TestKernelTree(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, vfio.DriverVFIO), audio(audioA, 12, "snd_hda_intel"), gpu(gpuB, 30, "nvidia"),
		fakekernel.Function{Address: "0000:5e:00.4", Vendor: vfio.VendorNVIDIA, Device: 0x2330, Class: vfio.Class3D, IOMMUGroup: 31, NUMANode: 0, PhysFn: gpuB})

	read := func(name string) string {
		t.Helper()
		b, err := k.ReadFile(name)
		if err != nil {
			t.Fatalf("ReadFile(%s): %v", name, err)
		}
		return string(b)
	}
	link := func(name string) string {
		t.Helper()
		s, err := k.Readlink(name)
		if err != nil {
			t.Fatalf("Readlink(%s): %v", name, err)
		}
		return s
	}
	dir := func(name string) string {
		t.Helper()
		s, err := k.ReadDir(name)
		if err != nil {
			t.Fatalf("ReadDir(%s): %v", name, err)
		}
		return strings.Join(s, " ")
	}
	checks := []struct{ got, want string }{
		{read(devicePath(gpuA, "vendor")), "0x10de\n"},
		{read(devicePath(gpuA, "class")), "0x030200\n"},
		{read(devicePath(gpuA, "numa_node")), "0\n"},
		{read(devicePath(gpuA, "driver_override")), "(null)\n"},
		{read("bus/pci/drivers/vfio-pci/" + gpuA + "/device"), "0x2330\n"},
		{read("kernel/iommu_groups/12/devices/" + audioA + "/class"), "0x040300\n"},
		{read(devicePath(gpuA, "iommu_group/devices/"+audioA+"/vendor")), "0x10de\n"},
		{link(devicePath(gpuA, "driver")), "../../../bus/pci/drivers/vfio-pci"},
		{link(devicePath(gpuA, "iommu_group")), "../../../kernel/iommu_groups/12"},
		{link(devicePath(gpuA, "")), "../../../devices/pci0000:00/0000:3b:00.0"},
		{link(devicePath("0000:5e:00.4", "physfn")), "../" + gpuB},
		{link("kernel/iommu_groups/12/devices/" + gpuA), "../../../../devices/pci0000:00/0000:3b:00.0"},
		{dir("kernel/iommu_groups"), "12 30 31"},
		{dir("kernel/iommu_groups/12/devices"), gpuA + " " + audioA},
		{dir("bus/pci/drivers/vfio-pci"), gpuA + " bind unbind"},
		{dir("bus/pci/drivers"), "ixgbe nvidia pcieport snd_hda_intel vfio-pci xhci_hcd"},
		{dir(devicePath(gpuB, "")), "class config device driver driver_override iommu_group numa_node reset reset_method subsystem_device subsystem_vendor vendor"},
		{dir("/dev/vfio"), "12 vfio"},
	}
	for i, c := range checks {
		if c.got != c.want {
			t.Errorf("check %d: got %q, want %q", i, c.got, c.want)
		}
	}
	cfg := []byte(read(devicePath(gpuA, "config")))
	if len(cfg) != 256 || cfg[0] != 0xde || cfg[1] != 0x10 || cfg[2] != 0x30 || cfg[3] != 0x23 || cfg[0x0b] != 0x03 {
		t.Errorf("config space header % x", cfg[:16])
	}
	errs := []struct {
		err  error
		want error
	}{
		{errOf(k.ReadFile(devicePath(gpuA, "nope"))), fs.ErrNotExist},
		{errOf(k.ReadFile(devicePath(gpuA, ""))), syscall.EISDIR},
		{errOf(k.ReadFile(driversProbe)), syscall.EACCES},
		{errOf(k.ReadFile("/dev/vfio/12")), syscall.EINVAL},
		{errOf(k.Readlink(devicePath(gpuA, "vendor"))), syscall.EINVAL},
		{errOf(k.ReadDir(devicePath(gpuA, "vendor"))), syscall.ENOTDIR},
		{errOf(k.ReadFile(devicePath(gpuA, "vendor/x"))), syscall.ENOTDIR},
		{errOf(k.ReadFile("/etc/passwd")), vfio.ErrInvalidPath},
		{errOf(k.ReadFile("/dev/../etc/passwd")), vfio.ErrInvalidPath},
	}
	for i, e := range errs {
		if !errors.Is(e.err, e.want) {
			t.Errorf("error %d: %v, want %v", i, e.err, e.want)
		}
	}
	if k.Exists("/dev/vfio/30") || !k.Exists("/dev/vfio/vfio") || !k.Exists(devicePath(gpuA, "driver")) || k.Exists(devicePath(gpuB, "physfn")) {
		t.Error("Exists disagrees with the tree")
	}
}

func errOf[T any](_ T, err error) error { return err }

func TestKernelVFIODeviceNodeFollowsBinding(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, ""), audio(audioA, 12, ""))
	steps := []struct {
		name, data string
		want       bool
	}{
		{devicePath(gpuA, "driver_override"), "vfio-pci", false},
		{driversProbe, gpuA, true},
		{devicePath(audioA, "driver_override"), "vfio-pci", true},
		{driversProbe, audioA, true},
		{"bus/pci/drivers/vfio-pci/unbind", gpuA, true}, // audio still holds the group
		{"bus/pci/drivers/vfio-pci/unbind", audioA, false},
	}
	for _, s := range steps {
		if err := k.WriteFile(s.name, []byte(s.data)); err != nil {
			t.Fatal(err)
		}
		if got := k.Exists("/dev/vfio/12"); got != s.want {
			t.Errorf("after %q > %s: /dev/vfio/12 exists = %v, want %v", s.data, s.name, got, s.want)
		}
	}
}

func TestNewKernelValidates(t *testing.T) {
	tests := []struct {
		name string
		cfg  fakekernel.Config
	}{
		{"invalid address", fakekernel.Config{Devices: []fakekernel.Function{gpu("0000:3B:00.0", 1, "")}}},
		{"duplicate address", fakekernel.Config{Devices: []fakekernel.Function{gpu(gpuA, 1, ""), gpu(gpuA, 2, "")}}},
		{"driver not loaded", fakekernel.Config{Drivers: []string{"nvidia"}, Devices: []fakekernel.Function{audio(audioA, 1, "snd_hda_intel")}}},
		{"vfio-pci without a group", fakekernel.Config{Devices: []fakekernel.Function{gpu(gpuA, -1, vfio.DriverVFIO)}}},
		{"bad driver name", fakekernel.Config{Drivers: []string{"../nvidia"}}},
		{"dangling physfn", fakekernel.Config{Devices: []fakekernel.Function{{Address: gpuA, PhysFn: gpuB, IOMMUGroup: 1}}}},
		{"class too wide", fakekernel.Config{Devices: []fakekernel.Function{{Address: gpuA, Class: 0x1000000, IOMMUGroup: 1}}}},
	}
	for _, tt := range tests {
		if _, err := fakekernel.New(tt.cfg); err == nil {
			t.Errorf("%s: fakekernel.New succeeded", tt.name)
		}
	}
}

// A held unbind blocks its own device, like the kernel's device lock, and
// nothing else.
func TestKernelHoldBlocksOnlyItsDevice(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, "nvidia"), gpu(gpuB, 30, "nvidia"))
	if err := k.Hold(gpuA); err != nil {
		t.Fatal(err)
	}
	blocked, err := k.Blocked(gpuA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Blocked(gpuB); err == nil {
		t.Error("Blocked of a device that is not held: no error")
	}
	select {
	case <-blocked:
		t.Fatal("Blocked is closed before any unbind was written")
	default:
	}
	done := make(chan error, 1)
	go func() { done <- k.WriteFile(devicePath(gpuA, "driver/unbind"), []byte(gpuA)) }()
	<-blocked // the unbind now waits on the hold

	if err := k.WriteFile(devicePath(gpuB, "driver/unbind"), []byte(gpuB)); err != nil {
		t.Fatalf("unbind of another device while one is held: %v", err)
	}
	if _, err := vfio.New(k).Devices(); err != nil {
		t.Fatalf("reads while a device is held: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("held unbind returned (%v) before Unhold", err)
	default:
	}
	k.Unhold(gpuA)
	if err := <-done; err != nil {
		t.Fatalf("held unbind after Unhold: %v", err)
	}
	if d, _ := driverOf(t, k, gpuA); d != "" {
		t.Errorf("after the held unbind returned the GPU is on %q", d)
	}
	// Only the next unbind was held.
	if err := k.WriteFile(devicePath(gpuA, "driver_override"), []byte("nvidia")); err != nil {
		t.Fatal(err)
	}
	if err := k.WriteFile(driversProbe, []byte(gpuA)); err != nil {
		t.Fatal(err)
	}
	if err := k.WriteFile("bus/pci/drivers/nvidia/unbind", []byte(gpuA)); err != nil {
		t.Fatal(err)
	}
}

func TestKernelFaults(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, "nvidia"), gpu(gpuB, 30, vfio.DriverVFIO))
	p := vfio.New(k)
	if err := p.Health(gpuA); err != nil {
		t.Fatalf("Health of a good card: %v", err)
	}
	if err := k.SetConfigAllOnes(gpuA); err != nil {
		t.Fatal(err)
	}
	if err := p.Health(gpuA); !errors.Is(err, vfio.ErrConfigAllOnes) {
		t.Errorf("Health after SetConfigAllOnes = %v, want ErrConfigAllOnes", err)
	}
	if err := k.Remove(gpuB); err != nil {
		t.Fatal(err)
	}
	if err := p.Health(gpuB); !errors.Is(err, vfio.ErrVanished) {
		t.Errorf("Health after Remove = %v, want ErrVanished", err)
	}
	if _, err := p.Device(gpuB); !errors.Is(err, vfio.ErrVanished) {
		t.Errorf("Device after Remove = %v, want ErrVanished", err)
	}
	devs, err := p.Devices()
	if err != nil || len(devs) != 1 || devs[0].Address != gpuA {
		t.Errorf("Devices after Remove = %v, %v; want only %s", devs, err, gpuA)
	}
	if k.Exists("/dev/vfio/30") || k.Exists("kernel/iommu_groups/30") {
		t.Error("a removed device's group and vfio node are still there")
	}
	if err := k.Hold("0000:99:00.0"); err == nil {
		t.Error("Hold of an absent device succeeded")
	}
	if w := k.Writes(); !slices.Equal(w, []fakekernel.Write(nil)) {
		t.Errorf("faults were recorded as writes: %v", w)
	}
}
