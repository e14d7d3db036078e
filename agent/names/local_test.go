package names

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// A local registry answers as a raft one does: holds, conflicts, releases
// and reads through the same state machine, and concurrent calls apply one
// at a time.
func TestLocalRegistry(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	r := NewLocal(func() time.Time { return now }, 30*time.Second)
	defer r.Close()
	ctx := context.Background()
	key := Claim("vm-1")
	rec, err := r.Hold(ctx, key, "a", "b", "req-1", false)
	if err != nil || rec.State != StateHeld || rec.Owner != "b" {
		t.Fatalf("hold: %+v, %v", rec, err)
	}
	if _, err := r.Hold(ctx, key, "a", "c", "req-2", false); !errors.Is(err, ErrConflict) {
		t.Fatalf("hold of a held name under another request: %v, want a conflict", err)
	}
	if got, err := r.Lookup(ctx, key, Linearizable); err != nil || got.Token != rec.Token {
		t.Fatalf("lookup: %+v, %v", got, err)
	}
	if _, err := r.Release(ctx, key, rec.Token, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Lookup(ctx, key, Stale); !errors.Is(err, ErrNotFound) {
		t.Fatalf("lookup after the release: %v, want not found", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := r.Hold(cctx, key, "a", "b", "req-1", false); !IsUnavailable(err) {
		t.Fatalf("hold with an ended context: %v, want unavailable", err)
	}

	var wg sync.WaitGroup
	won := make(chan string, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := string(rune('a' + i))
			if _, err := r.Hold(ctx, Claim("vm-race"), "a", owner, "req-"+owner, false); err == nil {
				won <- owner
			}
		}()
	}
	wg.Wait()
	close(won)
	if n := len(won); n != 1 {
		t.Fatalf("%d holders of one name, want 1", n)
	}
}
