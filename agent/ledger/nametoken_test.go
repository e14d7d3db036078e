package ledger

import (
	"errors"
	"path/filepath"
	"testing"
)

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
