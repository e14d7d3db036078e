package gossip

import (
	"net"
	"testing"
	"time"
)

// A dead member stays counted as dead after Members forgets it, until it
// comes back.
func TestDeadCountOutlivesTheRememberPeriod(t *testing.T) {
	now := time.Unix(1000, 0)
	v := newView("a", time.Minute)
	v.now = func() time.Time { return now }
	meta, err := Summary{}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	v.alive("b", net.IPv4(127, 0, 0, 1), 7946, meta)
	v.gone("b", meta)
	if n := v.deadCount(); n != 1 {
		t.Fatalf("dead count %d, want 1", n)
	}
	now = now.Add(2 * time.Minute)
	for _, m := range v.list() {
		if m.Name == "b" {
			t.Fatal("b still listed after the remember period")
		}
	}
	if n := v.deadCount(); n != 1 {
		t.Errorf("dead count after b was forgotten: %d, want 1 (it is still dead)", n)
	}
	v.alive("b", net.IPv4(127, 0, 0, 1), 7946, meta)
	if n := v.deadCount(); n != 0 {
		t.Errorf("dead count once b is back: %d, want 0", n)
	}
}
