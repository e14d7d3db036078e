package vfio_test

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

func TestBind(t *testing.T) {
	qemuTestDev := fakekernel.Function{Address: "0000:00:03.0", Vendor: 0x1b36, Device: 0x0005, Class: 0x00ff00, IOMMUGroup: 3, NUMANode: -1}

	tests := []struct {
		name    string
		devices []fakekernel.Function
		allow   []string // nil: the default
		addr    string
		wantErr error
		// After the call: driver of each listed device (checked whether
		// or not the call failed).
		wantDrivers map[string]string
		wantChanges []vfio.Change
		// The exact writes the kernel saw; nil means none at all.
		wantWrites []string
	}{
		{
			name:        "GPU on nvidia moves to vfio-pci",
			devices:     []fakekernel.Function{gpu(gpuA, 12, "nvidia")},
			addr:        gpuA,
			wantDrivers: map[string]string{gpuA: vfio.DriverVFIO},
			wantChanges: []vfio.Change{{gpuA, "nvidia", vfio.DriverVFIO}},
			wantWrites: []string{
				"bus/pci/devices/0000:3b:00.0/driver_override <- vfio-pci",
				"bus/pci/devices/0000:3b:00.0/driver/unbind <- 0000:3b:00.0",
				"bus/pci/drivers_probe <- 0000:3b:00.0",
			},
		},
		{
			name:        "GPU on no driver is probed onto vfio-pci",
			devices:     []fakekernel.Function{gpu(gpuA, 12, "")},
			addr:        gpuA,
			wantDrivers: map[string]string{gpuA: vfio.DriverVFIO},
			wantChanges: []vfio.Change{{gpuA, "", vfio.DriverVFIO}},
			wantWrites: []string{
				"bus/pci/devices/0000:3b:00.0/driver_override <- vfio-pci",
				"bus/pci/drivers_probe <- 0000:3b:00.0",
			},
		},
		{
			name:        "GPU already on vfio-pci: no write at all",
			devices:     []fakekernel.Function{gpu(gpuA, 12, vfio.DriverVFIO), audio(audioA, 12, vfio.DriverVFIO)},
			addr:        gpuA,
			wantDrivers: map[string]string{gpuA: vfio.DriverVFIO, audioA: vfio.DriverVFIO},
		},
		{
			name:        "the card's audio function moves with it",
			devices:     []fakekernel.Function{gpu(gpuA, 12, "nvidia"), audio(audioA, 12, "snd_hda_intel"), gpu(gpuB, 30, "nvidia")},
			addr:        gpuA,
			wantDrivers: map[string]string{gpuA: vfio.DriverVFIO, audioA: vfio.DriverVFIO, gpuB: "nvidia"},
			wantChanges: []vfio.Change{{gpuA, "nvidia", vfio.DriverVFIO}, {audioA, "snd_hda_intel", vfio.DriverVFIO}},
			wantWrites: []string{
				"bus/pci/devices/0000:3b:00.0/driver_override <- vfio-pci",
				"bus/pci/devices/0000:3b:00.0/driver/unbind <- 0000:3b:00.0",
				"bus/pci/drivers_probe <- 0000:3b:00.0",
				"bus/pci/devices/0000:3b:00.1/driver_override <- vfio-pci",
				"bus/pci/devices/0000:3b:00.1/driver/unbind <- 0000:3b:00.1",
				"bus/pci/drivers_probe <- 0000:3b:00.1",
			},
		},
		{
			name:        "binding the audio function takes the whole group",
			devices:     []fakekernel.Function{gpu(gpuA, 12, vfio.DriverVFIO), audio(audioA, 12, "snd_hda_intel")},
			addr:        audioA,
			wantDrivers: map[string]string{gpuA: vfio.DriverVFIO, audioA: vfio.DriverVFIO},
			wantChanges: []vfio.Change{{audioA, "snd_hda_intel", vfio.DriverVFIO}},
			wantWrites: []string{
				"bus/pci/devices/0000:3b:00.1/driver_override <- vfio-pci",
				"bus/pci/devices/0000:3b:00.1/driver/unbind <- 0000:3b:00.1",
				"bus/pci/drivers_probe <- 0000:3b:00.1",
			},
		},
		{
			name:        "a foreign endpoint with a host driver makes the group not viable",
			devices:     []fakekernel.Function{gpu(gpuA, 12, "nvidia"), audio(audioA, 12, "snd_hda_intel"), nicDev(nic, 12, "ixgbe")},
			addr:        gpuA,
			wantErr:     vfio.ErrGroupNotViable,
			wantDrivers: map[string]string{gpuA: "nvidia", audioA: "snd_hda_intel", nic: "ixgbe"},
		},
		{
			name:        "a foreign endpoint on no driver may stay",
			devices:     []fakekernel.Function{gpu(gpuA, 12, "nvidia"), nicDev(nic, 12, "")},
			addr:        gpuA,
			wantDrivers: map[string]string{gpuA: vfio.DriverVFIO, nic: ""},
			wantChanges: []vfio.Change{{gpuA, "nvidia", vfio.DriverVFIO}},
			wantWrites: []string{
				"bus/pci/devices/0000:3b:00.0/driver_override <- vfio-pci",
				"bus/pci/devices/0000:3b:00.0/driver/unbind <- 0000:3b:00.0",
				"bus/pci/drivers_probe <- 0000:3b:00.0",
			},
		},
		{
			name:        "a bridge on no driver stays where it is",
			devices:     []fakekernel.Function{bridgeDev(bridge, 12, ""), gpu(gpuA, 12, "nvidia")},
			addr:        gpuA,
			wantDrivers: map[string]string{bridge: "", gpuA: vfio.DriverVFIO},
			wantChanges: []vfio.Change{{gpuA, "nvidia", vfio.DriverVFIO}},
			wantWrites: []string{
				"bus/pci/devices/0000:3b:00.0/driver_override <- vfio-pci",
				"bus/pci/devices/0000:3b:00.0/driver/unbind <- 0000:3b:00.0",
				"bus/pci/drivers_probe <- 0000:3b:00.0",
			},
		},
		{
			name:        "a bridge on pcieport stays where it is",
			devices:     []fakekernel.Function{bridgeDev(bridge, 12, "pcieport"), gpu(gpuA, 12, "")},
			addr:        gpuA,
			wantDrivers: map[string]string{bridge: "pcieport", gpuA: vfio.DriverVFIO},
			wantChanges: []vfio.Change{{gpuA, "", vfio.DriverVFIO}},
			wantWrites: []string{
				"bus/pci/devices/0000:3b:00.0/driver_override <- vfio-pci",
				"bus/pci/drivers_probe <- 0000:3b:00.0",
			},
		},
		{
			name:        "a bridge on another driver makes the group not viable",
			devices:     []fakekernel.Function{bridgeDev(bridge, 12, "ixgbe"), gpu(gpuA, 12, "")},
			addr:        gpuA,
			wantErr:     vfio.ErrGroupNotViable,
			wantDrivers: map[string]string{bridge: "ixgbe", gpuA: ""},
		},
		{
			name:        "a device without an IOMMU group is refused",
			devices:     []fakekernel.Function{gpu(gpuA, -1, "nvidia")},
			addr:        gpuA,
			wantErr:     vfio.ErrNoIOMMUGroup,
			wantDrivers: map[string]string{gpuA: "nvidia"},
		},
		{
			name:        "a device not on the allow list is refused",
			devices:     []fakekernel.Function{nicDev(nic, 12, "ixgbe")},
			addr:        nic,
			wantErr:     vfio.ErrNotAllowed,
			wantDrivers: map[string]string{nic: "ixgbe"},
		},
		{
			name:        "an allow-listed foreign device stands in for a GPU",
			devices:     []fakekernel.Function{qemuTestDev},
			allow:       []string{"10de:*", "1b36:0005"},
			addr:        qemuTestDev.Address,
			wantDrivers: map[string]string{qemuTestDev.Address: vfio.DriverVFIO},
			wantChanges: []vfio.Change{{qemuTestDev.Address, "", vfio.DriverVFIO}},
			wantWrites: []string{
				"bus/pci/devices/0000:00:03.0/driver_override <- vfio-pci",
				"bus/pci/drivers_probe <- 0000:00:03.0",
			},
		},
		{
			name:        "an absent device vanished",
			devices:     []fakekernel.Function{gpu(gpuB, 30, "nvidia")},
			addr:        gpuA,
			wantErr:     vfio.ErrVanished,
			wantDrivers: map[string]string{gpuB: "nvidia"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := bootKernel(t, tt.devices...)
			var opts []vfio.BinderOption
			if tt.allow != nil {
				l, err := vfio.ParseAllowList(tt.allow)
				if err != nil {
					t.Fatal(err)
				}
				opts = append(opts, vfio.WithAllowList(l))
			}
			b := vfio.NewBinder(vfio.New(k), opts...)

			res, err := b.Bind(testCtx(t), tt.addr)

			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("Bind(%s) error = %v, want %v", tt.addr, err, tt.wantErr)
			}
			for addr, want := range tt.wantDrivers {
				if got, _ := driverOf(t, k, addr); got != want {
					t.Errorf("%s on %q, want %q", addr, got, want)
				}
			}
			if !slices.Equal(res.Changes, tt.wantChanges) {
				t.Errorf("Changes = %v, want %v", res.Changes, tt.wantChanges)
			}
			wantWrites(t, k, 0, tt.wantWrites...)
			if err != nil {
				return
			}
			if res.VFIODevice != "/dev/vfio/"+itoa(res.Group) || !k.Exists(res.VFIODevice) {
				t.Errorf("VFIODevice = %q (group %d), want an existing /dev/vfio/<group>", res.VFIODevice, res.Group)
			}
			for _, c := range res.Changes {
				if _, ov := driverOf(t, k, c.Address); ov != vfio.DriverVFIO {
					t.Errorf("%s: driver_override %q after bind, want vfio-pci so a reprobe keeps it there", c.Address, ov)
				}
			}
		})
	}
}

func TestBindGroupErrorNamesTheCulprit(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, "nvidia"), nicDev(nic, 12, "ixgbe"))
	_, err := vfio.NewBinder(vfio.New(k)).Bind(testCtx(t), gpuA)
	var ge *vfio.GroupError
	if !errors.As(err, &ge) {
		t.Fatalf("Bind error = %v, want a *GroupError", err)
	}
	if ge.Group != 12 || ge.Address != nic || ge.Driver != "ixgbe" || ge.Vendor != 0x8086 {
		t.Errorf("GroupError = %+v, want group 12, %s on ixgbe", ge, nic)
	}
	for _, s := range []string{"group 12", nic, "ixgbe", "8086:10fb"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
	if w := k.Writes(); len(w) != 0 {
		t.Errorf("refused Bind wrote %v", w)
	}
}

func TestBindFallsBackToDriverBind(t *testing.T) {
	// An old kernel or a racing udev rule: drivers_probe leaves it unbound.
	k := bootKernel(t, gpu(gpuA, 12, "nvidia"))
	f := &faultFS{FS: k, write: func(name string, data []byte) (bool, error) {
		return name == vfio.DriversProbe, nil
	}}
	res, err := vfio.NewBinder(vfio.New(f)).Bind(testCtx(t), gpuA)
	if err != nil {
		t.Fatalf("Bind: %v", err)
	}
	if got, _ := driverOf(t, k, gpuA); got != vfio.DriverVFIO {
		t.Errorf("driver %q, want vfio-pci", got)
	}
	if want := []vfio.Change{{gpuA, "nvidia", vfio.DriverVFIO}}; !slices.Equal(res.Changes, want) {
		t.Errorf("Changes = %v, want %v", res.Changes, want)
	}
	wantWrites(t, k, 0,
		"bus/pci/devices/0000:3b:00.0/driver_override <- vfio-pci",
		"bus/pci/devices/0000:3b:00.0/driver/unbind <- 0000:3b:00.0",
		"bus/pci/drivers/vfio-pci/bind <- 0000:3b:00.0",
	)
}

func TestBindRollsBackOnFailure(t *testing.T) {
	tests := []struct {
		name    string
		fault   func(k *fakekernel.Kernel) vfio.FS
		wantErr error
	}{
		{
			name: "the audio function's unbind fails",
			fault: func(k *fakekernel.Kernel) vfio.FS {
				return &faultFS{FS: k, write: func(name string, data []byte) (bool, error) {
					return name == vfio.DevicePath(audioA, "driver/unbind"), errInjected
				}}
			},
			wantErr: errInjected,
		},
		{
			name: "/dev/vfio/12 never appears",
			fault: func(k *fakekernel.Kernel) vfio.FS {
				return &faultFS{FS: k, hide: map[string]bool{"/dev/vfio/12": true}}
			},
			wantErr: vfio.ErrBindFailed,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := bootKernel(t, gpu(gpuA, 12, "nvidia"), audio(audioA, 12, "snd_hda_intel"))
			res, err := vfio.NewBinder(vfio.New(tt.fault(k))).Bind(testCtx(t), gpuA)
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), "rolled back") {
				t.Fatalf("Bind error = %v, want %v and a rollback", err, tt.wantErr)
			}
			for addr, want := range map[string]string{gpuA: "nvidia", audioA: "snd_hda_intel"} {
				if got, ov := driverOf(t, k, addr); got != want || ov != "" {
					t.Errorf("%s on %q with override %q after rollback, want %q and none", addr, got, ov, want)
				}
			}
			if len(res.Changes) != 0 {
				t.Errorf("Changes = %v after a full rollback, want none", res.Changes)
			}
		})
	}
}

func TestBindRefusesWhatItMustNotTouch(t *testing.T) {
	// Every write in every Bind of these tests lands in a device's own
	// directory, the probe file, or a driver's bind/unbind.
	k := bootKernel(t, gpu(gpuA, 12, "nvidia"), audio(audioA, 12, "snd_hda_intel"), gpu(gpuB, 30, ""))
	b := vfio.NewBinder(vfio.New(k))
	for _, a := range []string{gpuA, gpuB} {
		if _, err := b.Bind(testCtx(t), a); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Release(testCtx(t), a, vfio.IdleNVIDIA); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range k.Writes() {
		if !writeAllowed(w.Name) {
			t.Errorf("write to %s outside the allowed directories", w.Name)
		}
	}
}

// writeAllowed is the rule from the design: a device's own driver_override
// or driver/unbind, drivers_probe, or a driver's bind/unbind.
func writeAllowed(name string) bool {
	p := strings.Split(name, "/")
	switch {
	case len(p) == 5 && p[0] == "bus" && p[1] == "pci" && p[2] == "devices" && p[4] == "driver_override":
		return vfio.ValidateAddress(p[3]) == nil
	case len(p) == 6 && p[0] == "bus" && p[1] == "pci" && p[2] == "devices" && p[4] == "driver" && p[5] == "unbind":
		return vfio.ValidateAddress(p[3]) == nil
	case name == vfio.DriversProbe:
		return true
	case len(p) == 5 && p[0] == "bus" && p[1] == "pci" && p[2] == "drivers" && (p[4] == "bind" || p[4] == "unbind"):
		return vfio.ValidateDriverName(p[3]) == nil
	}
	return false
}

// attrFS serves the simulated kernel, counting the reads of each file and
// answering some with other contents.
type attrFS struct {
	vfio.FS
	mu    sync.Mutex
	reads map[string]int
	serve map[string]string // file → contents served instead
}

func (f *attrFS) ReadFile(name string) ([]byte, error) {
	f.mu.Lock()
	f.reads[name]++
	s, ok := f.serve[name]
	f.mu.Unlock()
	if ok {
		return []byte(s), nil
	}
	return f.FS.ReadFile(name)
}

// TestBindReadsTheTargetWholeOnceUnderTheLock: before its group's lock,
// Bind and Release read only what the lock is taken by (the IDs for the
// allow list, the group); every other attribute of the target is read once,
// with the group's members, under the lock. A target whose class is
// garbage is still refused, naming it, before any write.
func TestBindReadsTheTargetWholeOnceUnderTheLock(t *testing.T) {
	k := bootKernel(t, gpu(gpuB, 30, ""))
	f := &attrFS{FS: k, reads: map[string]int{}, serve: map[string]string{}}
	b := vfio.NewBinder(vfio.New(f))
	class := "bus/pci/devices/" + gpuB + "/class"
	for _, op := range []string{"bind", "release"} {
		clear(f.reads)
		var err error
		if op == "bind" {
			_, err = b.Bind(testCtx(t), gpuB)
		} else {
			_, err = b.Release(testCtx(t), gpuB, vfio.IdleNone)
		}
		if err != nil {
			t.Fatal(err)
		}
		if n := f.reads[class]; n != 1 {
			t.Errorf("%s read the target's class %d times, want once", op, n)
		}
		if n := f.reads["bus/pci/devices/"+gpuB+"/vendor"]; n != 2 {
			t.Errorf("%s read the target's vendor %d times, want twice (before and under the lock)", op, n)
		}
	}

	f.serve[class] = "garbage\n"
	writes := len(k.Writes())
	_, err := b.Bind(testCtx(t), gpuB)
	if !errors.Is(err, vfio.ErrMalformed) || !strings.Contains(err.Error(), gpuB) {
		t.Fatalf("bind of a device whose class is garbage: %v; want ErrMalformed naming %s", err, gpuB)
	}
	if n := len(k.Writes()) - writes; n != 0 {
		t.Errorf("a refused bind wrote %d times", n)
	}
}
