// Package events is the vocabulary of what the claim protocol reports:
// the Recorder interface the agent calls as things happen, and every value
// it passes. The protocol names events here and never depends on how they
// are exported; the metrics package implements Recorder and turns each
// value into a label value of its counters, pre-created at 0. Each value
// is defined once, here; metrics' tests check that every one of them
// reaches the exposition and its documentation.
package events

import "time"

// Recorder receives the events the metrics count. Implementations are safe
// for concurrent use.
type Recorder interface {
	// ClaimDone: a claim request finished with outcome (Claim… constants)
	// after d.
	ClaimDone(outcome string, d time.Duration)
	// Reservation: one step of a reservation's life (Reservation…
	// constants).
	Reservation(outcome string)
	// VFIOOperation: one bind or release (VFIO… constants) of a GPU's
	// IOMMU group, how long it took and its error, if any.
	VFIOOperation(op string, d time.Duration, err error)
	// XID: one XID error NVML reported on a GPU.
	XID(pciAddress, model string, xid uint64)
	// ClaimLookup: how a claim ID was looked up by this agent as
	// coordinator (Lookup… constants).
	ClaimLookup(path string)
}

// Claim outcomes (Recorder.ClaimDone): gpuherd_claims_total's outcome.
const (
	ClaimGranted      = "granted"       // the claim holds its GPUs
	ClaimNotAvailable = "not_available" // no server could hold the whole request
	ClaimInvalid      = "invalid"       // the request was malformed
	ClaimConflict     = "conflict"      // the ID is in use with a different request
	ClaimBindFailed   = "bind_failed"   // GPUs were found but could not be moved to vfio-pci
	ClaimError        = "error"         // anything else
)

// Reservation steps (Recorder.Reservation): gpuherd_reservations_total's
// outcome.
const (
	ReservationReserved  = "reserved"  // a reservation was taken
	ReservationFailed    = "failed"    // taking one failed (no GPUs, or they would not bind)
	ReservationCommitted = "committed" // its coordinator committed it
	ReservationExpired   = "expired"   // its lease ran out uncommitted
	ReservationReleased  = "released"  // it was released before commit
	ReservationAborted   = "aborted"   // taking it failed half-way and was undone
	ReservationAbandoned = "abandoned" // not taken: its coordinator stopped waiting first
)

// Claim-ID lookup paths (Recorder.ClaimLookup):
// gpuherd_claim_lookups_total's path.
const (
	LookupLocal       = "local"        // this server holds the claim
	LookupDirectory   = "directory"    // the ID's home answered for it
	LookupEveryServer = "every_server" // the home could not vouch: every server was asked
	LookupRegistry    = "registry"     // the name registry answered for it, or the owner's hold decided
)

// VFIO operations (Recorder.VFIOOperation): the op label of the vfio
// metrics.
const (
	VFIOBind    = "bind"
	VFIORelease = "release"
)

// ClaimOutcomes lists every claim outcome.
func ClaimOutcomes() []string {
	return []string{ClaimGranted, ClaimNotAvailable, ClaimInvalid, ClaimConflict, ClaimBindFailed, ClaimError}
}

// ReservationOutcomes lists every reservation step.
func ReservationOutcomes() []string {
	return []string{ReservationReserved, ReservationFailed, ReservationCommitted, ReservationExpired, ReservationReleased, ReservationAborted, ReservationAbandoned}
}

// LookupPaths lists every claim-ID lookup path.
func LookupPaths() []string {
	return []string{LookupLocal, LookupDirectory, LookupEveryServer, LookupRegistry}
}

// VFIOOps lists every VFIO operation.
func VFIOOps() []string { return []string{VFIOBind, VFIORelease} }
