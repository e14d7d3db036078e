package peerwire

import (
	"sync/atomic"
	"time"
)

// Handlers run on reused goroutines. A call's handler goes deep (routing,
// the owner's reservation, the ledger, JSON), so a goroutine started for
// each call grows its stack from the runtime's small start by copying it
// several times, on every call: in the system bench's throughput test that
// was 5% of all CPU. A goroutine that finished a call waits a while for
// the next one instead, with its stack grown.

// workerIdle is how long a goroutine that finished a call waits for
// another before it exits.
const workerIdle = 10 * time.Second

// idleWork hands a call to a goroutine waiting for one. Unbuffered: a send
// succeeds only when a worker is waiting.
var idleWork = make(chan func())

// workersStarted counts the worker goroutines started, for tests.
var workersStarted atomic.Int64

// spawn runs fn on a waiting worker goroutine, or on a new one.
func spawn(fn func()) {
	select {
	case idleWork <- fn:
	default:
		workersStarted.Add(1)
		go work(fn)
	}
}

// work runs fn, then the calls handed to it, until none comes for
// workerIdle. It keeps no reference to a call it finished.
func work(fn func()) {
	fn()
	fn = nil
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		select {
		case fn = <-idleWork:
			fn()
			fn = nil
			idle.Reset(workerIdle)
		case <-idle.C:
			return
		}
	}
}
