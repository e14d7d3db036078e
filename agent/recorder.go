package agent

import "time"

// Recorder receives the events the metrics count. The metrics package
// implements it; the agent never depends on how they are exported.
type Recorder interface {
	ClaimDone(outcome string, d time.Duration)
	Reservation(outcome string)
	VFIOOperation(op string, d time.Duration, err error)
	XID(pciAddress, model string, xid uint64)
	ClaimLookup(path string)
}

type nopRecorder struct{}

func (nopRecorder) ClaimDone(string, time.Duration)            {}
func (nopRecorder) Reservation(string)                         {}
func (nopRecorder) VFIOOperation(string, time.Duration, error) {}
func (nopRecorder) XID(string, string, uint64)                 {}
func (nopRecorder) ClaimLookup(string)                         {}
