package logging

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// 5,000 junk packets in a burst: five lines pass, then one summary with
// the count when the window ends; a different warning and every info line
// are not held back.
func TestRateLimitBurstOfIdenticalWarnings(t *testing.T) {
	var buf bytes.Buffer
	h := NewRateLimit(slog.NewTextHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}), 5, 10*time.Second)
	now := time.Unix(1000, 0)
	h.state.now = func() time.Time { return now }
	var pending []func()
	h.state.afterFunc = func(d time.Duration, f func()) {
		if d <= 0 || d > 10*time.Second {
			t.Errorf("summary scheduled in %s", d)
		}
		pending = append(pending, f)
	}
	log := slog.New(h).With("component", "memberlist")
	for i := range 5000 {
		log.Warn("Decrypt packet failed: no installed keys could decrypt the message from=10.0.0." + string(rune('0'+i%10)) + ":7946")
	}
	log.Warn("a different warning")
	log.Info("claimed", "id", "vm-1")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 7 {
		t.Fatalf("%d lines before the window ends, want 5 + 1 other warning + 1 info:\n%s", len(lines), buf.String())
	}
	if len(pending) != 1 {
		t.Fatalf("%d summaries scheduled, want 1", len(pending))
	}
	now = now.Add(10 * time.Second)
	pending[0]()
	lines = strings.Split(strings.TrimSpace(buf.String()), "\n")
	last := lines[len(lines)-1]
	if len(lines) != 8 || !strings.Contains(last, "suppressed=4995") || !strings.Contains(last, "component=memberlist") {
		t.Errorf("summary line %q (of %d lines), want suppressed=4995", last, len(lines))
	}
	// A new window passes again.
	log.Warn("Decrypt packet failed: no installed keys could decrypt the message from=10.0.0.1:7946")
	if n := strings.Count(buf.String(), "\n"); n != 9 {
		t.Errorf("%d lines after the window, want 9", n)
	}
}

// One warning about eight different GPUs is eight kinds: each is logged.
func TestRateLimitKeepsDistinctAttributes(t *testing.T) {
	var buf bytes.Buffer
	h := NewRateLimit(slog.NewTextHandler(&buf, nil), 5, 10*time.Second)
	h.state.afterFunc = func(time.Duration, func()) { t.Error("nothing should be suppressed") }
	log := slog.New(h)
	for i := range 8 {
		log.Error("GPU fenced off", "pci_address", "0000:"+string(rune('a'+i))+"b:00.0")
	}
	if n := strings.Count(buf.String(), "GPU fenced off"); n != 8 {
		t.Errorf("%d lines, want 8:\n%s", n, buf.String())
	}
}
