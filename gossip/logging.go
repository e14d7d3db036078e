package gossip

import (
	"bytes"
	"context"
	"log"
	"log/slog"
	"strings"
)

// memberlistLogger turns memberlist's standard-library log lines
// ("[LEVEL] memberlist: text") into structured slog records. memberlist is
// chatty about transient trouble, so its ERR and WARN lines become warnings
// and everything else debug.
//
// It also watches for the one line that reveals suspicion: memberlist v0.7.0
// never fills Node.State (its nodeState shadows that field) and has no event
// for "suspect", so the prober's own "Suspect X has failed, no acks received"
// is the only signal this agent gets. TestSuspectThenDead pins that text.
type memberlistLogger struct {
	log       *slog.Logger
	onSuspect func(name string)
}

func newMemberlistLogger(l *slog.Logger, onSuspect func(string)) *log.Logger {
	return log.New(&memberlistLogger{log: l, onSuspect: onSuspect}, "", 0)
}

const (
	suspectPrefix = "Suspect "
	suspectSuffix = " has failed, no acks received"
)

// Write receives exactly one log line per call (log.Logger guarantees it).
func (w *memberlistLogger) Write(p []byte) (int, error) {
	line := string(bytes.TrimRight(p, "\n"))
	level := slog.LevelDebug
	if rest, ok := strings.CutPrefix(line, "["); ok {
		if tag, msg, ok := strings.Cut(rest, "] "); ok {
			switch tag {
			case "ERR", "ERROR", "WARN":
				level = slog.LevelWarn
			}
			line = msg
		}
	}
	line = strings.TrimPrefix(line, "memberlist: ")
	if name, ok := strings.CutPrefix(line, suspectPrefix); ok {
		if name, ok := strings.CutSuffix(name, suspectSuffix); ok {
			w.onSuspect(name)
		}
	}
	w.log.Log(context.Background(), level, line, "component", "memberlist")
	return len(p), nil
}
