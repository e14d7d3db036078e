package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent"
)

// In JSON, a field has one type on every line: a duration is text as in
// the text format, an error its message.
func TestJSONLogFieldTypes(t *testing.T) {
	var buf bytes.Buffer
	cfg := agent.DefaultConfig()
	cfg.LogFormat = "json"
	log := NewLogger(&buf, cfg, slog.LevelInfo)
	log.Info("bound", "took", 1500*time.Millisecond, "err", errors.New("boom"))
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("%s: %v", buf.String(), err)
	}
	if rec["took"] != "1.5s" || rec["err"] != "boom" {
		t.Errorf("took %#v, err %#v; want \"1.5s\" and \"boom\"", rec["took"], rec["err"])
	}
	if _, ok := rec["time"]; !ok {
		t.Error("no time outside the journal")
	}
}
