package ledger

import (
	"errors"
	"slices"
	"testing"
)

func TestResizeInPlace(t *testing.T) {
	l := newLedger(t)
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 2}), t0)
	orig := mustCommit(t, l, "vm-1", t0)

	grown, err := l.Resize("vm-1", req(Item{Model: h100, Count: 4}), t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(grown.GPUs) != 4 || grown.State != StateCommitted {
		t.Fatalf("grown = %+v", grown)
	}
	for _, a := range orig.GPUs {
		if !slices.Contains(grown.GPUs, a) {
			t.Errorf("growing dropped %s, which the VM already had", a)
		}
	}
	shrunk, err := l.Resize("vm-1", req(Item{Model: h100, Count: 1}), t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(shrunk.GPUs) != 1 || !slices.Contains(grown.GPUs, shrunk.GPUs[0]) {
		t.Fatalf("shrunk = %v from %v", shrunk.GPUs, grown.GPUs)
	}
	if got := l.Free(t0)[h100]; got != 7 {
		t.Errorf("after shrinking to 1, %d H100 free, want 7", got)
	}
	changed, err := l.Resize("vm-1", req(Item{Model: l40s, Count: 2}), t0)
	if err != nil {
		t.Fatal(err)
	}
	if l.Free(t0)[h100] != 8 || l.Free(t0)[l40s] != 0 || len(changed.GPUs) != 2 {
		t.Errorf("model change: claim %v, free %v", changed.GPUs, l.Free(t0))
	}
}

func TestResizeThatDoesNotFitChangesNothing(t *testing.T) {
	l := newLedger(t)
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 6}), t0)
	before := mustCommit(t, l, "vm-1", t0)
	mustReserve(t, l, "vm-2", req(Item{Model: h100, Count: 2}), t0)
	mustCommit(t, l, "vm-2", t0)
	rev := l.Revision()

	_, err := l.Resize("vm-1", req(Item{Model: h100, Count: 7}), t0)
	var na *NotAvailableError
	if !errors.As(err, &na) {
		t.Fatalf("Resize beyond the server: %v, want *NotAvailableError", err)
	}
	after, _ := l.Get("vm-1")
	if !slices.Equal(after.GPUs, before.GPUs) || l.Revision() != rev {
		t.Errorf("a refused resize changed the claim: %v → %v (revision %d → %d)", before.GPUs, after.GPUs, rev, l.Revision())
	}
}

func TestResizeOnlyCommittedClaims(t *testing.T) {
	l := newLedger(t)
	if _, err := l.Resize("nope", req(Item{Model: h100, Count: 1}), t0); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown claim: %v", err)
	}
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 1}), t0)
	if _, err := l.Resize("vm-1", req(Item{Model: h100, Count: 2}), t0); !errors.Is(err, ErrConflict) {
		t.Errorf("resize of a reservation: %v, want a conflict", err)
	}
}
