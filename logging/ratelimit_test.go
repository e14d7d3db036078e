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

// A summary timer that fires late, after a record of its kind opened the
// next window (a loaded machine), leaves that window alone: the record
// wrote the summary, and the next window still lets only a burst through.
func TestRateLimitLateTimerKeepsTheNextWindow(t *testing.T) {
	var buf bytes.Buffer
	h := NewRateLimit(slog.NewTextHandler(&buf, nil), 5, 300*time.Millisecond)
	now := time.Unix(1000, 0)
	h.state.now = func() time.Time { return now }
	var pending []func()
	h.state.afterFunc = func(_ time.Duration, f func()) { pending = append(pending, f) }
	log := slog.New(h)
	burst := func(n int) {
		for range n {
			log.Warn("Received unknown message type from=127.0.0.1:7946")
		}
	}
	burst(100) // window 1: 5 lines, a summary pending
	now = now.Add(400 * time.Millisecond)
	burst(100) // window 2 opens before window 1's timer fires: its summary, then 5 lines
	if len(pending) != 2 {
		t.Fatalf("%d summaries scheduled, want one per window", len(pending))
	}
	pending[0]() // window 1's timer, late
	burst(100)   // still window 2: all suppressed
	if n := strings.Count(buf.String(), "\n"); n != 11 {
		t.Fatalf("%d lines, want 5 + summary + 5: a late timer reopened the window:\n%s", n, buf.String())
	}
	now = now.Add(400 * time.Millisecond)
	pending[1]()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, "suppressed=195") {
		t.Errorf("window 2's summary %q, want suppressed=195", last)
	}
}
