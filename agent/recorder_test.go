package agent

import (
	"testing"

	"github.com/gpuherd/gpuherd/metrics"
)

// The metrics adapt the agent's Recorder: the label values the protocol
// names must be the ones the metrics pre-create series for.
var _ Recorder = (*metrics.Metrics)(nil)

func TestRecorderNamesMatchMetrics(t *testing.T) {
	for _, p := range [][2]string{
		{ClaimGranted, metrics.ClaimGranted}, {ClaimNotAvailable, metrics.ClaimNotAvailable},
		{ClaimInvalid, metrics.ClaimInvalid}, {ClaimConflict, metrics.ClaimConflict},
		{ClaimBindFailed, metrics.ClaimBindFailed}, {ClaimError, metrics.ClaimError},
		{ReservationReserved, metrics.ReservationReserved}, {ReservationCommitted, metrics.ReservationCommitted},
		{ReservationExpired, metrics.ReservationExpired}, {ReservationReleased, metrics.ReservationReleased},
		{ReservationAborted, metrics.ReservationAborted},
		{LookupLocal, metrics.LookupLocal}, {LookupDirectory, metrics.LookupDirectory},
		{LookupEveryServer, metrics.LookupEveryServer},
		{VFIOBind, metrics.VFIOBind}, {VFIORelease, metrics.VFIORelease},
	} {
		if p[0] != p[1] {
			t.Errorf("agent names %q where the metrics name %q", p[0], p[1])
		}
	}
}
