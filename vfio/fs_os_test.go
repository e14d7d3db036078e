package vfio_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// The OS side reads a tree written by the Kernel exactly as the Kernel
// serves it: the same devices, groups, links and vfio nodes.
func TestOSFSMatchesKernel(t *testing.T) {
	vf := fakekernel.Function{Address: "0000:5e:00.4", Vendor: vfio.VendorNVIDIA, Device: 0x2330, Class: vfio.Class3D, IOMMUGroup: 31, NUMANode: 1, PhysFn: gpuB}
	k := bootKernel(t, gpu(gpuA, 12, vfio.DriverVFIO), audio(audioA, 12, ""), bridgeDev(bridge, 12, "pcieport"),
		gpu(gpuB, 30, "nvidia"), vf, nicDev("0001:01:00.0", -1, "ixgbe"))
	if err := k.WriteFile(vfio.DevicePath(audioA, "driver_override"), []byte("vfio-pci")); err != nil {
		t.Fatal(err)
	}
	sys, dev := t.TempDir(), t.TempDir()
	if err := k.WriteTree(sys); err != nil {
		t.Fatal(err)
	}
	if err := k.WriteDevTree(dev); err != nil {
		t.Fatal(err)
	}
	o := vfio.NewOSFS(sys, dev)

	want, err := vfio.New(k).Devices()
	if err != nil {
		t.Fatal(err)
	}
	got, err := vfio.New(o).Devices()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) || len(got) != 6 {
		t.Errorf("OSFS Devices() =\n%+v\nKernel Devices() =\n%+v", got, want)
	}
	for _, g := range []int{12, 30, 31} {
		w, _ := vfio.New(k).GroupMembers(g)
		if got, err := vfio.New(o).GroupMembers(g); err != nil || !slices.Equal(got, w) {
			t.Errorf("GroupMembers(%d) = %v, %v; want %v", g, got, err, w)
		}
	}
	for _, name := range []string{
		vfio.DevicePath(gpuA, "driver"), vfio.DevicePath(gpuA, "iommu_group"), vfio.DevicePath(gpuA, ""),
		"kernel/iommu_groups/12/devices/" + audioA, "bus/pci/drivers/vfio-pci/" + gpuA, vfio.DevicePath(vf.Address, "physfn"),
	} {
		kl, kerr := k.Readlink(name)
		ol, oerr := o.Readlink(name)
		if kl != ol || kerr != nil || oerr != nil {
			t.Errorf("Readlink(%s): kernel %q %v, os %q %v", name, kl, kerr, ol, oerr)
		}
	}
	for _, name := range []string{"bus/pci/drivers", "kernel/iommu_groups", vfio.DevicePath(gpuB, ""), "bus/pci/drivers/vfio-pci", "/dev/vfio", "devices"} {
		kd, kerr := k.ReadDir(name)
		od, oerr := o.ReadDir(name)
		if !slices.Equal(kd, od) || kerr != nil || oerr != nil {
			t.Errorf("ReadDir(%s): kernel %v %v, os %v %v", name, kd, kerr, od, oerr)
		}
	}
	for _, name := range []string{"/dev/vfio/12", "/dev/vfio/30", "/dev/vfio/vfio", vfio.DevicePath(gpuB, "driver/unbind"), vfio.DevicePath(audioA, "driver")} {
		if k.Exists(name) != o.Exists(name) {
			t.Errorf("Exists(%s): kernel %v, os %v", name, k.Exists(name), o.Exists(name))
		}
	}
}

func TestOSFSWrite(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, "nvidia"))
	sys := t.TempDir()
	if err := k.WriteTree(sys); err != nil {
		t.Fatal(err)
	}
	o := vfio.NewOSFS(sys, t.TempDir())

	// Through the bus/pci/devices link to the real directory, in one write.
	if err := o.WriteFile(vfio.DevicePath(gpuA, "driver_override"), []byte("vfio-pci\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(sys, "devices/pci0000:00", gpuA, "driver_override")); string(b) != "vfio-pci\n" {
		t.Errorf("driver_override holds %q", b)
	}
	// Through the driver link, as Bind unbinds.
	if err := o.WriteFile(vfio.DevicePath(gpuA, "driver/unbind"), []byte(gpuA)); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(sys, "bus/pci/drivers/nvidia/unbind")); string(b) != gpuA {
		t.Errorf("unbind holds %q", b)
	}
	// A missing attribute is an error, never a new file.
	missing := vfio.DevicePath(gpuA, "new_id")
	if err := o.WriteFile(missing, []byte("x")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("write to a missing file: %v, want ErrNotExist", err)
	}
	if o.Exists(missing) {
		t.Error("WriteFile created a file")
	}
}

func TestOSFSStaysInsideItsRoots(t *testing.T) {
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("s3cret"), 0o644); err != nil {
		t.Fatal(err)
	}
	sys := t.TempDir()
	dev := filepath.Join(sys, "devroot")
	if err := os.MkdirAll(filepath.Join(sys, "bus/pci/devices"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(dev, 0o755)
	// Links planted in the tree that point out of it.
	if err := os.Symlink(secret, filepath.Join(sys, "abs")); err != nil {
		t.Fatal(err)
	}
	rel, _ := filepath.Rel(filepath.Join(sys, "bus/pci/devices"), secret)
	if err := os.Symlink(rel, filepath.Join(sys, "bus/pci/devices/rel")); err != nil {
		t.Fatal(err)
	}
	o := vfio.NewOSFS(sys, dev)

	for _, name := range []string{
		"../" + filepath.Base(outside) + "/secret", "bus/../../x", "/etc/passwd", "/dev/../etc/passwd", "/dev/../../x",
		"/devx", "bus\x00/pci", "", "abs", "bus/pci/devices/rel",
	} {
		if b, err := o.ReadFile(name); err == nil {
			t.Errorf("ReadFile(%q) = %q, want an error", name, b)
		}
		if err := o.WriteFile(name, []byte("pwned")); err == nil {
			t.Errorf("WriteFile(%q) succeeded", name)
		}
		if o.Exists(name) {
			t.Errorf("Exists(%q) = true", name)
		}
	}
	if b, _ := os.ReadFile(secret); string(b) != "s3cret" {
		t.Errorf("file outside the root changed: %q", b)
	}
	if _, err := o.ReadFile("../x"); !errors.Is(err, vfio.ErrInvalidPath) {
		t.Errorf("ReadFile(../x) = %v, want ErrInvalidPath", err)
	}
	// The device root is its own root: "/dev/" names never reach sysfs.
	if o.Exists("/dev/bus") {
		t.Error("/dev/bus resolved inside the sysfs root")
	}
}
