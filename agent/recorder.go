package agent

import "time"

// Recorder receives the events the metrics count. The agent's wiring plugs
// in the metrics package's implementation; the protocol only names events,
// and never depends on how they are exported.
type Recorder interface {
	// ClaimDone: a claim request finished with outcome (Claim… constants)
	// after d.
	ClaimDone(outcome string, d time.Duration)
	// Reservation: one step of a reservation's life (Reservation… constants).
	Reservation(outcome string)
	// VFIOOperation: one bind or release (VFIO… constants) of a GPU's IOMMU
	// group, how long it took and its error, if any.
	VFIOOperation(op string, d time.Duration, err error)
	// XID: one XID error NVML reported on a GPU.
	XID(pciAddress, model string, xid uint64)
	// ClaimLookup: how a claim ID was looked up by this agent as
	// coordinator (Lookup… constants).
	ClaimLookup(path string)
}

// Claim outcomes (Recorder.ClaimDone).
const (
	ClaimGranted      = "granted"
	ClaimNotAvailable = "not_available"
	ClaimInvalid      = "invalid"
	ClaimConflict     = "conflict"
	ClaimBindFailed   = "bind_failed"
	ClaimError        = "error"
)

// Reservation steps (Recorder.Reservation).
const (
	ReservationReserved  = "reserved"
	ReservationFailed    = "failed"
	ReservationCommitted = "committed"
	ReservationExpired   = "expired"
	ReservationReleased  = "released"
	ReservationAborted   = "aborted"
)

// Claim-ID lookup paths (Recorder.ClaimLookup).
const (
	LookupLocal       = "local"
	LookupDirectory   = "directory"
	LookupEveryServer = "every_server"
	LookupRegistry    = "registry"
)

// VFIO operations (Recorder.VFIOOperation).
const (
	VFIOBind    = "bind"
	VFIORelease = "release"
)

type nopRecorder struct{}

func (nopRecorder) ClaimDone(string, time.Duration)            {}
func (nopRecorder) Reservation(string)                         {}
func (nopRecorder) VFIOOperation(string, time.Duration, error) {}
func (nopRecorder) XID(string, string, uint64)                 {}
func (nopRecorder) ClaimLookup(string)                         {}
