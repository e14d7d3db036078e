package platform

import (
	"context"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/tools/kube/controlplane"
	resourceapi "k8s.io/api/resource/v1"
)

// BenchmarkSliceAfterClaim is the time from a libvirt VM's claim (or
// release) answered by the agent to the ResourceSlice in the API server
// without (or with) its GPU, seen through a watch: the agent's change
// feed, the driver's republish, the API server's write and watch.
func BenchmarkSliceAfterClaim(b *testing.B) {
	cp := controlplane.Start(b, controlplane.Options{})
	ctx := context.Background()
	if err := ApplyDeviceClasses(ctx, cp); err != nil {
		b.Fatal(err)
	}
	s := StartServer(b, cp, "hv-1", "dgx-h100", quiet())
	st, err := s.Client.Status(ctx)
	if err != nil {
		b.Fatal(err)
	}
	addr := st.GPUs[0].PCIAddress
	var seen time.Duration
	b.ResetTimer()
	for i := range b.N {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		var answered time.Time
		if i%2 == 0 {
			_, err = s.Client.Claim(wctx, "libvirt-vm", api.ClaimRequest{Devices: []string{addr}})
			answered = time.Now()
			if err == nil {
				_, err = WaitSlice(wctx, cp, "hv-1", func(d []resourceapi.Device) bool { _, ok := Has(d, addr); return !ok })
			}
		} else {
			_, err = s.Client.Release(wctx, "libvirt-vm")
			answered = time.Now()
			if err == nil {
				_, err = WaitSlice(wctx, cp, "hv-1", func(d []resourceapi.Device) bool { _, ok := Has(d, addr); return ok })
			}
		}
		seen += time.Since(answered)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(seen.Milliseconds())/float64(b.N), "ms-to-slice/op")
}
