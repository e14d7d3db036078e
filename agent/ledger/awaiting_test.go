package ledger

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// reopen abandons l as kill -9 would and opens its file again, on the
// same inventory.
func reopen(t *testing.T, l *Ledger) *Ledger {
	t.Helper()
	if err := l.Abandon(); err != nil {
		t.Fatal(err)
	}
	l = openAt(t, l.Path())
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	return l
}

// powerCut runs write, which must sync nothing, on l and leaves l's
// files as a power cut right after it would: the journal as it was at its
// last fdatasync, before write. It returns the ledger opened again on
// them, on the same inventory.
func powerCut(t *testing.T, l *Ledger, write func()) *Ledger {
	t.Helper()
	jpath := JournalPath(l.Path())
	synced, err := os.ReadFile(jpath)
	if err != nil {
		t.Fatal(err)
	}
	write()
	if err := l.Abandon(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(jpath, synced, 0o600); err != nil {
		t.Fatal(err)
	}
	l = openAt(t, l.Path())
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	return l
}

// A commit written ahead of its name holds its GPUs as a commit (no lease,
// durable) without being a claim, until its token settles it: the settling
// record costs no fdatasync, and a process killed after it keeps it.
func TestCommitAwaitingNameThenSettled(t *testing.T) {
	l := newLedger(t)
	committed(t, l, "vm-0", req(Item{Model: l40s, Count: 1})) // the file marked journalled: two fdatasyncs once
	r := mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 8}), t0)
	syncs := l.Fdatasyncs()
	c, err := l.CommitAwaitingName("vm-1", r.CreatedAt, t0.Add(time.Second))
	if err != nil || c.State != StateCommitted || !c.AwaitingName || c.NameToken != 0 || c.Named() {
		t.Fatalf("CommitAwaitingName = %+v, %v; want committed, awaiting its name", c, err)
	}
	if !c.ExpiresAt.Equal(r.ExpiresAt) {
		t.Fatalf("awaiting its name, the claim expires at %s; want its reservation's deadline %s, by which its owner decides it", c.ExpiresAt, r.ExpiresAt)
	}
	if got := l.Fdatasyncs() - syncs; got != 1 {
		t.Fatalf("the commit ahead of its name cost %d fdatasyncs, want 1", got)
	}
	// Past its old lease it still holds every H100.
	late := t0.Add(10 * lease)
	if expired, err := l.Expire(late); err != nil || len(expired) != 0 {
		t.Fatalf("Expire = %v, %v; want nothing expired", expired, err)
	}
	var na *NotAvailableError
	if _, err := l.Reserve("vm-2", req(Item{Model: h100, Count: 1}), "", late, lease); !errors.As(err, &na) {
		t.Fatalf("Reserve of its GPUs = %v; want not available", err)
	}
	if got := l.Awaiting(); len(got) != 1 || got[0].ID != "vm-1" {
		t.Fatalf("Awaiting = %+v; want vm-1", got)
	}

	if _, err := l.SettleName("vm-1", r.CreatedAt.Add(time.Nanosecond), 7); !errors.Is(err, ErrNotFound) {
		t.Fatalf("SettleName of another reservation's commit = %v; want not found", err)
	}
	var ve *ValidationError
	if _, err := l.SettleName("vm-1", r.CreatedAt, 0); !errors.As(err, &ve) {
		t.Fatalf("SettleName with token 0 = %v; want a validation error", err)
	}
	syncs = l.Fdatasyncs()
	c, err = l.SettleName("vm-1", r.CreatedAt, 7)
	if err != nil || !c.Named() || c.NameToken != 7 || c.AwaitingName {
		t.Fatalf("SettleName = %+v, %v; want a claim under token 7", c, err)
	}
	if !c.ExpiresAt.IsZero() {
		t.Fatalf("settled, the claim still expires at %s; a claim has no deadline", c.ExpiresAt)
	}
	if got := l.Fdatasyncs() - syncs; got != 0 {
		t.Fatalf("settling cost %d fdatasyncs, want 0", got)
	}
	if _, err := l.SettleName("vm-1", r.CreatedAt, 7); !errors.Is(err, ErrNotFound) {
		t.Fatalf("SettleName of a settled claim = %v; want not found", err)
	}
	if _, err := l.UnwindAwaiting("vm-1", r.CreatedAt, time.Time{}, late); !errors.Is(err, ErrNotFound) {
		t.Fatalf("UnwindAwaiting of a settled claim = %v; want not found", err)
	}

	l = reopen(t, l)
	if c, err := l.Get("vm-1"); err != nil || !c.Named() || c.NameToken != 7 {
		t.Fatalf("after kill -9: %+v, %v; want the claim under token 7", c, err)
	}
	if len(l.Awaiting()) != 0 {
		t.Fatalf("Awaiting after reopen = %+v; want none", l.Awaiting())
	}
}

// The settling record is written without an fdatasync: a crash that loses
// it (a power cut before any later write was synced) leaves the commit
// awaiting its name, as written, never a claim without its GPUs nor a
// torn journal.
func TestSettleLostToPowerCutLeavesTheCommitAwaiting(t *testing.T) {
	l := newLedger(t)
	r := mustReserve(t, l, "vm-1", req(Item{Model: l40s, Count: 2}), t0)
	if _, err := l.CommitAwaitingName("vm-1", r.CreatedAt, t0); err != nil {
		t.Fatal(err)
	}
	l = powerCut(t, l, func() {
		if _, err := l.SettleName("vm-1", r.CreatedAt, 9); err != nil {
			t.Fatal(err)
		}
	})
	c, err := l.Get("vm-1")
	if err != nil || c.State != StateCommitted || !c.AwaitingName || c.NameToken != 0 || len(c.GPUs) != 2 {
		t.Fatalf("after the power cut: %+v, %v; want the commit awaiting its name on 2 GPUs", c, err)
	}
	// What the owner does once the registry says the name is held here.
	if c, err = l.SetNameToken("vm-1", 9); err != nil || !c.Named() || c.NameToken != 9 || !c.ExpiresAt.IsZero() {
		t.Fatalf("SetNameToken = %+v, %v; want the claim under token 9", c, err)
	}
	l = reopen(t, l)
	if c, err := l.Get("vm-1"); err != nil || !c.Named() || c.NameToken != 9 {
		t.Fatalf("after reopen: %+v, %v; want the claim under token 9", c, err)
	}
}

// A commit whose name the registry did not hold is taken back, durably:
// to the reservation it was while its lease runs (the coordinator may
// commit again), removed once it has run out.
func TestUnwindAwaiting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l := openAt(t, path)
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	a := mustReserve(t, l, "vm-a", req(Item{Model: h100, Count: 4}), t0)
	b := mustReserve(t, l, "vm-b", req(Item{Model: l40s, Count: 1}), t0)
	for _, c := range []Claim{a, b} {
		if _, err := l.CommitAwaitingName(c.ID, c.CreatedAt, t0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.UnwindAwaiting("vm-a", t0.Add(-time.Second), a.ExpiresAt, t0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("UnwindAwaiting of another reservation's commit = %v; want not found", err)
	}
	was, err := l.UnwindAwaiting("vm-a", a.CreatedAt, a.ExpiresAt, t0.Add(time.Second))
	if err != nil || !was.AwaitingName {
		t.Fatalf("UnwindAwaiting(vm-a) = %+v, %v", was, err)
	}
	if c, err := l.Get("vm-a"); err != nil || c.State != StateReserved || !c.ExpiresAt.Equal(a.ExpiresAt) || c.AwaitingName || len(c.GPUs) != 4 {
		t.Fatalf("vm-a after unwinding in its lease: %+v, %v; want its reservation back", c, err)
	}
	if _, err := l.UnwindAwaiting("vm-b", b.CreatedAt, b.ExpiresAt, b.ExpiresAt); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Get("vm-b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("vm-b after unwinding past its lease: %v; want not found", err)
	}
	if free := l.Free(b.ExpiresAt)[l40s]; free != 2 {
		t.Fatalf("free L40S = %d; want 2", free)
	}
	// The reservation is memory only, as every reservation: neither is in
	// the file any more.
	l = reopen(t, l)
	for _, id := range []string{"vm-a", "vm-b"} {
		if c, err := l.Get(id); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%s after reopen: %+v, %v; want not found", id, c, err)
		}
	}
}
