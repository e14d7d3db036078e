package vfio_test

import (
	"errors"
	"testing"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

func TestCheckAgreesWithBindAndWritesNothing(t *testing.T) {
	cases := []struct {
		name string
		devs []fakekernel.Function
		addr string
		want error // nil: viable
	}{
		{"GPU with its audio function", []fakekernel.Function{gpu(gpuA, 12, "nvidia"), audio(audioA, 12, "snd_hda_intel")}, gpuA, nil},
		{"GPU on no driver", []fakekernel.Function{gpu(gpuA, 12, "")}, gpuA, nil},
		{"foreign NIC with a host driver", []fakekernel.Function{gpu(gpuA, 12, "nvidia"), nicDev(nic, 12, "ixgbe")}, gpuA, vfio.ErrGroupNotViable},
		{"foreign NIC on no driver", []fakekernel.Function{gpu(gpuA, 12, "nvidia"), nicDev(nic, 12, "")}, gpuA, nil},
		{"no IOMMU group", []fakekernel.Function{gpu(gpuA, -1, "nvidia")}, gpuA, vfio.ErrNoIOMMUGroup},
		{"not on the allow list", []fakekernel.Function{nicDev(nic, 12, "ixgbe")}, nic, vfio.ErrNotAllowed},
		{"hostile address", []fakekernel.Function{gpu(gpuA, 12, "nvidia")}, "../../x", vfio.ErrInvalidAddress},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := bootKernel(t, tc.devs...)
			b := vfio.NewBinder(vfio.New(k))
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
