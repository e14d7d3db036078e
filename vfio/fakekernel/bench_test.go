package fakekernel_test

import (
	"context"
	"testing"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// BenchmarkBindRelease is what a claim and its release cost the simulated
// kernel (and vfio's reads of it): a GPU and its audio function bound to
// vfio-pci, then back to their host drivers. The agents of the system
// bench run on it, so its cost counts in their CPU per claim.
func BenchmarkBindRelease(b *testing.B) {
	k, err := fakekernel.New(fakekernel.Config{Drivers: hostDrivers, Devices: []fakekernel.Function{gpu(gpuA, 12, "nvidia"), audio(audioA, 12, "snd_hda_intel")}})
	if err != nil {
		b.Fatal(err)
	}
	bd := vfio.NewBinder(vfio.New(k))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bd.Bind(ctx, gpuA); err != nil {
			b.Fatal(err)
		}
		if _, err := bd.Release(ctx, gpuA, vfio.IdleNVIDIA); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDeviceRead is one read of a device's attributes through vfio.
func BenchmarkDeviceRead(b *testing.B) {
	k, err := fakekernel.New(fakekernel.Config{Drivers: hostDrivers, Devices: []fakekernel.Function{gpu(gpuA, 12, "nvidia"), audio(audioA, 12, "snd_hda_intel")}})
	if err != nil {
		b.Fatal(err)
	}
	p := vfio.New(k)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Device(gpuA); err != nil {
			b.Fatal(err)
		}
	}
}
