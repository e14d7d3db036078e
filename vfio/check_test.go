package vfio

import (
	"errors"
	"testing"
)

func TestCheckAgreesWithBindAndWritesNothing(t *testing.T) {
	cases := []struct {
		name string
		devs []FakeDevice
		addr string
		want error // nil: viable
	}{
		{"GPU with its audio function", []FakeDevice{gpu(gpuA, 12, "nvidia"), audio(audioA, 12, "snd_hda_intel")}, gpuA, nil},
		{"GPU on no driver", []FakeDevice{gpu(gpuA, 12, "")}, gpuA, nil},
		{"foreign NIC with a host driver", []FakeDevice{gpu(gpuA, 12, "nvidia"), nicDev(nic, 12, "ixgbe")}, gpuA, ErrGroupNotViable},
		{"foreign NIC on no driver", []FakeDevice{gpu(gpuA, 12, "nvidia"), nicDev(nic, 12, "")}, gpuA, nil},
		{"no IOMMU group", []FakeDevice{gpu(gpuA, -1, "nvidia")}, gpuA, ErrNoIOMMUGroup},
		{"not on the allow list", []FakeDevice{nicDev(nic, 12, "ixgbe")}, nic, ErrNotAllowed},
		{"hostile address", []FakeDevice{gpu(gpuA, 12, "nvidia")}, "../../x", ErrInvalidAddress},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := bootKernel(t, tc.devs...)
			b := NewBinder(New(k))
			err := b.Check(tc.addr)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Check(%s) = %v, want %v", tc.addr, err, tc.want)
			}
			if n := len(k.Writes()); n != 0 {
				t.Fatalf("Check wrote %d times", n)
			}
			// Bind must reach the same verdict.
			_, berr := b.Bind(testCtx(t), tc.addr)
			if (berr == nil) != (err == nil) {
				t.Errorf("Check says %v but Bind says %v", err, berr)
			}
		})
	}
}
