package vfio_test

import (
	"slices"
	"testing"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

func TestRelease(t *testing.T) {
	type state struct{ driver, override string }
	tests := []struct {
		name        string
		drivers     []string // loaded host drivers; nil: hostDrivers
		policy      vfio.IdlePolicy
		want        map[string]state
		wantChanges []vfio.Change
		wantVFIO    bool // /dev/vfio/12 exists afterwards
		wantWrites  []string
	}{
		{
			name:   "nvidia: back on the host drivers, overrides cleared",
			policy: vfio.IdleNVIDIA,
			want: map[string]state{
				gpuA:   {"nvidia", ""},
				audioA: {"snd_hda_intel", ""},
			},
			wantChanges: []vfio.Change{{gpuA, vfio.DriverVFIO, "nvidia"}, {audioA, vfio.DriverVFIO, "snd_hda_intel"}},
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
			policy:  vfio.IdleNVIDIA,
			want: map[string]state{
				gpuA:   {"", ""},
				audioA: {"snd_hda_intel", ""},
			},
			wantChanges: []vfio.Change{{gpuA, vfio.DriverVFIO, ""}, {audioA, vfio.DriverVFIO, "snd_hda_intel"}},
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
			policy: vfio.IdleVFIO,
			want: map[string]state{
				gpuA:   {vfio.DriverVFIO, vfio.DriverVFIO},
				audioA: {vfio.DriverVFIO, vfio.DriverVFIO},
			},
			wantVFIO: true,
		},
		{
			name:   "none: unbound, overrides cleared, nothing probed",
			policy: vfio.IdleNone,
			want: map[string]state{
				gpuA:   {"", ""},
				audioA: {"", ""},
			},
			wantChanges: []vfio.Change{{gpuA, vfio.DriverVFIO, ""}, {audioA, vfio.DriverVFIO, ""}},
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
			k, err := fakekernel.New(fakekernel.Config{Drivers: drivers, Devices: []fakekernel.Function{gpu(gpuA, 12, ""), audio(audioA, 12, "")}})
			if err != nil {
				t.Fatal(err)
			}
			b := vfio.NewBinder(vfio.New(k))
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
	b := vfio.NewBinder(vfio.New(k))
	for _, p := range []vfio.IdlePolicy{vfio.IdleNVIDIA, vfio.IdleNone, vfio.IdleVFIO} {
		if _, err := b.Bind(testCtx(t), gpuA); err != nil {
			t.Fatalf("Bind after %s: %v", p, err)
		}
		if _, err := b.Release(testCtx(t), audioA, p); err != nil {
			t.Fatalf("Release(%s): %v", p, err)
		}
	}
	if got, _ := driverOf(t, k, gpuA); got != vfio.DriverVFIO {
		t.Errorf("after the last Release(vfio-pci) the GPU is on %q", got)
	}
}

func TestReleaseRejectsUnknownPolicy(t *testing.T) {
	k := bootKernel(t, gpu(gpuA, 12, vfio.DriverVFIO))
	if _, err := vfio.NewBinder(vfio.New(k)).Release(testCtx(t), gpuA, vfio.IdlePolicy("nouveau")); err == nil {
		t.Fatal("Release with policy nouveau succeeded")
	}
	if w := k.Writes(); len(w) != 0 {
		t.Errorf("wrote %v", w)
	}
}

func TestParseIdlePolicy(t *testing.T) {
	for in, want := range map[string]vfio.IdlePolicy{"vfio-pci": vfio.IdleVFIO, "nvidia": vfio.IdleNVIDIA, "none": vfio.IdleNone} {
		if got, err := vfio.ParseIdlePolicy(in); err != nil || got != want {
			t.Errorf("ParseIdlePolicy(%q) = %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "vfio", "NVIDIA", "none ", "nouveau"} {
		if _, err := vfio.ParseIdlePolicy(in); err == nil {
			t.Errorf("ParseIdlePolicy(%q) succeeded", in)
		}
	}
	var p vfio.IdlePolicy
	if err := p.UnmarshalText([]byte("none")); err != nil || p != vfio.IdleNone {
		t.Errorf("UnmarshalText(none) = %q, %v", p, err)
	}
	if err := p.UnmarshalText([]byte("x")); err == nil || p != vfio.IdleNone {
		t.Errorf("UnmarshalText(x) = %v and left %q, want an error and no change", err, p)
	}
}
