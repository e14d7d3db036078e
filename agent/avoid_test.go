package agent

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/internal/clock"
)

// The backoff of a member whose peer API did not answer: it doubles from
// avoidFirst to avoidMax, allows one try when it has passed, and ends at
// once on an answer or when gossip shows the member restarted or moved.
func TestAvoidanceBackoff(t *testing.T) {
	now := time.Unix(1000, 0)
	boots := map[string]uint64{"dead": 1, "ok": 1}
	v := newAvoidance(clock.WithNow(func() time.Time { return now }), func(n string) uint64 { return boots[n] }, quietLog())
	const addr = "10.0.0.9:7947"
	down := errors.New("no connection")
	if err := v.avoiding("dead", addr); err != nil {
		t.Fatalf("before any failure: %v", err)
	}
	want := avoidFirst
	for range 6 {
		v.failed("dead", addr, down)
		var ae *avoidedError
		if err := v.avoiding("dead", addr); !errors.As(err, &ae) || !errors.Is(ae.err, down) {
			t.Fatalf("right after a failure: %v", err)
		}
		now = now.Add(want - time.Millisecond)
		if v.avoiding("dead", addr) == nil {
			t.Fatalf("tried again before the backoff of %v passed", want)
		}
		now = now.Add(time.Millisecond)
		if err := v.avoiding("dead", addr); err != nil {
			t.Fatalf("not tried again once the backoff of %v passed: %v", want, err)
		}
		want = min(2*want, avoidMax)
	}
	if want != avoidMax {
		t.Fatalf("the backoff grew to %v only", want)
	}

	ranked := []string{"dead", "ok", "other"}
	addrOf := func(string) string { return addr }
	v.failed("dead", addr, down)
	if got := v.last(ranked, addrOf); !slices.Equal(got, []string{"ok", "other", "dead"}) {
		t.Errorf("ranked %v, want the avoided member last", got)
	}
	v.succeeded("dead")
	if v.avoiding("dead", addr) != nil || !slices.Equal(v.last(ranked, addrOf), ranked) {
		t.Error("an answer did not end the backoff")
	}

	v.failed("dead", addr, down)
	if v.avoiding("dead", "10.0.0.10:7947") != nil {
		t.Error("a member advertising another address is still avoided")
	}
	v.failed("dead", addr, down)
	boots["dead"] = 2 // restarted
	if v.avoiding("dead", addr) != nil {
		t.Error("a member that restarted is still avoided")
	}
	v.failed("dead", addr, down)
	if v.avoiding("dead", addr) == nil {
		t.Error("the first failure after a restart does not start a backoff")
	}
}
