// Package clock is the one seam through which the protocol reads time and
// waits: now, timers, tickers and deadlines. The agent runs on a monotonic
// reading of the wall clock (Monotonic); tests move a manual clock
// (NewManual) or freeze Now alone (WithNow); the simulation drives every
// timer from its own virtual time. Protocol code never calls the time
// package's clock functions itself (internal/layers checks it).
package clock

import (
	"sync"
	"time"
)

// Clock tells the time and makes timers that fire by it.
type Clock interface {
	Now() time.Time
	// NewTimer fires once, d from now, on its channel.
	NewTimer(d time.Duration) Timer
	// NewTicker fires every d on its channel, dropping ticks nobody read.
	NewTicker(d time.Duration) Ticker
	// AfterFunc runs f in its own goroutine d from now, unless stopped.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a time.Timer behind an interface.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Ticker is a time.Ticker behind an interface.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Since is the time elapsed on c since t.
func Since(c Clock, t time.Time) time.Duration { return c.Now().Sub(t) }

// Wall reads the system's wall clock. It is for what is dated by the
// calendar (a certificate's validity), and for starting a Monotonic clock.
func Wall() time.Time { return time.Now() }

// After is a channel that receives once, d from now on c. The timer is not
// stopped early; use NewTimer in a loop that may leave before it fires.
func After(c Clock, d time.Duration) <-chan time.Time { return c.NewTimer(d).C() }

// Deadline is a point d after its start on a clock, read by a timer of that
// clock: a loop that waits on the same clock's timers reaches it whether
// the clock is real, manual, or has its Now frozen by a test.
type Deadline struct {
	t      Timer
	mu     sync.Mutex
	passed bool
}

// NewDeadline starts a deadline d from now on c. Stop it when done.
func NewDeadline(c Clock, d time.Duration) *Deadline {
	return &Deadline{t: c.NewTimer(d)}
}

// Passed reports whether the deadline has been reached.
func (d *Deadline) Passed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.passed {
		select {
		case <-d.t.C():
			d.passed = true
		default:
		}
	}
	return d.passed
}

// Stop releases the deadline's timer.
func (d *Deadline) Stop() { d.t.Stop() }

// realTimers makes the runtime's timers; the clocks below differ in Now.
type realTimers struct{}

func (realTimers) NewTimer(d time.Duration) Timer   { return realTimer{time.NewTimer(d)} }
func (realTimers) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }
func (realTimers) AfterFunc(d time.Duration, f func()) Timer {
	return realTimer{time.AfterFunc(d, f)}
}

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time        { return t.t.C }
func (t realTimer) Stop() bool                 { return t.t.Stop() }
func (t realTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time { return t.t.C }
func (t realTicker) Stop()               { t.t.Stop() }

// Monotonic reads the wall clock once, at start, and then advances with the
// monotonic clock: a step of the wall clock while the agent runs (NTP
// catching up, an operator) can neither stretch nor cut a lease. A step
// takes effect at the next start.
func Monotonic(wall func() time.Time) Clock {
	start := wall().Round(0) // the wall reading only
	mono := time.Now()
	return WithNow(func() time.Time { return start.Add(time.Since(mono)) })
}

// WithNow is a clock whose Now is now and whose timers are the runtime's:
// a test that moves leases by hand keeps real waits.
func WithNow(now func() time.Time) Clock { return nowClock{now: now} }

type nowClock struct {
	realTimers
	now func() time.Time
}

func (c nowClock) Now() time.Time { return c.now() }
