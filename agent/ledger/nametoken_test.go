package ledger

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// The name token a reservation was made under is kept through the commit
// and across a restart; a retry with a newer grant's token moves a live
// reservation to it, an older one is refused as stale, and a committed claim keeps
// the token it was confirmed under.
func TestNameTokenKeptAndMovedByNewerGrant(t *testing.T) {
	path := t.TempDir() + "/ledger.db"
	l := openAt(t, path)
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	r := Request{Items: []Item{{Model: h100, Count: 2}}, NameToken: 7}
	c, err := l.Reserve("vm-1", r, "coord-1", t0, lease)
	if err != nil || c.NameToken != 7 {
		t.Fatalf("Reserve = %+v, %v; want token 7", c, err)
	}
	r.NameToken = 5
	var ce *ConflictError
	if _, err = l.Reserve("vm-1", r, "coord-2", t0, lease); !errors.As(err, &ce) || ce.Stale != 5 || ce.Existing.NameToken != 7 {
		t.Fatalf("Reserve with an older token: %v; want a stale conflict keeping token 7", err)
	}
	r.NameToken = 9
	if c, err = l.Reserve("vm-1", r, "coord-2", t0, lease); err != nil || c.NameToken != 9 {
		t.Fatalf("Reserve with a newer token = %+v, %v; want token 9", c, err)
	}
	if c = mustCommit(t, l, "vm-1", t0.Add(time.Second)); c.NameToken != 9 {
		t.Fatalf("Commit = %+v; want token 9", c)
	}
	r.NameToken = 12
	if c, err = l.Reserve("vm-1", r, "coord-3", t0, lease); err != nil || c.NameToken != 9 {
		t.Fatalf("Reserve over a committed claim = %+v, %v; want token 9 kept", c, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openAt(t, path)
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	if c, err := l.Get("vm-1"); err != nil || c.NameToken != 9 {
		t.Fatalf("after reopen: %+v, %v; want token 9", c, err)
	}
}

func TestSetNameTokenPersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l := openAt(t, path)
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	committed(t, l, "vm-a", req(Item{Model: l40s, Count: 1}))
	mustReserve(t, l, "vm-r", req(Item{Model: h100, Count: 1}), t0)
	if _, err := l.SetNameToken("vm-r", 7); !errors.Is(err, ErrNotFound) {
		t.Fatalf("token on a reservation: %v, want not found", err)
	}
	if _, err := l.SetNameToken("vm-x", 7); !errors.Is(err, ErrNotFound) {
		t.Fatalf("token on an unknown claim: %v, want not found", err)
	}
	rev := l.Revision()
	c, err := l.SetNameToken("vm-a", 42)
	if err != nil || c.NameToken != 42 {
		t.Fatalf("SetNameToken: %+v, %v", c, err)
	}
	if l.Revision() == rev {
		t.Fatal("the token was not written")
	}
	rev = l.Revision()
	if _, err := l.SetNameToken("vm-a", 42); err != nil || l.Revision() != rev {
		t.Fatalf("the same token again: %v, revision %d → %d", err, rev, l.Revision())
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openAt(t, path)
	got, err := l.Get("vm-a")
	if err != nil || got.NameToken != 42 || got.State != StateCommitted || !got.CommittedAt.Equal(t0) {
		t.Fatalf("after reopening: %+v, %v", got, err)
	}
}
