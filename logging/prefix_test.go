package logging

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"testing"
)

func TestPrefixedLinesCarryTheirPriority(t *testing.T) {
	var out bytes.Buffer
	h := NewPrefixed(&out, func(w io.Writer) slog.Handler {
		return slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}})
	})
	log := slog.New(h).With("component", "vfio").WithGroup("g")
	log.Error("bind failed", "x", 1)
	log.Warn("slow")
	log.Info("ok")
	log.Debug("detail")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{
		`<3>level=ERROR msg="bind failed" component=vfio g.x=1`,
		`<4>level=WARN msg=slow component=vfio`,
		`<6>level=INFO msg=ok component=vfio`,
		`<7>level=DEBUG msg=detail component=vfio`,
	}
	if len(lines) != len(want) {
		t.Fatalf("lines %q", lines)
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d: %q, want %q", i, lines[i], want[i])
		}
	}
}
