package ledger

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// WithWriteTime is told of every acknowledged write to the file, once per
// transaction and by operation, and of nothing that wrote nothing: a
// reservation, an idempotent commit, facts already stored.
func TestWriteTimeIsToldOfEveryFileWrite(t *testing.T) {
	var (
		mu  sync.Mutex
		ops []string
	)
	l := newLedger(t, WithWriteTime(func(op string, d time.Duration) {
		if d <= 0 {
			t.Errorf("%s write took %v", op, d)
		}
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
	}))
	told := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(ops)
	}
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 1}), t0)
	if got := told(); len(got) != 0 {
		t.Fatalf("a reservation told %v; it writes no file", got)
	}
	mustCommit(t, l, "vm-1", t0)
	mustCommit(t, l, "vm-1", t0) // committed already: nothing written
	if err := l.Remember(Claim{ID: "vm-0", State: StateCommitted}, t0, time.Hour); err != nil {
		t.Fatal(err)
	}
	addr := server()[0].Address
	for range 2 { // the second is the same blob: not rewritten
		if err := l.PutFacts(addr, []byte(`{"serial":"1"}`)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.ReleaseRemembering("vm-1", t0, time.Hour); err != nil {
		t.Fatal(err)
	}
	want := []string{OpWrite, OpRemember, OpFacts, OpWrite}
	if got := told(); !slices.Equal(got, want) {
		t.Errorf("writes told %v, want %v", got, want)
	}
	if n := l.Syncs(); n != uint64(len(want)) {
		t.Errorf("%d transactions synced, %d told", n, len(want))
	}
}
