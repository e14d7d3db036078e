package dra

import (
	"context"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// chanPublisher hands every slice the driver publishes to a channel.
type chanPublisher chan []resourceapi.Device

func (c chanPublisher) PublishResources(ctx context.Context, r resourceslice.DriverResources) error {
	for _, p := range r.Pools {
		select {
		case c <- p.Slices[0].Devices:
		case <-ctx.Done():
		}
	}
	return nil
}

// BenchmarkRepublish is the time from a ledger change (a libvirt VM's
// claim or release through the agent's API) to the slice without (or with)
// its GPU handed to the publisher: the agent's change feed, the watch's
// answer, the devices rebuilt. The API server's own write comes on top
// (tools/kube's BenchmarkSliceAfterClaim measures it whole).
func BenchmarkRepublish(b *testing.B) {
	r := newRigTB(b)
	pub := make(chanPublisher, 1)
	r.d.pub = pub
	r.d.startPublishing(context.Background())
	defer r.d.Stop()
	<-pub
	ctx := context.Background()
	addr := r.st.GPUs[0].PCIAddress
	var after time.Duration
	b.ResetTimer()
	for i := range b.N {
		var err error
		if i%2 == 0 {
			_, err = r.client.Claim(ctx, "vm-bench", api.ClaimRequest{Devices: []string{addr}})
		} else {
			_, err = r.client.Release(ctx, "vm-bench")
		}
		if err != nil {
			b.Fatal(err)
		}
		answered := time.Now()
		for devs := range pub {
			if len(devs) == 8-(1-i%2) {
				break
			}
		}
		after += time.Since(answered)
	}
	b.ReportMetric(float64(after.Microseconds())/float64(b.N), "µs-after-answer/op")
}

// BenchmarkPrepare is one ResourceClaim of one GPU prepared and unprepared
// (a gpuherd claim and release, the CDI spec, the checkpoint), against
// BenchmarkPlainClaim, the same claim and release through the API alone.
func BenchmarkPrepare(b *testing.B) {
	r := newRigTB(b)
	c := allocation("bench", "00000000-0000-4000-8000-00000000beef", DeviceName(r.st.GPUs[1].PCIAddress))
	b.ResetTimer()
	for range b.N {
		res, _ := r.d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
		if err := res[c.UID].Err; err != nil {
			b.Fatal(err)
		}
		if err := r.unprepareTB(b, c); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPlainClaim(b *testing.B) {
	r := newRigTB(b)
	ctx := context.Background()
	addr := r.st.GPUs[1].PCIAddress
	b.ResetTimer()
	for range b.N {
		if _, err := r.client.Claim(ctx, "plain", api.ClaimRequest{Devices: []string{addr}}); err != nil {
			b.Fatal(err)
		}
		if _, err := r.client.Release(ctx, "plain"); err != nil {
			b.Fatal(err)
		}
	}
}
