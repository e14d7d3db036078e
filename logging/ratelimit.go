package logging

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// RateLimit passes the first Burst warnings and errors of one kind per
// Window and counts the rest; when the window ends, one more record of that
// kind says how many were suppressed (attribute "suppressed"). Two records
// are of one kind when they have the same level, the same message once
// digits are ignored, and the same attributes: "invalid packet from
// 10.0.0.7:4242" and "from 10.0.0.9:5151" count together, while "GPU fenced
// off" for two PCI addresses are two kinds, each logged. Info and debug
// records always pass: they are the agent's own account of what it did.
type RateLimit struct {
	next  slog.Handler
	state *limitState
}

type limitState struct {
	burst  int
	window time.Duration
	now    func() time.Time
	// afterFunc schedules the end-of-window summary; tests replace it.
	afterFunc func(time.Duration, func())

	mu    sync.Mutex
	kinds map[string]*kind
}

type kind struct {
	start      time.Time
	passed     int
	suppressed int
	rec        slog.Record // the first suppressed one, for the summary
	next       slog.Handler
}

// maxKinds bounds the state: past it, new kinds pass unlimited.
const maxKinds = 1024

// NewRateLimit wraps next: burst records of a kind per window pass.
func NewRateLimit(next slog.Handler, burst int, window time.Duration) *RateLimit {
	return &RateLimit{next: next, state: &limitState{
		burst: burst, window: window, now: time.Now,
		afterFunc: func(d time.Duration, f func()) { time.AfterFunc(d, f) },
		kinds:     map[string]*kind{},
	}}
}

// Enabled implements slog.Handler.
func (h *RateLimit) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// WithAttrs implements slog.Handler; the clone shares the limits.
func (h *RateLimit) WithAttrs(as []slog.Attr) slog.Handler {
	return &RateLimit{next: h.next.WithAttrs(as), state: h.state}
}

// WithGroup implements slog.Handler; the clone shares the limits.
func (h *RateLimit) WithGroup(name string) slog.Handler {
	return &RateLimit{next: h.next.WithGroup(name), state: h.state}
}

// Handle implements slog.Handler.
func (h *RateLimit) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.next.Handle(ctx, r)
	}
	var key strings.Builder
	key.WriteString(r.Level.String())
	key.WriteByte(0)
	key.WriteString(shape(r.Message))
	r.Attrs(func(a slog.Attr) bool {
		key.WriteByte(0)
		key.WriteString(a.String())
		return true
	})
	return h.handle(ctx, r, key.String())
}

func (h *RateLimit) handle(ctx context.Context, r slog.Record, key string) error {
	s := h.state
	now := s.now()
	s.mu.Lock()
	k, ok := s.kinds[key]
	if !ok {
		if len(s.kinds) >= maxKinds {
			s.mu.Unlock()
			return h.next.Handle(ctx, r)
		}
		k = &kind{start: now}
		s.kinds[key] = k
	}
	if now.Sub(k.start) >= s.window {
		// The window of a kind whose summary is still pending ended:
		// the summary goes first, then this record opens a new window.
		summary, next, pending := k.summary()
		k.start, k.passed = now, 0
		if pending {
			s.mu.Unlock()
			_ = next.Handle(ctx, summary)
			s.mu.Lock()
		}
	}
	if k.passed < s.burst {
		k.passed++
		s.mu.Unlock()
		return h.next.Handle(ctx, r)
	}
	k.suppressed++
	if k.suppressed == 1 {
		k.rec, k.next = r.Clone(), h.next
		start := k.start
		s.afterFunc(s.window-now.Sub(start), func() { s.flush(key, start) })
	}
	s.mu.Unlock()
	return nil
}

// summary takes the pending count of k, if any, as a record.
func (k *kind) summary() (slog.Record, slog.Handler, bool) {
	if k.suppressed == 0 {
		return slog.Record{}, nil, false
	}
	r := k.rec.Clone()
	r.Message += " (repeated; count in suppressed)"
	r.AddAttrs(slog.Int("suppressed", k.suppressed))
	n := k.next
	k.suppressed, k.rec, k.next = 0, slog.Record{}, nil
	return r, n, true
}

// flush writes the summary of a kind whose window, opened at start, ended,
// and forgets the kind. A timer late enough that a record of the kind
// opened a new window meanwhile (a loaded machine) finds that window and
// leaves it: the record that opened it wrote the old window's summary,
// and forgetting the new one would let a whole burst more through.
func (s *limitState) flush(key string, start time.Time) {
	s.mu.Lock()
	k, ok := s.kinds[key]
	if !ok || !k.start.Equal(start) {
		s.mu.Unlock()
		return
	}
	r, next, pending := k.summary()
	delete(s.kinds, key)
	s.mu.Unlock()
	if pending {
		_ = next.Handle(context.Background(), r)
	}
}

// shape is a message with its digits dropped: addresses, ports and counts
// vary between records of one kind.
func shape(msg string) string {
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return -1
		}
		return r
	}, msg)
}
