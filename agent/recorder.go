package agent

import (
	"time"

	"github.com/gpuherd/gpuherd/agent/events"
)

// Recorder receives the events the metrics count: the protocol's
// vocabulary, defined once in agent/events. The agent's wiring plugs in
// the metrics package's implementation; the protocol only names events,
// and never depends on how they are exported.
type Recorder = events.Recorder

type nopRecorder struct{}

func (nopRecorder) ClaimDone(string, time.Duration)            {}
func (nopRecorder) Reservation(string)                         {}
func (nopRecorder) VFIOOperation(string, time.Duration, error) {}
func (nopRecorder) XID(string, string, uint64)                 {}
func (nopRecorder) ClaimLookup(string)                         {}
