package clock

import (
	"sync"
	"testing"
	"time"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestManualFiresTimersInTimeOrder(t *testing.T) {
	m := NewManual(epoch)
	late, early := m.NewTimer(2*time.Second), m.NewTimer(time.Second)
	stopped := m.NewTimer(time.Second)
	if !stopped.Stop() {
		t.Fatal("Stop of an armed timer: false")
	}
	m.Advance(999 * time.Millisecond)
	select {
	case <-early.C():
		t.Fatal("a timer fired before its time")
	default:
	}
	m.Advance(time.Millisecond)
	if got := <-early.C(); !got.Equal(epoch.Add(time.Second)) {
		t.Fatalf("early fired at %v", got)
	}
	select {
	case <-late.C():
		t.Fatal("late fired with early")
	case <-stopped.C():
		t.Fatal("a stopped timer fired")
	default:
	}
	m.Advance(time.Hour)
	if got := <-late.C(); !got.Equal(epoch.Add(2 * time.Second)) {
		t.Fatalf("late fired at %v, want its own time", got)
	}
	if !m.Now().Equal(epoch.Add(time.Hour + time.Second)) {
		t.Fatalf("now %v", m.Now())
	}
	if m.Pending() != 0 {
		t.Fatalf("%d timers left", m.Pending())
	}
}

func TestManualTickerAndReset(t *testing.T) {
	m := NewManual(epoch)
	tk := m.NewTicker(time.Second)
	defer tk.Stop()
	m.Advance(time.Second)
	<-tk.C()
	m.Advance(3 * time.Second) // three ticks, one buffered
	<-tk.C()
	select {
	case <-tk.C():
		t.Fatal("a ticker kept more than one unread tick")
	default:
	}
	tm := m.NewTimer(time.Second)
	m.Advance(900 * time.Millisecond)
	if !tm.Reset(time.Second) {
		t.Fatal("Reset of an armed timer: false")
	}
	m.Advance(900 * time.Millisecond)
	select {
	case <-tm.C():
		t.Fatal("Reset did not move the timer")
	default:
	}
	m.Advance(100 * time.Millisecond)
	<-tm.C()
}

func TestManualAfterFuncAndDeadline(t *testing.T) {
	m := NewManual(epoch)
	ran := make(chan struct{})
	m.AfterFunc(time.Minute, func() { close(ran) })
	d := NewDeadline(m, 10*time.Second)
	defer d.Stop()
	if d.Passed() {
		t.Fatal("deadline passed at once")
	}
	m.Advance(10 * time.Second)
	if !d.Passed() {
		t.Fatal("deadline not passed")
	}
	if !d.Passed() {
		t.Fatal("deadline forgotten after one read")
	}
	m.Advance(time.Minute)
	<-ran
}

// A clock whose Now is frozen still reaches a deadline: it is read by a
// timer, not by comparing Now.
func TestDeadlineOnAFrozenNow(t *testing.T) {
	c := WithNow(func() time.Time { return epoch })
	d := NewDeadline(c, time.Millisecond)
	defer d.Stop()
	<-After(c, 5*time.Millisecond)
	if !d.Passed() {
		t.Fatal("deadline on a frozen Now never passed")
	}
	if Since(c, epoch) != 0 {
		t.Fatal("Since on a frozen clock moved")
	}
}

func TestMonotonicStartsAtTheWallReading(t *testing.T) {
	c := Monotonic(func() time.Time { return epoch })
	if got := c.Now(); got.Before(epoch) || got.Sub(epoch) > time.Minute {
		t.Fatalf("monotonic clock at %v, want just after %v", got, epoch)
	}
}

// A step of the wall clock while the agent runs neither stretches nor cuts
// a lease: the clock read the wall once.
func TestMonotonicIgnoresWallStepsWhileRunning(t *testing.T) {
	var (
		mu   sync.Mutex
		wall = epoch
	)
	c := Monotonic(func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return wall
	})
	t0 := c.Now()
	mu.Lock()
	wall = wall.Add(-time.Hour) // the wall clock steps back an hour
	mu.Unlock()
	t1 := c.Now()
	if t1.Before(t0) || t1.Sub(t0) > time.Minute {
		t.Fatalf("clock went from %v to %v after a wall step of -1h; want it to keep running", t0, t1)
	}
}

// A timer made, or reset, with no time left fires at once, as the
// runtime's do: a caller that arms a deadline already passed (the clock
// was moved meanwhile) is not left waiting for the clock's next move.
func TestManualTimerWithNoTimeLeftFiresAtOnce(t *testing.T) {
	m := NewManual(time.Unix(0, 0))
	tm := m.NewTimer(0)
	select {
	case <-tm.C():
	default:
		t.Fatal("a timer of 0 did not fire at once")
	}
	ran := make(chan struct{})
	m.AfterFunc(-time.Second, func() { close(ran) })
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("a function due a second ago did not run without a move of the clock")
	}
	late := m.NewTimer(time.Hour)
	late.Reset(0)
	select {
	case <-late.C():
	default:
		t.Fatal("a timer reset to 0 did not fire at once")
	}
	if n := m.Pending(); n != 0 {
		t.Fatalf("%d timers still pending; want none", n)
	}
}
