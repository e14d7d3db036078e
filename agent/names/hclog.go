package names

import (
	"context"
	"io"
	"log"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter hands raft's log lines to the agent's slog logger. raft
// logs routine elections and heartbeat failures at warn and error, which
// are worth keeping; its trace and debug lines go to slog's debug level.
type hclogAdapter struct {
	l    *slog.Logger
	name string
	args []any
}

func newHCLog(l *slog.Logger) hclog.Logger { return &hclogAdapter{l: l} }

func slogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace, hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

// routine are raft's warnings that describe a normal state of an agent:
// a standby server that belongs to no registry yet (docs/names.md).
var routine = map[string]bool{
	"no known peers, aborting election":                   true,
	"not part of stable configuration, aborting election": true,
}

func (h *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	lv := slogLevel(level)
	if routine[msg] {
		lv = slog.LevelDebug
	}
	if !h.l.Enabled(context.Background(), lv) {
		return
	}
	all := append(append([]any(nil), h.args...), args...)
	if h.name != "" {
		all = append(all, "component", h.name)
	}
	h.l.Log(context.Background(), lv, msg, all...)
}

func (h *hclogAdapter) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hclogAdapter) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hclogAdapter) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hclogAdapter) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hclogAdapter) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *hclogAdapter) enabled(level hclog.Level) bool {
	return h.l.Enabled(context.Background(), slogLevel(level))
}

func (h *hclogAdapter) IsTrace() bool { return false }
func (h *hclogAdapter) IsDebug() bool { return h.enabled(hclog.Debug) }
func (h *hclogAdapter) IsInfo() bool  { return h.enabled(hclog.Info) }
func (h *hclogAdapter) IsWarn() bool  { return h.enabled(hclog.Warn) }
func (h *hclogAdapter) IsError() bool { return h.enabled(hclog.Error) }

func (h *hclogAdapter) ImpliedArgs() []any { return h.args }

func (h *hclogAdapter) With(args ...any) hclog.Logger {
	return &hclogAdapter{l: h.l, name: h.name, args: append(append([]any(nil), h.args...), args...)}
}

func (h *hclogAdapter) Name() string { return h.name }

func (h *hclogAdapter) Named(name string) hclog.Logger {
	n := name
	if h.name != "" {
		n = h.name + "." + name
	}
	return &hclogAdapter{l: h.l, name: n, args: h.args}
}

func (h *hclogAdapter) ResetNamed(name string) hclog.Logger {
	return &hclogAdapter{l: h.l, name: name, args: h.args}
}

// SetLevel is ignored: the slog handler decides.
func (h *hclogAdapter) SetLevel(hclog.Level) {}

func (h *hclogAdapter) GetLevel() hclog.Level {
	switch {
	case h.IsDebug():
		return hclog.Debug
	case h.IsInfo():
		return hclog.Info
	case h.IsWarn():
		return hclog.Warn
	}
	return hclog.Error
}

func (h *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

func (h *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return slogWriter{h}
}

type slogWriter struct{ h *hclogAdapter }

func (w slogWriter) Write(p []byte) (int, error) {
	msg := string(p)
	for len(msg) > 0 && msg[len(msg)-1] == '\n' {
		msg = msg[:len(msg)-1]
	}
	w.h.Info(msg)
	return len(p), nil
}
