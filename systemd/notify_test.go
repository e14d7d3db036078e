package systemd

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// notifySocket is the service manager's end: a real unixgram socket that
// NOTIFY_SOCKET points at, as systemd sets it up for a Type=notify unit.
type notifySocket struct {
	t    *testing.T
	conn *net.UnixConn
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return &notifySocket{t: t, conn: conn}
}

// next returns the next datagram. The deadline only turns a missing message
// into a failure instead of a hung test; nothing waits for it to pass.
func (s *notifySocket) next() string {
	s.t.Helper()
	if err := s.conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		s.t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := s.conn.Read(buf)
	if err != nil {
		s.t.Fatalf("no notification arrived: %v", err)
	}
	return string(buf[:n])
}

func (s *notifySocket) expect(want string) {
	s.t.Helper()
	if got := s.next(); got != want {
		s.t.Fatalf("notification = %q, want %q", got, want)
	}
}

func setWatchdog(t *testing.T, interval time.Duration, pid int) {
	t.Helper()
	t.Setenv("WATCHDOG_USEC", strconv.FormatInt(interval.Microseconds(), 10))
	t.Setenv("WATCHDOG_PID", strconv.Itoa(pid))
}

func TestMessagesReachTheNotifySocket(t *testing.T) {
	sock := listenNotify(t)
	n := New(nil)
	if !n.Enabled() {
		t.Fatal("Enabled() = false with NOTIFY_SOCKET set")
	}

	if err := n.Ready(); err != nil {
		t.Fatal(err)
	}
	sock.expect("READY=1")

	n.Status("bound %d of %d GPUs", 3, 8)
	sock.expect("STATUS=bound 3 of 8 GPUs")

	n.Stopping()
	sock.expect("STOPPING=1")
}

func TestStatusCannotInjectAssignments(t *testing.T) {
	sock := listenNotify(t)
	n := New(nil)
	n.Status("bind failed: %s", "write error\nREADY=1\r\nWATCHDOG=1")
	sock.expect("STATUS=bind failed: write error READY=1  WATCHDOG=1")
}

func monotonicUsec(t *testing.T) int64 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return ts.Nano() / 1000
}

func TestReloadingCarriesMonotonicTimestamp(t *testing.T) {
	sock := listenNotify(t)
	n := New(nil)

	before := monotonicUsec(t)
	n.Reloading()
	after := monotonicUsec(t)

	lines := strings.Split(sock.next(), "\n")
	if len(lines) != 2 || lines[0] != "RELOADING=1" || !strings.HasPrefix(lines[1], "MONOTONIC_USEC=") {
		t.Fatalf("reloading = %q, want RELOADING=1 and MONOTONIC_USEC=", lines)
	}
	usec, err := strconv.ParseInt(strings.TrimPrefix(lines[1], "MONOTONIC_USEC="), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	// systemd compares it with its own CLOCK_MONOTONIC reading.
	if usec < before || usec > after {
		t.Fatalf("MONOTONIC_USEC=%d not within [%d, %d]", usec, before, after)
	}

	// The reload ends with READY=1, as systemd waits for it.
	if err := n.Ready(); err != nil {
		t.Fatal(err)
	}
	sock.expect("READY=1")
}

func TestNoopWithoutNotifySocket(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	setWatchdog(t, time.Second, os.Getpid())

	for name, n := range map[string]*Notifier{"New": New(nil), "nil": nil, "zero": {}} {
		t.Run(name, func(t *testing.T) {
			if n.Enabled() {
				t.Fatal("Enabled() = true without NOTIFY_SOCKET")
			}
			if err := n.Ready(); err != nil {
				t.Fatalf("Ready() = %v, want nil", err)
			}
			n.Status("x")
			n.Reloading()
			n.Stopping()
			if d, ok := n.WatchdogInterval(); ok {
				t.Fatalf("WatchdogInterval() = %v, true without NOTIFY_SOCKET", d)
			}
			// Returns at once: there is nobody to ping.
			n.RunWatchdog(context.Background(), func() error {
				t.Error("healthy() called without a watchdog")
				return nil
			})
		})
	}
}

func TestReadyReportsAnUnreachableSocket(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "gone.sock"))
	err := New(nil).Ready()
	if err == nil || !strings.Contains(err.Error(), "READY=1") {
		t.Fatalf("Ready() = %v, want an error naming READY=1", err)
	}
}

func TestWatchdogInterval(t *testing.T) {
	for _, tc := range []struct {
		name, usec string
		pid        int
		want       time.Duration
		ok         bool
	}{
		{"ours", "30000000", os.Getpid(), 30 * time.Second, true},
		{"another process's", "30000000", os.Getpid() + 1, 0, false},
		{"unset", "", os.Getpid(), 0, false},
		{"malformed", "soon", os.Getpid(), 0, false},
		{"zero", "0", os.Getpid(), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listenNotify(t)
			t.Setenv("WATCHDOG_USEC", tc.usec)
			t.Setenv("WATCHDOG_PID", strconv.Itoa(tc.pid))
			got, ok := New(nil).WatchdogInterval()
			if got != tc.want || ok != tc.ok {
				t.Fatalf("WatchdogInterval() = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// fakeTicker lets a test decide when the watchdog loop wakes up. Its channel
// is unbuffered, so a tick is handed over only once the previous round
// (health check and ping) is finished.
type fakeTicker struct {
	period  chan time.Duration
	ticks   chan time.Time
	stopped chan struct{}
}

func installFakeTicker(n *Notifier) *fakeTicker {
	f := &fakeTicker{period: make(chan time.Duration, 1), ticks: make(chan time.Time), stopped: make(chan struct{})}
	n.newTicker = func(d time.Duration) (<-chan time.Time, func()) {
		f.period <- d
		return f.ticks, func() { close(f.stopped) }
	}
	return f
}

func TestWatchdogPingsAtHalfTheIntervalWhileHealthy(t *testing.T) {
	sock := listenNotify(t)
	setWatchdog(t, 30*time.Second, os.Getpid())
	n := New(nil)
	ticker := installFakeTicker(n)

	// healthy() takes its answer from the test, unbuffered: the test knows
	// which round is running and that it is blocked inside the check.
	answers := make(chan error)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.RunWatchdog(ctx, func() error { return <-answers })
	}()

	if got := <-ticker.period; got != 15*time.Second {
		t.Fatalf("ping period = %v, want 15s (half of WatchdogSec=30s)", got)
	}
	answers <- nil // round 1 runs at once, before any tick
	sock.expect("WATCHDOG=1")
	ticker.ticks <- time.Now()
	answers <- nil
	sock.expect("WATCHDOG=1")

	ticker.ticks <- time.Now()
	answers <- errors.New("ledger stuck")
	// The next tick is taken only once the failing round is over, and round
	// 4 then waits inside healthy(): a marker sent now is queued after
	// anything the failing round sent, so reading it first proves it sent
	// nothing.
	ticker.ticks <- time.Now()
	n.Status("marker")
	sock.expect("STATUS=marker")
	answers <- nil // recovered: pings resume
	sock.expect("WATCHDOG=1")

	cancel()
	<-done
	select {
	case <-ticker.stopped:
	default:
		t.Fatal("ticker not stopped when RunWatchdog returned")
	}
}

func TestWatchdogWithholdsPingsWhileUnhealthy(t *testing.T) {
	sock := listenNotify(t)
	setWatchdog(t, 30*time.Second, os.Getpid())
	n := New(nil)
	ticker := installFakeTicker(n)

	calls := make(chan struct{}, 8)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.RunWatchdog(ctx, func() error {
			calls <- struct{}{}
			return errors.New("inventory scan hung")
		})
	}()
	<-ticker.period
	ticker.ticks <- time.Now()
	ticker.ticks <- time.Now() // handed over only after round 2 is finished
	if len(calls) < 2 {
		t.Fatalf("healthy() called %d times, want at least 2", len(calls))
	}
	// Whatever the loop sent is already in the queue; a marker sent now must
	// be the first datagram.
	n.Status("marker")
	sock.expect("STATUS=marker")

	cancel()
	<-done
}

// The one test on the real clock: pings really come about every half
// interval. It averages over several pings so that scheduling noise under
// -race does not decide the outcome.
func TestWatchdogRealClock(t *testing.T) {
	sock := listenNotify(t)
	const interval = 300 * time.Millisecond
	setWatchdog(t, interval, os.Getpid())
	n := New(nil)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.RunWatchdog(ctx, func() error { return nil })
	}()

	const pings = 5
	var first, last time.Time
	for i := range pings {
		sock.expect("WATCHDOG=1")
		if i == 0 {
			first = time.Now()
		}
		last = time.Now()
	}
	cancel()
	<-done

	avg := last.Sub(first) / (pings - 1)
	if avg < interval/3 || avg > interval*4/5 {
		t.Fatalf("average ping gap = %v, want about %v (half of %v)", avg, interval/2, interval)
	}
}
