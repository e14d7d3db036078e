package vfio_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// Devices of the readiness tests: a GPU with its audio function, and a
// network card of the host in the same IOMMU group (a board without ACS).
var (
	rGPU    = vfio.Device{Address: "0000:41:00.0", Vendor: vfio.VendorNVIDIA, Device: 0x26b9, Class: vfio.Class3D, Driver: vfio.DriverNVIDIA, IOMMUGroup: 14}
	rAudio  = vfio.Device{Address: "0000:41:00.1", Vendor: vfio.VendorNVIDIA, Device: 0x22ba, Class: vfio.ClassAudio, Driver: "snd_hda_intel", IOMMUGroup: 14}
	rNIC    = vfio.Device{Address: "0000:42:00.0", Vendor: 0x8086, Device: 0x1521, Class: 0x020000, Driver: "igb", IOMMUGroup: 14}
	rBridge = vfio.Device{Address: "0000:40:01.0", Vendor: 0x1022, Device: 0x1483, Class: vfio.ClassBridge, Driver: vfio.DriverPCIePort, IOMMUGroup: 14}
)

func readyHost() vfio.HostFacts {
	return vfio.HostFacts{IOMMUGroups: true, VFIOPCILoaded: true, InterruptRemapping: vfio.RemapOn}
}

func with(d vfio.Device, f func(*vfio.Device)) vfio.Device { f(&d); return d }

func TestAssessVerdicts(t *testing.T) {
	flr := vfio.ResetFacts{Known: true, Methods: []string{"flr", "bus"}}
	base := vfio.ReadinessInput{Host: readyHost(), GPU: rGPU, Members: []vfio.Device{rBridge, rGPU, rAudio}, Reset: flr, Allow: vfio.DefaultAllowList()}
	tests := []struct {
		name     string
		change   func(*vfio.ReadinessInput)
		blocking []string // codes
		warnings []string
		device   string // the blocking device named, if any
		words    []string
	}{
		{name: "ready: GPU, its audio function, a bridge on pcieport", change: func(*vfio.ReadinessInput) {}},
		{name: "GPU on vfio-pci, audio on no driver", change: func(in *vfio.ReadinessInput) {
			in.GPU = with(rGPU, func(d *vfio.Device) { d.Driver = vfio.DriverVFIO })
			in.Members = []vfio.Device{in.GPU, with(rAudio, func(d *vfio.Device) { d.Driver = "" })}
		}},
		{name: "host NIC on its driver in the group", change: func(in *vfio.ReadinessInput) { in.Members = append(in.Members, rNIC) },
			blocking: []string{vfio.ProblemGroupNotViable}, device: rNIC.Address,
			words: []string{"0000:42:00.0 [8086:1521] class 020000 on igb", "unbind it", "own IOMMU group", "8086:1521 to allow_devices"}},
		{name: "host NIC unbound", change: func(in *vfio.ReadinessInput) {
			in.Members = append(in.Members, with(rNIC, func(d *vfio.Device) { d.Driver = "" }))
		}},
		{name: "host NIC on vfio-pci or pci-stub", change: func(in *vfio.ReadinessInput) {
			in.Members = append(in.Members, with(rNIC, func(d *vfio.Device) { d.Driver = vfio.DriverVFIO }), with(rNIC, func(d *vfio.Device) { d.Address = "0000:42:00.1"; d.Driver = vfio.DriverPCIStub }))
		}},
		{name: "host NIC on the allow list", change: func(in *vfio.ReadinessInput) {
			in.Members = append(in.Members, rNIC)
			in.Allow = append(vfio.DefaultAllowList(), vfio.AllowEntry{Vendor: 0x8086, Device: 0x1521})
		}},
		{name: "a function of the same card off the allow list", change: func(in *vfio.ReadinessInput) {
			in.Allow = vfio.AllowList{{Vendor: vfio.VendorNVIDIA, Device: 0x26b9}}
		}, blocking: []string{vfio.ProblemGroupNotViable}, device: rAudio.Address, words: []string{"a function of the same card"}},
		{name: "a bridge on another driver", change: func(in *vfio.ReadinessInput) {
			in.Members = []vfio.Device{with(rBridge, func(d *vfio.Device) { d.Driver = "shpchp" }), rGPU}
		}, blocking: []string{vfio.ProblemGroupNotViable}, device: rBridge.Address, words: []string{"bridge"}},
		{name: "GPU off the allow list", change: func(in *vfio.ReadinessInput) { in.Allow = vfio.AllowList{{Vendor: 0x1234, AnyDevice: true}} },
			blocking: []string{vfio.ProblemNotAllowed, vfio.ProblemGroupNotViable}, device: rAudio.Address},
		{name: "no IOMMU", change: func(in *vfio.ReadinessInput) {
			in.Host.IOMMUGroups = false
			in.GPU.IOMMUGroup, in.Members = -1, nil
		}, blocking: []string{vfio.ProblemNoIOMMU}, words: []string{"intel_iommu=on"}},
		{name: "group unreadable", change: func(in *vfio.ReadinessInput) { in.Members, in.MembersErr = nil, errors.New("EIO") },
			blocking: []string{vfio.ProblemGroupUnreadable}},
		{name: "vfio-pci not loaded", change: func(in *vfio.ReadinessInput) { in.Host.VFIOPCILoaded = false },
			blocking: []string{vfio.ProblemVFIOMissing}, words: []string{"modprobe vfio-pci"}},
		{name: "no interrupt remapping", change: func(in *vfio.ReadinessInput) { in.Host.InterruptRemapping = vfio.RemapOff },
			blocking: []string{vfio.ProblemNoInterruptRemapping}, words: []string{"allow_unsafe_interrupts"}},
		{name: "no interrupt remapping, allowed in gpuherd.yaml only", change: func(in *vfio.ReadinessInput) {
			in.Host.InterruptRemapping, in.AllowUnsafeInterrupts = vfio.RemapOff, true
		}, blocking: []string{vfio.ProblemNoInterruptRemapping}, words: []string{"options vfio_iommu_type1 allow_unsafe_interrupts=1"}},
		{name: "no interrupt remapping, allowed in gpuherd.yaml and the kernel", change: func(in *vfio.ReadinessInput) {
			in.Host.InterruptRemapping, in.AllowUnsafeInterrupts, in.Host.UnsafeInterrupts = vfio.RemapOff, true, true
		}, warnings: []string{vfio.ProblemNoInterruptRemapping}},
		{name: "interrupt remapping unknown", change: func(in *vfio.ReadinessInput) { in.Host.InterruptRemapping = vfio.RemapUnknown },
			warnings: []string{vfio.ProblemNoInterruptRemapping}},
		{name: "no reset method", change: func(in *vfio.ReadinessInput) { in.Reset = vfio.ResetFacts{Known: true} },
			warnings: []string{vfio.ProblemNoReset}, words: []string{"reset_method"}},
		{name: "reset unknown on an old kernel", change: func(in *vfio.ReadinessInput) { in.Reset = vfio.ResetFacts{} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := base
			in.Members = slices.Clone(base.Members)
			tc.change(&in)
			v := vfio.Assess(in)
			if got := codes(v.Blocking); !slices.Equal(got, tc.blocking) {
				t.Errorf("blocking %v, want %v: %+v", got, tc.blocking, v.Blocking)
			}
			if got := codes(v.Warnings); !slices.Equal(got, tc.warnings) {
				t.Errorf("warnings %v, want %v: %+v", got, tc.warnings, v.Warnings)
			}
			if v.Ready() != (len(tc.blocking) == 0) {
				t.Errorf("Ready() = %v with blocking %v", v.Ready(), v.Blocking)
			}
			for _, p := range append(slices.Clone(v.Blocking), v.Warnings...) {
				if p.Message == "" || p.Fix == "" {
					t.Errorf("problem %s without message or fix: %+v", p.Code, p)
				}
			}
			if tc.device != "" {
				var named []string
				for _, p := range v.Blocking {
					if p.Device != nil {
						named = append(named, p.Device.PCIAddress)
					}
				}
				if !slices.Contains(named, tc.device) {
					t.Errorf("blocking devices %v, want %s named", named, tc.device)
				}
			}
			text := v.Reason() + " " + vfio.WarnText(v)
			for _, w := range tc.words {
				if !strings.Contains(text, w) {
					t.Errorf("verdict %q does not say %q", text, w)
				}
			}
		})
	}
}

func codes(ps []vfio.Problem) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Code)
	}
	return out
}

// TestCheckAgreesWithAssess: Binder.Check, which guards every bind, and
// Assess refuse the same groups for the same members.
func TestCheckAgreesWithAssess(t *testing.T) {
	for _, nicDriver := range []string{"igb", "", vfio.DriverVFIO, vfio.DriverPCIStub} {
		k, err := fakekernel.New(fakekernel.Config{Drivers: []string{"nvidia", "snd_hda_intel", "igb", "pci-stub"}, Devices: []fakekernel.Function{
			{Address: rGPU.Address, Vendor: rGPU.Vendor, Device: rGPU.Device, Class: rGPU.Class, IOMMUGroup: 14, NUMANode: 0, Driver: "nvidia"},
			{Address: rAudio.Address, Vendor: rAudio.Vendor, Device: rAudio.Device, Class: rAudio.Class, IOMMUGroup: 14, NUMANode: 0, Driver: "snd_hda_intel"},
			{Address: rNIC.Address, Vendor: rNIC.Vendor, Device: rNIC.Device, Class: rNIC.Class, IOMMUGroup: 14, NUMANode: 0, Driver: "igb"},
		}})
		if err != nil {
			t.Fatal(err)
		}
		if nicDriver != "igb" {
			if err := k.WriteFile(vfio.DevicePath(rNIC.Address, "driver/unbind"), []byte(rNIC.Address)); err != nil {
				t.Fatal(err)
			}
			if nicDriver != "" {
				_ = k.WriteFile(vfio.DevicePath(rNIC.Address, "driver_override"), []byte(nicDriver))
				if err := k.WriteFile(vfio.DriversProbe, []byte(rNIC.Address)); err != nil {
					t.Fatal(err)
				}
			}
		}
		pci := vfio.New(k)
		v, err := pci.Readiness(rGPU.Address, vfio.ReadinessConfig{Allow: vfio.DefaultAllowList()}, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkErr := vfio.NewBinder(pci).Check(rGPU.Address)
		if v.Ready() != (checkErr == nil) {
			t.Errorf("NIC on %q: Assess ready=%v (%s), Check %v", nicDriver, v.Ready(), v.Reason(), checkErr)
		}
		if want := nicDriver == "igb"; !v.Ready() != want {
			t.Errorf("NIC on %q: ready=%v", nicDriver, v.Ready())
		}
	}
}

// TestReadHostFactsOnTheFakeKernel: interrupt remapping, the unsafe
// interrupts parameter, vfio-pci and reset methods as the simulated kernel
// shows them in sysfs.
func TestReadHostFactsOnTheFakeKernel(t *testing.T) {
	k, err := fakekernel.New(fakekernel.Config{Drivers: []string{"nvidia"}, Devices: []fakekernel.Function{
		{Address: "0000:41:00.0", Vendor: vfio.VendorNVIDIA, Device: 0x26b9, Class: vfio.Class3D, IOMMUGroup: 14, Driver: "nvidia"},
		{Address: "0000:51:00.0", Vendor: vfio.VendorNVIDIA, Device: 0x26b9, Class: vfio.Class3D, IOMMUGroup: 15, Driver: "nvidia", NoReset: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	pci := vfio.New(k)
	if h := pci.ReadHostFacts(); h != readyHost() {
		t.Errorf("host facts %+v, want %+v", h, readyHost())
	}
	k.SetInterruptRemapping(false)
	k.SetUnsafeInterrupts(true)
	if h := pci.ReadHostFacts(); h.InterruptRemapping != vfio.RemapOff || !h.UnsafeInterrupts {
		t.Errorf("host facts %+v, want remapping off, unsafe interrupts on", h)
	}
	if r := pci.ResetFacts("0000:41:00.0"); !r.Known || !slices.Equal(r.Methods, []string{"flr", "bus"}) {
		t.Errorf("reset facts %+v", r)
	}
	if r := pci.ResetFacts("0000:51:00.0"); !r.Known || len(r.Methods) != 0 {
		t.Errorf("reset facts of a card without reset %+v", r)
	}
	v, err := pci.Readiness("0000:51:00.0", vfio.ReadinessConfig{Allow: vfio.DefaultAllowList()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(codes(v.Blocking), []string{vfio.ProblemNoInterruptRemapping}) || !slices.Equal(codes(v.Warnings), []string{vfio.ProblemNoReset}) {
		t.Errorf("verdict %+v", v)
	}
}

// TestKernelEmitsPCIEvents: the simulated kernel tells its watchers of
// every driver change its writes make, of hot-adds and of removals, in
// order.
func TestKernelEmitsPCIEvents(t *testing.T) {
	k, err := fakekernel.New(fakekernel.Config{Drivers: []string{"nvidia", "igb"}, Devices: []fakekernel.Function{
		{Address: rGPU.Address, Vendor: rGPU.Vendor, Device: rGPU.Device, Class: rGPU.Class, IOMMUGroup: 14, Driver: "nvidia"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := k.WatchPCI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b := vfio.NewBinder(vfio.New(k))
	if _, err := b.Bind(ctx, rGPU.Address); err != nil {
		t.Fatal(err)
	}
	if err := k.Add(fakekernel.Function{Address: rNIC.Address, Vendor: rNIC.Vendor, Device: rNIC.Device, Class: rNIC.Class, IOMMUGroup: 14, Driver: "igb"}); err != nil {
		t.Fatal(err)
	}
	if err := k.Remove(rNIC.Address); err != nil {
		t.Fatal(err)
	}
	want := []vfio.PCIEvent{
		{Action: vfio.UeventUnbind, Address: rGPU.Address},
		{Action: vfio.UeventBind, Address: rGPU.Address, Driver: vfio.DriverVFIO},
		{Action: vfio.UeventAdd, Address: rNIC.Address},
		{Action: vfio.UeventBind, Address: rNIC.Address, Driver: "igb"},
		{Action: vfio.UeventRemove, Address: rNIC.Address},
	}
	for i, w := range want {
		if got := <-ch; got != w {
			t.Fatalf("event %d: %+v, want %+v", i, got, w)
		}
	}
	cancel()
	for range ch { // drain until closed
	}
}

func TestParseUevent(t *testing.T) {
	msg := func(kv ...string) []byte { return []byte(strings.Join(kv, "\x00") + "\x00") }
	tests := []struct {
		in   []byte
		want vfio.PCIEvent
		ok   bool
	}{
		{msg("bind@/devices/pci0000:00/0000:00:02.0/0000:01:00.0", "ACTION=bind", "DEVPATH=/devices/pci0000:00/0000:00:02.0/0000:01:00.0",
			"SUBSYSTEM=pci", "DRIVER=vfio-pci", "PCI_CLASS=30200", "PCI_SLOT_NAME=0000:01:00.0", "SEQNUM=4242"),
			vfio.PCIEvent{Action: vfio.UeventBind, Address: "0000:01:00.0", Driver: "vfio-pci"}, true},
		{msg("unbind@/devices/pci0000:00/0000:00:03.0", "ACTION=unbind", "DEVPATH=/devices/pci0000:00/0000:00:03.0", "SUBSYSTEM=pci"),
			vfio.PCIEvent{Action: vfio.UeventUnbind, Address: "0000:00:03.0"}, true},
		{msg("add@/devices/virtual/net/lo", "ACTION=add", "DEVPATH=/devices/virtual/net/lo", "SUBSYSTEM=net"), vfio.PCIEvent{}, false},
		{msg("libudev", "ACTION=add", "SUBSYSTEM=pci", "PCI_SLOT_NAME=0000:01:00.0"), vfio.PCIEvent{}, false},
		{msg("add@/devices/pci0000:00/../x", "ACTION=add", "SUBSYSTEM=pci", "DEVPATH=/devices/pci0000:00/../x"), vfio.PCIEvent{}, false},
		{nil, vfio.PCIEvent{}, false},
	}
	for i, tc := range tests {
		got, ok := vfio.ParseUevent(tc.in)
		if ok != tc.ok || got != tc.want {
			t.Errorf("case %d: %+v %v, want %+v %v", i, got, ok, tc.want, tc.ok)
		}
	}
}
