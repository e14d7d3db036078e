package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Recorder is how the agent reports events as they happen. Metrics
// implements it; Nop discards. Implementations are safe for concurrent use.
type Recorder interface {
	// ClaimDone records a finished claim request: its outcome (Claim…
	// constants) and how long it took, from request to answer.
	ClaimDone(outcome string, d time.Duration)
	// Reservation records one step of a reservation's life (Reservation…
	// constants).
	Reservation(outcome string)
	// VFIOOperation records one bind or release (VFIOBind, VFIORelease) of
	// a GPU's IOMMU group, with its duration and its error, if any.
	VFIOOperation(op string, d time.Duration, err error)
	// XID records one XID error NVML reported on a GPU.
	XID(pciAddress, model string, xid uint64)
	// ClaimLookup records how a claim ID was looked up by this agent as
	// coordinator (Lookup… constants).
	ClaimLookup(path string)
}

// Claim outcomes, the values of gpuherd_claims_total's outcome label.
const (
	ClaimGranted      = "granted"       // the claim holds its GPUs
	ClaimNotAvailable = "not_available" // no server could hold the whole request
	ClaimInvalid      = "invalid"       // the request was malformed
	ClaimConflict     = "conflict"      // the ID is in use with a different request
	ClaimBindFailed   = "bind_failed"   // GPUs were found but could not be moved to vfio-pci
	ClaimError        = "error"         // anything else
)

// Reservation outcomes, the values of gpuherd_reservations_total's outcome
// label.
const (
	ReservationReserved  = "reserved"  // a reservation was taken
	ReservationCommitted = "committed" // its coordinator committed it
	ReservationExpired   = "expired"   // its lease ran out uncommitted
	ReservationReleased  = "released"  // it was released before commit
	ReservationAborted   = "aborted"   // taking it failed half-way and was undone
)

// Claim-ID lookups, the values of gpuherd_claim_lookups_total's path label.
const (
	LookupLocal       = "local"        // this server holds the claim
	LookupDirectory   = "directory"    // the ID's home answered for it
	LookupEveryServer = "every_server" // the home could not vouch: every server was asked
	LookupRegistry    = "registry"     // the name registry answered for it, or the owner's hold decided
)

// VFIO operations, the values of the op label.
const (
	VFIOBind    = "bind"
	VFIORelease = "release"
)

var (
	claimOutcomes       = []string{ClaimGranted, ClaimNotAvailable, ClaimInvalid, ClaimConflict, ClaimBindFailed, ClaimError}
	reservationOutcomes = []string{ReservationReserved, ReservationCommitted, ReservationExpired, ReservationReleased, ReservationAborted}
	vfioOps             = []string{VFIOBind, VFIORelease}
	lookupPaths         = []string{LookupLocal, LookupDirectory, LookupEveryServer, LookupRegistry}
)

// events holds the metrics fed by Recorder calls.
type events struct {
	claims        *prometheus.CounterVec
	claimDuration prometheus.Histogram
	reservations  *prometheus.CounterVec
	vfioDuration  *prometheus.HistogramVec
	vfioErrors    *prometheus.CounterVec
	xids          *prometheus.CounterVec
	lookups       *prometheus.CounterVec
}

func newEvents() *events {
	e := &events{
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
	for _, o := range claimOutcomes {
		e.claims.WithLabelValues(o)
	}
	for _, o := range reservationOutcomes {
		e.reservations.WithLabelValues(o)
	}
	for _, p := range lookupPaths {
		e.lookups.WithLabelValues(p)
	}
	for _, op := range vfioOps {
		e.vfioDuration.WithLabelValues(op)
		e.vfioErrors.WithLabelValues(op)
	}
	return e
}

func (e *events) collectors() []prometheus.Collector {
	return []prometheus.Collector{e.claims, e.claimDuration, e.reservations, e.vfioDuration, e.vfioErrors, e.xids, e.lookups}
}

// ClaimDone implements Recorder.
func (m *Metrics) ClaimDone(outcome string, d time.Duration) {
	m.events.claims.WithLabelValues(outcome).Inc()
	m.events.claimDuration.Observe(d.Seconds())
}

// Reservation implements Recorder.
func (m *Metrics) Reservation(outcome string) {
	m.events.reservations.WithLabelValues(outcome).Inc()
}

// VFIOOperation implements Recorder.
func (m *Metrics) VFIOOperation(op string, d time.Duration, err error) {
	m.events.vfioDuration.WithLabelValues(op).Observe(d.Seconds())
	if err != nil {
		m.events.vfioErrors.WithLabelValues(op).Inc()
	}
}

// ClaimLookup implements Recorder.
func (m *Metrics) ClaimLookup(path string) {
	m.events.lookups.WithLabelValues(path).Inc()
}

// XID implements Recorder.
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

// Nop returns a Recorder that discards everything, for code run without
// metrics (tests, the CLI's offline commands).
func Nop() Recorder { return nop{} }

type nop struct{}

func (nop) ClaimDone(string, time.Duration)            {}
func (nop) Reservation(string)                         {}
func (nop) VFIOOperation(string, time.Duration, error) {}
func (nop) ClaimLookup(string)                         {}
func (nop) XID(string, string, uint64)                 {}
