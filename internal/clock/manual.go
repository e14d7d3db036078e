package clock

import (
	"sort"
	"sync"
	"time"
)

// Manual is a clock that moves only when told to (Advance, Set): its timers
// and tickers fire as it passes their times, in time order; a timer made
// or reset with no time left fires at once. Tests and the
// simulation use it.
type Manual struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers []*manualTimer
}

// NewManual starts a manual clock at start.
func NewManual(start time.Time) *Manual { return &Manual{now: start} }

// Now is the clock's time.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Advance moves the clock d forward, firing every timer it passes.
func (m *Manual) Advance(d time.Duration) { m.Set(m.Now().Add(d)) }

// Set moves the clock to t (never back), firing every timer due by then in
// time order; a timer's function runs in its own goroutine, as the
// runtime's AfterFunc does.
func (m *Manual) Set(t time.Time) {
	for {
		m.mu.Lock()
		next := m.nextDue(t)
		if next == nil {
			if t.After(m.now) {
				m.now = t
			}
			m.mu.Unlock()
			return
		}
		if next.at.After(m.now) {
			m.now = next.at
		}
		next.fire(m)
		m.mu.Unlock()
	}
}

// Pending is the number of timers and tickers waiting to fire.
func (m *Manual) Pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.timers)
}

// Next is how long from now the earliest timer or ticker fires; false
// when none waits.
func (m *Manual) Next() (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.timers) == 0 {
		return 0, false
	}
	m.sortLocked()
	return m.timers[0].at.Sub(m.now), true
}

func (m *Manual) sortLocked() {
	sort.Slice(m.timers, func(i, j int) bool {
		a, b := m.timers[i], m.timers[j]
		if !a.at.Equal(b.at) {
			return a.at.Before(b.at)
		}
		return a.seq < b.seq
	})
}

// nextDue removes and returns the earliest timer due by t, or nil.
func (m *Manual) nextDue(t time.Time) *manualTimer {
	if len(m.timers) == 0 {
		return nil
	}
	m.sortLocked()
	first := m.timers[0]
	if first.at.After(t) {
		return nil
	}
	m.timers = m.timers[1:]
	first.armed = false
	return first
}

func (m *Manual) add(t *manualTimer, d time.Duration) {
	m.seq++
	t.seq, t.at, t.armed = m.seq, m.now.Add(d), true
	if d <= 0 && t.every == 0 {
		// Due already: it fires now, as the runtime's timers do, not
		// at the clock's next move.
		t.armed = false
		t.fire(m)
		return
	}
	m.timers = append(m.timers, t)
}

func (m *Manual) remove(t *manualTimer) bool {
	if !t.armed {
		return false
	}
	for i, x := range m.timers {
		if x == t {
			m.timers = append(m.timers[:i], m.timers[i+1:]...)
			break
		}
	}
	t.armed = false
	return true
}

// NewTimer is a timer on the manual clock.
func (m *Manual) NewTimer(d time.Duration) Timer {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := &manualTimer{m: m, c: make(chan time.Time, 1)}
	m.add(t, d)
	return t
}

// AfterFunc runs f in its own goroutine once the clock passes d from now.
func (m *Manual) AfterFunc(d time.Duration, f func()) Timer {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := &manualTimer{m: m, f: f}
	m.add(t, d)
	return t
}

// NewTicker is a ticker on the manual clock.
func (m *Manual) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t := &manualTimer{m: m, c: make(chan time.Time, 1), every: d}
	m.add(t, d)
	return manualTicker{t}
}

type manualTicker struct{ t *manualTimer }

func (k manualTicker) C() <-chan time.Time { return k.t.c }
func (k manualTicker) Stop()               { k.t.Stop() }

type manualTimer struct {
	m     *Manual
	c     chan time.Time
	f     func()
	every time.Duration // a ticker's interval
	at    time.Time
	seq   uint64
	armed bool
}

// fire runs with m.mu held.
func (t *manualTimer) fire(m *Manual) {
	switch {
	case t.f != nil:
		go t.f()
	default:
		select {
		case t.c <- m.now:
		default: // a tick nobody read is dropped, as the runtime's are
		}
	}
	if t.every > 0 {
		m.add(t, t.every)
	}
}

func (t *manualTimer) C() <-chan time.Time { return t.c }

func (t *manualTimer) Stop() bool {
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	return t.m.remove(t)
}

func (t *manualTimer) Reset(d time.Duration) bool {
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	was := t.m.remove(t)
	t.m.add(t, d)
	return was
}
