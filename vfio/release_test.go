package vfio

import (
	"slices"
	"testing"
)

func TestRelease(t *testing.T) {
	type state struct{ driver, override string }
	tests := []struct {
		name        string
		drivers     []string // loaded host drivers; nil: hostDrivers
		policy      IdlePolicy
		want        map[string]state
		wantChanges []Change
		wantVFIO    bool // /dev/vfio/12 exists afterwards
		wantWrites  []string
	}{
		{
			name:   "nvidia: back on the host drivers, overrides cleared",
			policy: IdleNVIDIA,
			want: map[string]state{
				gpuA:   {"nvidia", ""},
				audioA: {"snd_hda_intel", ""},
			},
			wantChanges: []Change{{gpuA, DriverVFIO, "nvidia"}, {audioA, DriverVFIO, "snd_hda_intel"}},
			wantWrites: []string{
				"bus/pci/devices/0000:3b:00.0/driver_override <- ",
				"bus/pci/devices/0000:3b:00.0/driver/unbind <- 0000:3b:00.0",
				"bus/pci/drivers_probe <- 0000:3b:00.0",
				"bus/pci/devices/0000:3b:00.1/driver_override <- ",
				"bus/pci/devices/0000:3b:00.1/driver/unbind <- 0000:3b:00.1",
				"bus/pci/drivers_probe <- 0000:3b:00.1",
			},
		},
		{
			name:    "nvidia without the nvidia driver loaded: the GPU rests on no driver",
			drivers: []string{"snd_hda_intel"},
			policy:  IdleNVIDIA,
			want: map[string]state{
				gpuA:   {"", ""},
				audioA: {"snd_hda_intel", ""},
			},
			wantChanges: []Change{{gpuA, DriverVFIO, ""}, {audioA, DriverVFIO, "snd_hda_intel"}},
			wantWrites: []string{
				"bus/pci/devices/0000:3b:00.0/driver_override <- ",
				"bus/pci/devices/0000:3b:00.0/driver/unbind <- 0000:3b:00.0",
				"bus/pci/drivers_probe <- 0000:3b:00.0",
				"bus/pci/devices/0000:3b:00.1/driver_override <- ",
				"bus/pci/devices/0000:3b:00.1/driver/unbind <- 0000:3b:00.1",
				"bus/pci/drivers_probe <- 0000:3b:00.1",
			},
		},
		{
			name:   "vfio-pci: stays bound, nothing written",
			policy: IdleVFIO,
			want: map[string]state{
				gpuA:   {DriverVFIO, DriverVFIO},
				audioA: {DriverVFIO, DriverVFIO},
			},
			wantVFIO: true,
		},
		{
			name:   "none: unbound, overrides cleared, nothing probed",
			policy: IdleNone,
			want: map[string]state{
				gpuA:   {"", ""},
				audioA: {"", ""},
			},
			wantChanges: []Change{{gpuA, DriverVFIO, ""}, {audioA, DriverVFIO, ""}},
			wantWrites: []string{
				"bus/pci/devices/0000:3b:00.0/driver_override <- ",
				"bus/pci/devices/0000:3b:00.0/driver/unbind <- 0000:3b:00.0",
				"bus/pci/devices/0000:3b:00.1/driver_override <- ",
				"bus/pci/devices/0000:3b:00.1/driver/unbind <- 0000:3b:00.1",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			drivers := tt.drivers
			if drivers == nil {
				drivers = hostDrivers
			}
			k, err := NewKernel(KernelConfig{Drivers: drivers, Devices: []FakeDevice{gpu(gpuA, 12, ""), audio(audioA, 12, "")}})
			if err != nil {
				t.Fatal(err)
			}
			b := NewBinder(New(k))
			if _, err := b.Bind(testCtx(t), gpuA); err != nil {
				t.Fatalf("Bind: %v", err)
			}
			from := len(k.Writes())

			res, err := b.Release(testCtx(t), gpuA, tt.policy)
			if err != nil {
				t.Fatalf("Release(%s): %v", tt.policy, err)
			}
			for addr, want := range tt.want {
				if got, ov := driverOf(t, k, addr); got != want.driver || ov != want.override {
					t.Errorf("%s on %q override %q, want %q override %q", addr, got, ov, want.driver, want.override)
				}
			}
			if !slices.Equal(res.Changes, tt.wantChanges) {
				t.Errorf("Changes = %v, want %v", res.Changes, tt.wantChanges)
			}
			if got := k.Exists("/dev/vfio/12"); got != tt.wantVFIO {
				t.Errorf("/dev/vfio/12 exists = %v, want %v", got, tt.wantVFIO)
			}
			wantWrites(t, k, from, tt.wantWrites...)

			// Releasing again changes nothing.
			from = len(k.Writes())
			if res, err := b.Release(testCtx(t), gpuA, tt.policy); err != nil || len(res.Changes) != 0 {
				t.Errorf("second Release = %v, %v; want no change", res.Changes, err)
			}
			wantWrites(t, k, from)
		})
	}
}

func TestReleaseThenBindAgain(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, "nvidia"), audio(audioA, 12, "snd_hda_intel"))
	b := NewBinder(New(k))
	for _, p := range []IdlePolicy{IdleNVIDIA, IdleNone, IdleVFIO} {
		if _, err := b.Bind(testCtx(t), gpuA); err != nil {
			t.Fatalf("Bind after %s: %v", p, err)
		}
		if _, err := b.Release(testCtx(t), audioA, p); err != nil {
			t.Fatalf("Release(%s): %v", p, err)
		}
	}
	if got, _ := driverOf(t, k, gpuA); got != DriverVFIO {
		t.Errorf("after the last Release(vfio-pci) the GPU is on %q", got)
	}
}

func TestReleaseRejectsUnknownPolicy(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, DriverVFIO))
	if _, err := NewBinder(New(k)).Release(testCtx(t), gpuA, IdlePolicy("nouveau")); err == nil {
		t.Fatal("Release with policy nouveau succeeded")
	}
	if w := k.Writes(); len(w) != 0 {
		t.Errorf("wrote %v", w)
	}
}

func TestParseIdlePolicy(t *testing.T) {
	for in, want := range map[string]IdlePolicy{"vfio-pci": IdleVFIO, "nvidia": IdleNVIDIA, "none": IdleNone} {
		if got, err := ParseIdlePolicy(in); err != nil || got != want {
			t.Errorf("ParseIdlePolicy(%q) = %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "vfio", "NVIDIA", "none ", "nouveau"} {
		if _, err := ParseIdlePolicy(in); err == nil {
			t.Errorf("ParseIdlePolicy(%q) succeeded", in)
		}
	}
	var p IdlePolicy
	if err := p.UnmarshalText([]byte("none")); err != nil || p != IdleNone {
		t.Errorf("UnmarshalText(none) = %q, %v", p, err)
	}
	if err := p.UnmarshalText([]byte("x")); err == nil || p != IdleNone {
		t.Errorf("UnmarshalText(x) = %v and left %q, want an error and no change", err, p)
	}
}
