package gossipsim

import (
	"reflect"
	"testing"
	"time"
)

func TestConvergesAtFifty(t *testing.T) {
	r := Run(DefaultParams(50), 10, 3*time.Second)
	for i, s := range r.Changes {
		if s.Missed != 0 || s.All < 0 {
			t.Fatalf("change %d: %d members never saw it", i, s.Missed)
		}
		// Ten gossip rounds is far more than log4(50) + a few.
		if s.All > 10*200*time.Millisecond {
			t.Errorf("change %d reached all only after %v", i, s.All)
		}
		if !(s.P50 <= s.P99 && s.P99 <= s.All) {
			t.Errorf("change %d: quantiles out of order: %+v", i, s)
		}
	}
}

func TestSeededReplayIsIdentical(t *testing.T) {
	p := DefaultParams(200)
	p.Loss = 0.01
	p.Background = 2
	a, b := Run(p, 5, time.Second), Run(p, 5, time.Second)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two runs with seed %d differ:\n%+v\n%+v", p.Seed, a, b)
	}
	p.Seed++
	if c := Run(p, 5, time.Second); reflect.DeepEqual(a, c) {
		t.Error("another seed gave the very same run")
	}
}

// The time to reach all grows with log N: from 100 to 10,000 members it
// grows, by less than the ×100 of the size, and not by more than a
// handful of gossip rounds per decade.
func TestReachAllGrowsWithLogN(t *testing.T) {
	var all []time.Duration
	for _, n := range []int{100, 1000, 10000} {
		r := Run(DefaultParams(n), 3, 15*time.Second)
		m := r.Median()
		if m.Missed != 0 {
			t.Fatalf("%d members: %d never saw a change", n, m.Missed)
		}
		all = append(all, m.All)
	}
	for i := 1; i < len(all); i++ {
		if all[i] <= all[i-1] {
			t.Errorf("reach-all did not grow with N: %v", all)
		}
		if all[i]-all[i-1] > 5*200*time.Millisecond {
			t.Errorf("reach-all grew by more than 5 rounds for a decade of N: %v", all)
		}
	}
}

func TestRetransmitLimit(t *testing.T) {
	for n, want := range map[int]int{50: 8, 99: 8, 100: 12, 999: 12, 1000: 16, 10000: 20} {
		if got := DefaultParams(n).RetransmitLimit(); got != want {
			t.Errorf("N=%d: %d retransmits, memberlist gives %d", n, got, want)
		}
	}
}

// Every member that gets a message sends it exactly RetransmitLimit times
// when nothing else is queued: bytes per change are about N × limit ×
// message.
func TestBytesPerChange(t *testing.T) {
	p := DefaultParams(300)
	p.Rebroadcast = nil
	r := Run(p, 1, time.Second)
	// Each copy costs the message and, inside a compound packet or beside
	// a ping, 2 bytes of length.
	lo, hi := int64(p.N*p.RetransmitLimit()*p.MsgBytes), int64(p.N*p.RetransmitLimit()*(p.MsgBytes+2))
	if r.Bytes < lo || r.Bytes > hi {
		t.Errorf("one change sent %d bytes, want N × limit × (message + 0–2) = %d–%d", r.Bytes, lo, hi)
	}
}
