package cli

import (
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/logging"
)

// NewLogger is the logger of the agent and of the kubelet plugin. Under
// systemd, with stderr connected to the journal, records go to the journal
// natively (priorities, one field per attribute, no second timestamp), or
// as lines with sd-daemon(3) priority prefixes when the journal's socket
// cannot be reached; otherwise text or JSON on w. Either way bursts of
// identical warnings are rate-limited with a count.
func NewLogger(w io.Writer, cfg agent.Config, level slog.Leveler) *slog.Logger {
	journal := w == io.Writer(os.Stderr) && logging.StderrIsJournal()
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if journal && a.Key == slog.TimeKey && len(groups) == 0 {
			return slog.Attr{} // the journal stamps every line itself
		}
		return logging.StableValue(a)
	}}
	format := func(w io.Writer) slog.Handler {
		if cfg.LogFormat == "json" {
			return slog.NewJSONHandler(w, opts)
		}
		return slog.NewTextHandler(w, opts)
	}
	h := format(w)
	if journal {
		// Natively; lines with a <N> priority prefix when the journal's
		// socket cannot be reached.
		h = logging.NewJournal(level, logging.NewPrefixed(w, format))
	}
	return slog.New(logging.NewRateLimit(h, logBurst, logWindow))
}

// Identical warnings beyond logBurst per logWindow are counted, not logged.
const (
	logBurst  = 5
	logWindow = 10 * time.Second
)
