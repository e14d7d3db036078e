package ledger

import (
	"errors"
	"testing"
	"time"
)

// A reservation left behind by a placement that lost the claim ID (issue
// 11, point 4) does not make the ID's next claim a conflict: a request
// with a newer name token replaces it; one with an older token is refused
// as stale; without tokens (0) the rules are as before.
func TestReserveNewerTokenReplacesAnOrphanReservation(t *testing.T) {
	tok := func(n uint64, items ...Item) Request { return Request{Items: items, NameToken: n} }
	t.Run("newer replaces a reservation", func(t *testing.T) {
		l := newLedger(t)
		orphan, err := l.Reserve("vm-x", tok(5, Item{Model: l40s, Count: 1}), "coord-b", t0, lease)
		if err != nil {
			t.Fatal(err)
		}
		c, err := l.Reserve("vm-x", tok(7, Item{Model: l40s, Count: 2}), "coord-c", t0.Add(time.Second), lease)
		if err != nil {
			t.Fatalf("reserve under a newer token: %v", err)
		}
		if c.NameToken != 7 || c.Coordinator != "coord-c" || len(c.GPUs) != 2 || !c.CreatedAt.After(orphan.CreatedAt) {
			t.Fatalf("reservation = %+v, want coord-c's under token 7 on both L40S", c)
		}
		if got := mustCommit(t, l, "vm-x", t0.Add(2*time.Second)); got.NameToken != 7 {
			t.Errorf("committed claim carries token %d, want 7", got.NameToken)
		}
	})
	t.Run("older is stale", func(t *testing.T) {
		l := newLedger(t)
		if _, err := l.Reserve("vm-x", tok(7, Item{Model: l40s, Count: 1}), "coord-c", t0, lease); err != nil {
			t.Fatal(err)
		}
		_, err := l.Reserve("vm-x", tok(5, Item{Model: l40s, Count: 1}), "coord-b", t0, lease)
		var ce *ConflictError
		if !errors.As(err, &ce) || ce.Stale != 5 {
			t.Fatalf("reserve under an older token = %v, want a stale *ConflictError", err)
		}
	})
	t.Run("a committed claim is never replaced", func(t *testing.T) {
		l := newLedger(t)
		if _, err := l.Reserve("vm-x", tok(5, Item{Model: l40s, Count: 1}), "coord-b", t0, lease); err != nil {
			t.Fatal(err)
		}
		mustCommit(t, l, "vm-x", t0)
		if _, err := l.Reserve("vm-x", tok(7, Item{Model: l40s, Count: 2}), "coord-c", t0, lease); !errors.Is(err, ErrConflict) {
			t.Fatalf("newer token over a committed claim = %v, want conflict", err)
		}
	})
	t.Run("without tokens as before", func(t *testing.T) {
		l := newLedger(t)
		if _, err := l.Reserve("vm-x", tok(0, Item{Model: l40s, Count: 1}), "coord-b", t0, lease); err != nil {
			t.Fatal(err)
		}
		for _, n := range []uint64{0, 7} {
			if _, err := l.Reserve("vm-x", tok(n, Item{Model: l40s, Count: 2}), "coord-c", t0, lease); !errors.Is(err, ErrConflict) {
				t.Errorf("token %d over a reservation without one = %v, want conflict", n, err)
			}
		}
		if _, err := l.Reserve("vm-x", tok(0, Item{Model: l40s, Count: 1}), "coord-c", t0, lease); err != nil {
			t.Errorf("the same request again: %v", err)
		}
	})
}
