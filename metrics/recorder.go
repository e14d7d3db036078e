package metrics

import (
	"strconv"
	"time"

	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics implements the protocol's Recorder; every value of its
// vocabulary (agent/events) is a label value, pre-created at 0.
var _ events.Recorder = (*Metrics)(nil)

// eventMetrics holds the metrics fed by Recorder calls.
type eventMetrics struct {
	claims        *prometheus.CounterVec
	claimDuration prometheus.Histogram
	reservations  *prometheus.CounterVec
	vfioDuration  *prometheus.HistogramVec
	vfioErrors    *prometheus.CounterVec
	xids          *prometheus.CounterVec
	lookups       *prometheus.CounterVec
}

func newEvents() *eventMetrics {
	e := &eventMetrics{
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "claims_total",
			Help: "Claim requests answered by this agent, by outcome.",
		}, []string{"outcome"}),
		claimDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "claim_duration_seconds",
			Help: "Time from a claim request to its answer, whatever the outcome.",
			// 1 ms (a refusal from the ledger) to 60 s (binding several
			// groups, each write with its own deadline).
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		reservations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "reservations_total",
			Help: "Reservation events in the local ledger, by outcome.",
		}, []string{"outcome"}),
		vfioDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "vfio_operation_duration_seconds",
			Help: "Time to move a GPU's IOMMU group to vfio-pci (bind) or back to its idle driver (release), failed ones included.",
			// Writes to vfio-pci take milliseconds; an unbind from nvidia
			// can take seconds, up to the write deadline (10 s by default).
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"op"}),
		vfioErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "vfio_operation_errors_total",
			Help: "Binds and releases of a GPU's IOMMU group that failed.",
		}, []string{"op"}),
		xids: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "gpu_xid_errors_total",
			Help: "Critical XID errors NVML reported on the GPU, by XID number.",
		}, []string{"pci_address", "model", "xid"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "claim_lookups_total",
			Help: "Claim-ID lookups of claims, gets and releases coordinated by this agent: answered by the name registry (registry), by this server's own ledger (local), by the ID's home (directory) or by asking every server (every_server).",
		}, []string{"path"}),
	}
	// Every known label value exists from the start at 0, so that rate()
	// and increase() see the first event instead of a series appearing
	// with it.
	for _, o := range events.ClaimOutcomes() {
		e.claims.WithLabelValues(o)
	}
	for _, o := range events.ReservationOutcomes() {
		e.reservations.WithLabelValues(o)
	}
	for _, p := range events.LookupPaths() {
		e.lookups.WithLabelValues(p)
	}
	for _, op := range events.VFIOOps() {
		e.vfioDuration.WithLabelValues(op)
		e.vfioErrors.WithLabelValues(op)
	}
	return e
}

func (e *eventMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{e.claims, e.claimDuration, e.reservations, e.vfioDuration, e.vfioErrors, e.xids, e.lookups}
}

// ClaimDone implements events.Recorder.
func (m *Metrics) ClaimDone(outcome string, d time.Duration) {
	m.events.claims.WithLabelValues(outcome).Inc()
	m.events.claimDuration.Observe(d.Seconds())
}

// Reservation implements events.Recorder.
func (m *Metrics) Reservation(outcome string) {
	m.events.reservations.WithLabelValues(outcome).Inc()
}

// VFIOOperation implements events.Recorder.
func (m *Metrics) VFIOOperation(op string, d time.Duration, err error) {
	m.events.vfioDuration.WithLabelValues(op).Observe(d.Seconds())
	if err != nil {
		m.events.vfioErrors.WithLabelValues(op).Inc()
	}
}

// ClaimLookup implements events.Recorder.
func (m *Metrics) ClaimLookup(path string) {
	m.events.lookups.WithLabelValues(path).Inc()
}

// XID implements events.Recorder.
func (m *Metrics) XID(pciAddress, model string, xid uint64) {
	c, err := m.events.xids.GetMetricWithLabelValues(pciAddress, model, strconv.FormatUint(xid, 10))
	if err != nil {
		// Only a label value that is not UTF-8 gets here; losing one count
		// beats panicking in the XID watcher.
		m.log.Warn("XID error not counted", "pci_address", pciAddress, "model", model, "xid", xid, "error", err)
		return
	}
	c.Inc()
}
