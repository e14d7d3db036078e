package vfio_test

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

func TestDevices(t *testing.T) {
	vf := fakekernel.Function{Address: "0000:5e:00.4", Vendor: vfio.VendorNVIDIA, Device: 0x2330, Class: vfio.Class3D, IOMMUGroup: 31, NUMANode: 1, PhysFn: gpuB}
	sw := fakekernel.Function{Address: "0000:07:00.0", Vendor: vfio.VendorNVIDIA, Device: 0x22a3, Class: vfio.ClassNVSwitch, IOMMUGroup: 4, NUMANode: 0, Driver: "nvidia"}
	k := bootKernel(t, audio(audioA, 12, ""), gpu(gpuB, 30, "nvidia"), gpu(gpuA, 12, vfio.DriverVFIO), vf, sw, nicDev(nic, -1, "ixgbe"))
	if err := k.WriteFile(vfio.DevicePath(audioA, "driver_override"), []byte("vfio-pci")); err != nil {
		t.Fatal(err)
	}
	devs, err := vfio.New(k).Devices()
	if err != nil {
		t.Fatal(err)
	}
	// The simulated tree hangs every device off one root complex per
	// domain, as its bus/pci/devices links say.
	const root = "pci0000:00"
	want := []vfio.Device{
		{Address: sw.Address, Vendor: 0x10de, Device: 0x22a3, Class: vfio.ClassNVSwitch, Driver: "nvidia", IOMMUGroup: 4, NUMANode: 0, PCIeRoot: root},
		{Address: gpuA, Vendor: 0x10de, Device: 0x2330, SubsystemVendor: 0x10de, SubsystemDevice: 0x16c1, Class: vfio.Class3D, Driver: vfio.DriverVFIO, IOMMUGroup: 12, NUMANode: 0, PCIeRoot: root},
		{Address: audioA, Vendor: 0x10de, Device: 0x22ba, Class: vfio.ClassAudio, DriverOverride: vfio.DriverVFIO, IOMMUGroup: 12, NUMANode: 0, PCIeRoot: root},
		{Address: nic, Vendor: 0x8086, Device: 0x10fb, Class: 0x020000, Driver: "ixgbe", IOMMUGroup: -1, NUMANode: 0, PCIeRoot: root},
		{Address: gpuB, Vendor: 0x10de, Device: 0x2330, SubsystemVendor: 0x10de, SubsystemDevice: 0x16c1, Class: vfio.Class3D, Driver: "nvidia", IOMMUGroup: 30, NUMANode: 0, PCIeRoot: root},
		{Address: vf.Address, Vendor: 0x10de, Device: 0x2330, Class: vfio.Class3D, IOMMUGroup: 31, NUMANode: 1, VirtualFunction: true, PCIeRoot: root},
	}
	if !slices.Equal(devs, want) {
		t.Errorf("Devices() =\n%+v\nwant\n%+v", devs, want)
	}
	var gpus []string
	for _, d := range devs {
		if d.IsGPU() {
			gpus = append(gpus, d.Address)
		}
	}
	if !slices.Equal(gpus, []string{gpuA, gpuB}) {
		t.Errorf("GPUs = %v: the NVSwitch, the audio function and the VF are not GPUs", gpus)
	}
	members, err := vfio.New(k).GroupMembers(12)
	if err != nil || len(members) != 2 || members[0].Address != gpuA || members[1].Address != audioA {
		t.Errorf("GroupMembers(12) = %v, %v", members, err)
	}
	if _, err := vfio.New(k).GroupMembers(99); err == nil {
		t.Error("GroupMembers of an absent group succeeded")
	}
}

// A device with garbage in sysfs, or with a name that is not an address,
// is skipped and logged; every other device is still listed. The group
// view is stricter: a member it cannot read fails the whole group.
func TestDevicesSkipsGarbage(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, "nvidia"), audio(audioA, 12, ""), gpu(gpuB, 30, "nvidia"))
	dir := t.TempDir()
	if err := k.WriteTree(dir); err != nil {
		t.Fatal(err)
	}
	corrupt := []struct{ file, content string }{
		{"devices/pci0000:00/" + audioA + "/vendor", "garbage\n"},
		{"devices/pci0000:00/" + gpuB + "/class", "0x03020000000\n"},
	}
	for _, c := range corrupt {
		p := filepath.Join(dir, c.file)
		os.Chmod(p, 0o644)
		if err := os.WriteFile(p, []byte(c.content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "bus/pci/devices/evil..name"), 0o755); err != nil {
		t.Fatal(err)
	}

	var logs bytes.Buffer
	p := vfio.New(vfio.NewOSFS(dir, t.TempDir()), vfio.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	devs, err := p.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 || devs[0].Address != gpuA {
		t.Errorf("Devices() = %+v, want only %s", devs, gpuA)
	}
	for _, s := range []string{audioA, gpuB, "evil..name", "malformed"} {
		if !strings.Contains(logs.String(), s) {
			t.Errorf("log does not mention %q:\n%s", s, logs.String())
		}
	}
	if _, err := p.GroupMembers(12); !errors.Is(err, vfio.ErrMalformed) {
		t.Errorf("GroupMembers with an unreadable member = %v, want ErrMalformed", err)
	}
	if _, err := vfio.NewBinder(p).Bind(testCtx(t), gpuA); !errors.Is(err, vfio.ErrMalformed) {
		t.Errorf("Bind with an unreadable group member = %v, want ErrMalformed", err)
	}
}

func TestHealthReadsConfigSpace(t *testing.T) {
	tests := []struct {
		name   string
		config []byte
		want   error
	}{
		{"vendor and device answer", []byte{0xde, 0x10, 0x30, 0x23, 0, 0}, nil},
		{"all ones", bytes.Repeat([]byte{0xff}, 256), vfio.ErrConfigAllOnes},
		{"vendor all ones only", []byte{0xff, 0xff, 0x30, 0x23}, nil},
		{"too short", []byte{0xff, 0xff}, vfio.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := bootKernel(t, gpu(gpuA, 12, "nvidia"))
			dir := t.TempDir()
			if err := k.WriteTree(dir); err != nil {
				t.Fatal(err)
			}
			cfg := filepath.Join(dir, "devices/pci0000:00", gpuA, "config")
			if err := os.WriteFile(cfg, tt.config, 0o644); err != nil {
				t.Fatal(err)
			}
			err := vfio.New(vfio.NewOSFS(dir, dir)).Health(gpuA)
			if !errors.Is(err, tt.want) || (err == nil) != (tt.want == nil) {
				t.Errorf("Health = %v, want %v", err, tt.want)
			}
		})
	}
}

// Addresses read from sysfs are checked like any other: a group member
// whose name is not an address stops Bind before any write.
func TestHostileGroupMemberName(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, "nvidia"))
	dir := t.TempDir()
	if err := k.WriteTree(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../devices/pci0000:00/"+gpuA, filepath.Join(dir, "kernel/iommu_groups/12/devices/..evil")); err != nil {
		t.Fatal(err)
	}
	spy := &spyFS{FS: vfio.NewOSFS(dir, t.TempDir())}
	if _, err := vfio.New(spy).GroupMembers(12); !errors.Is(err, vfio.ErrInvalidAddress) {
		t.Errorf("GroupMembers = %v, want ErrInvalidAddress", err)
	}
	if _, err := vfio.NewBinder(vfio.New(spy)).Bind(testCtx(t), gpuA); !errors.Is(err, vfio.ErrInvalidAddress) {
		t.Errorf("Bind = %v, want ErrInvalidAddress", err)
	}
	for _, c := range spy.Calls() {
		if strings.HasPrefix(c, "write") || strings.Contains(c, "evil") {
			t.Errorf("FS call %q", c)
		}
	}
}
