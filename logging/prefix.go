package logging

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
)

// Prefixed writes each record through a text or JSON handler as one line
// that starts with its syslog priority, "<3>" for an error, as sd-daemon(3)
// describes for a service whose stderr is the journal: the journal reads
// the priority off the line. It is what Journal falls back to when the
// journal's own socket cannot be reached.
type Prefixed struct {
	out   *lockedWriter
	inner func(io.Writer) slog.Handler
	// derive re-applies WithAttrs and WithGroup calls to a fresh inner
	// handler, in order.
	derive []func(slog.Handler) slog.Handler
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// NewPrefixed writes to w; newHandler builds the formatting handler over a
// buffer (slog.NewTextHandler with the agent's options, say).
func NewPrefixed(w io.Writer, newHandler func(io.Writer) slog.Handler) *Prefixed {
	return &Prefixed{out: &lockedWriter{w: w}, inner: newHandler}
}

func (h *Prefixed) handler(w io.Writer) slog.Handler {
	x := h.inner(w)
	for _, d := range h.derive {
		x = d(x)
	}
	return x
}

// Enabled implements slog.Handler.
func (h *Prefixed) Enabled(ctx context.Context, l slog.Level) bool {
	return h.handler(io.Discard).Enabled(ctx, l)
}

// WithAttrs implements slog.Handler.
func (h *Prefixed) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.derive = append(h.derive[:len(h.derive):len(h.derive)], func(x slog.Handler) slog.Handler { return x.WithAttrs(as) })
	return &c
}

// WithGroup implements slog.Handler.
func (h *Prefixed) WithGroup(name string) slog.Handler {
	c := *h
	c.derive = append(h.derive[:len(h.derive):len(h.derive)], func(x slog.Handler) slog.Handler { return x.WithGroup(name) })
	return &c
}

// Handle implements slog.Handler.
func (h *Prefixed) Handle(ctx context.Context, r slog.Record) error {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "<%d>", Priority(r.Level))
	if err := h.handler(&buf).Handle(ctx, r); err != nil {
		return err
	}
	h.out.mu.Lock()
	defer h.out.mu.Unlock()
	_, err := h.out.w.Write(buf.Bytes())
	return err
}
