// Package systemd tells the service manager how the agent is doing: ready,
// reloading, stopping, a human status line, and watchdog pings while healthy.
//
// It is a thin seam over go-systemd's daemon package. Outside systemd (no
// NOTIFY_SOCKET: a terminal, a test, a container) every method is a no-op, so
// callers never ask whether they run under systemd.
package systemd

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Notifier sends sd_notify(3) messages to the service manager. The zero
// value and a nil *Notifier are valid no-ops.
type Notifier struct {
	log      *slog.Logger
	enabled  bool
	watchdog time.Duration
	// newTicker is time.NewTicker in production; tests swap it to drive the
	// watchdog loop tick by tick.
	newTicker func(time.Duration) (<-chan time.Time, func())
}

// New reads NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID from the
// environment once. The environment is left as it is: messages are sent
// later, and systemd ignores children anyway (NotifyAccess=main).
func New(log *slog.Logger) *Notifier {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &Notifier{log: log, enabled: os.Getenv("NOTIFY_SOCKET") != ""}
	if !n.enabled {
		return n
	}
	d, err := daemon.SdWatchdogEnabled(false)
	switch {
	case err != nil:
		// A malformed WATCHDOG_USEC is systemd's bug or a hand-made
		// environment; running without pings is safer than refusing to start.
		log.Warn("systemd watchdog disabled: bad environment", "err", err)
	case d > 0:
		n.watchdog = d
	}
	return n
}

// Enabled reports whether the process runs under a service manager that
// listens for notifications.
func (n *Notifier) Enabled() bool { return n != nil && n.enabled }

// Ready tells systemd that start-up (or a reload) finished. The caller sends
// it only once inventory, ledger and gossip are up: with Type=notify,
// `systemctl start` and every unit ordered After= gpuherd wait for it.
func (n *Notifier) Ready() error { return n.send(daemon.SdNotifyReady) }

// Status sets the one-line status that `systemctl status gpuherd` shows.
// Failures are logged, not returned: a status line is never worth stopping
// for.
func (n *Notifier) Status(format string, args ...any) {
	if !n.Enabled() {
		return
	}
	// A newline would start a new assignment in the datagram: an error text
	// holding "\nREADY=1" must not be able to speak for the agent.
	s := strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, fmt.Sprintf(format, args...))
	if err := n.send("STATUS=" + s); err != nil {
		n.log.Warn("systemd: cannot send status", "err", err)
	}
}

// Reloading tells systemd that a reload (SIGHUP) began; send Ready when it is
// done. MONOTONIC_USEC goes with it because systemd 253 and later use it to
// match the reload to the request and complain without it.
func (n *Notifier) Reloading() {
	if !n.Enabled() {
		return
	}
	msg := daemon.SdNotifyReloading
	if ts := strings.TrimSuffix(daemon.SdNotifyMonotonicUsec(), "\n"); ts != "" {
		msg += "\n" + ts
	}
	if err := n.send(msg); err != nil {
		n.log.Warn("systemd: cannot send reloading", "err", err)
	}
}

// Stopping tells systemd that a graceful shutdown began, so `systemctl
// status` shows "deactivating" while the agent leaves the gossip cluster.
func (n *Notifier) Stopping() {
	if err := n.send(daemon.SdNotifyStopping); err != nil {
		n.log.Warn("systemd: cannot send stopping", "err", err)
	}
}

// WatchdogInterval is WatchdogSec= of the unit, and whether systemd expects
// pings from this process at all.
func (n *Notifier) WatchdogInterval() (time.Duration, bool) {
	if !n.Enabled() || n.watchdog <= 0 {
		return 0, false
	}
	return n.watchdog, true
}

// RunWatchdog pings WATCHDOG=1 every half interval for as long as healthy
// returns nil, and returns when ctx ends (at once when systemd asked for no
// watchdog). When healthy fails, or hangs, pings stop and systemd kills and
// restarts the agent after WatchdogSec: a wedged agent must not keep GPUs
// hostage. Missing one or two pings is not fatal, so a check that fails
// once and then recovers within the interval costs nothing.
func (n *Notifier) RunWatchdog(ctx context.Context, healthy func() error) {
	interval, ok := n.WatchdogInterval()
	if !ok {
		return
	}
	// Half the interval, as sd_watchdog_enabled(3) advises: one late ping
	// still lands in time.
	period := interval / 2
	newTicker := n.newTicker
	if newTicker == nil {
		newTicker = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	ticks, stop := newTicker(period)
	defer stop()
	n.log.Debug("systemd watchdog running", "interval", interval, "ping_every", period)

	var failing bool
	ping := func() {
		if err := healthy(); err != nil {
			// Log each tick: the last lines before systemd's kill are the
			// ones an operator reads in the journal.
			n.log.Error("systemd watchdog: not healthy, withholding ping; systemd restarts the agent unless it recovers",
				"err", err, "watchdog_interval", interval)
			failing = true
			return
		}
		if failing {
			n.log.Info("systemd watchdog: healthy again, pinging")
			failing = false
		}
		if err := n.send(daemon.SdNotifyWatchdog); err != nil {
			n.log.Warn("systemd watchdog: cannot ping", "err", err)
		}
	}
	// Ping at once: the agent may have spent a while getting here.
	ping()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
			ping()
		}
	}
}

func (n *Notifier) send(state string) error {
	if !n.Enabled() {
		return nil
	}
	if _, err := daemon.SdNotify(false, state); err != nil {
		return fmt.Errorf("sd_notify %q: %w", firstLine(state), err)
	}
	return nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
