package ledger

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

func TestRememberAndRecall(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l := openAt(t, path)
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, l, "vm-1", Request{Items: []Item{{Model: h100, Count: 2}}, Labels: map[string]string{"tenant": "x"}}, t0)
	c := mustCommit(t, l, "vm-1", t0)
	if _, err := l.Release("vm-1", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := l.Remember(c, t0.Add(time.Minute), 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := l.Recall("vm-2", t0, 24*time.Hour); ok || err != nil {
		t.Errorf("Recall of an ID never released: %v, %v", ok, err)
	}
	// It survives a restart: the owner's ledger keeps it durably.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openAt(t, path)
	r, ok, err := l.Recall("vm-1", t0.Add(time.Hour), 24*time.Hour)
	if err != nil || !ok || r.ID != "vm-1" || len(r.Items) != 1 || r.Items[0] != (Item{Model: h100, Count: 2}) || r.Labels["tenant"] != "x" || !r.ReleasedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("Recall after reopen = %+v, %v, %v", r, ok, err)
	}
	if _, ok, _ := l.Recall("vm-1", t0.Add(25*time.Hour), 24*time.Hour); ok {
		t.Error("recalled after remember_released")
	}
	all, err := l.RecallAll(t0.Add(time.Hour), 24*time.Hour)
	if err != nil || len(all) != 1 || all[0].ID != "vm-1" {
		t.Errorf("RecallAll = %+v, %v", all, err)
	}
	// The next release forgets what is older than keep.
	c.ID = "vm-3"
	if err := l.Remember(c, t0.Add(48*time.Hour), 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if all, _ := l.RecallAll(t0.Add(48*time.Hour), 1000*time.Hour); len(all) != 1 || all[0].ID != "vm-3" {
		t.Errorf("after an expiring release: %+v, want only vm-3", all)
	}
	// keep 0 remembers nothing and forgets everything.
	if err := l.Remember(c, t0.Add(49*time.Hour), 0); err != nil {
		t.Fatal(err)
	}
	if all, _ := l.RecallAll(t0.Add(49*time.Hour), 1000*time.Hour); len(all) != 0 {
		t.Errorf("keep 0: %+v", all)
	}
}

func TestRememberIsBounded(t *testing.T) {
	defer func(n int) { maxReleased = n }(maxReleased)
	maxReleased = 3
	l := newLedger(t)
	for i := range 5 {
		c := Claim{ID: fmt.Sprintf("vm-%d", i), Items: []Item{{Model: h100, Count: 1}}}
		if err := l.Remember(c, t0.Add(time.Duration(i)*time.Minute), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	all, err := l.RecallAll(t0.Add(5*time.Minute), time.Hour)
	if err != nil || len(all) != 3 || all[0].ID != "vm-2" || all[2].ID != "vm-4" {
		t.Fatalf("RecallAll = %+v, %v; want the newest three", all, err)
	}
}

func TestAdopt(t *testing.T) {
	l := newLedger(t)
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 1}), t0)
	held := mustCommit(t, l, "vm-1", t0).GPUs[0]

	c, err := l.Adopt("adopted-n-vm-b", []string{"0000:9a:00.0", "0000:61:00.0"}, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	if c.State != StateCommitted || len(c.Items) != 2 || c.Items[0] != (Item{Model: h100, Count: 1}) || c.Items[1] != (Item{Model: l40s, Count: 1}) {
		t.Fatalf("adopted claim = %+v", c)
	}
	if got, err := l.Get("adopted-n-vm-b"); err != nil || got.State != StateCommitted {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if _, err := l.Adopt("other", []string{held}, nil, t0); !errors.Is(err, ErrInvalid) {
		t.Errorf("adopting a held GPU: %v, want a validation error", err)
	}
	if _, err := l.Adopt("other", []string{"0000:ee:00.0"}, nil, t0); !errors.Is(err, ErrInvalid) {
		t.Errorf("adopting an unknown GPU: %v", err)
	}
	if _, err := l.Adopt("vm-1", []string{"0000:ab:00.0"}, nil, t0); !errors.Is(err, ErrConflict) {
		t.Errorf("adopting under a live ID: %v, want a conflict", err)
	}
	if _, err := l.Adopt("x", nil, nil, t0); !errors.Is(err, ErrInvalid) {
		t.Errorf("adopting nothing: %v", err)
	}
}

// A release of a committed claim and its memory are one write: one fsync'ed
// transaction, both there after a restart, and an aborted reservation
// remembers nothing.
func TestReleaseRemembersInOneWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l := openAt(t, path)
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 1}), t0)
	mustCommit(t, l, "vm-1", t0)
	mustReserve(t, l, "vm-2", req(Item{Model: h100, Count: 1}), t0.Add(time.Minute))
	before := l.Syncs()
	if _, err := l.ReleaseRemembering("vm-1", t0.Add(time.Minute), time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ReleaseRemembering("vm-2", t0.Add(time.Minute), time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := l.Syncs() - before; n != 1 {
		t.Errorf("a release and its memory took %d fsync'ed writes, want 1 (and none for a reservation)", n)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openAt(t, path)
	if _, err := l.Get("vm-1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("vm-1 after reopen: %v, want released", err)
	}
	if _, ok, err := l.Recall("vm-1", t0.Add(2*time.Minute), time.Hour); !ok || err != nil {
		t.Errorf("vm-1 not remembered after reopen: %v, %v", ok, err)
	}
	if _, ok, _ := l.Recall("vm-2", t0.Add(2*time.Minute), time.Hour); ok {
		t.Error("an aborted reservation was remembered")
	}
}

// Forgetting keeps its bounds across restarts (the index of release times
// is rebuilt from the file), through releases and Remember alike, and a
// record that no longer decodes is forgotten rather than kept forever.
func TestForgettingAcrossRestarts(t *testing.T) {
	defer func(n int) { maxReleased = n }(maxReleased)
	maxReleased = 3
	path := filepath.Join(t.TempDir(), "ledger.db")
	l := openAt(t, path)
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	release := func(id string, at time.Time) {
		t.Helper()
		mustReserve(t, l, id, req(Item{Model: h100, Count: 1}), at)
		mustCommit(t, l, id, at)
		if _, err := l.ReleaseRemembering(id, at, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(at time.Time) []string {
		all, err := l.RecallAll(at, 1000*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range all {
			out = append(out, r.ID)
		}
		return out
	}
	for i := range 3 {
		release(fmt.Sprintf("vm-%d", i), t0.Add(time.Duration(i)*time.Minute))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openAt(t, path)
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	release("vm-3", t0.Add(3*time.Minute))
	if got := fmt.Sprint(ids(t0.Add(3 * time.Minute))); got != "[vm-1 vm-2 vm-3]" {
		t.Errorf("after a fourth release past a restart: %s, want the newest three", got)
	}
	// An hour after vm-1's release, it is forgotten by the next one.
	release("vm-4", t0.Add(time.Hour+90*time.Second))
	if got := fmt.Sprint(ids(t0.Add(time.Hour + 90*time.Second))); got != "[vm-2 vm-3 vm-4]" {
		t.Errorf("after vm-1 aged out: %s", got)
	}
	if err := l.Remember(Claim{ID: "vm-5", Items: []Item{{Model: h100, Count: 1}}}, t0.Add(3*time.Hour), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(ids(t0.Add(3 * time.Hour))); got != "[vm-5]" {
		t.Errorf("three hours on: %s, want vm-5 alone", got)
	}
}
