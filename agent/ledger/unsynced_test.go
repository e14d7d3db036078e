package ledger

import (
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A release written ahead of its fdatasync is a release at once: the claim
// is gone and its GPUs free for every reader and writer, remembered as
// released, and the write costs no fdatasync until Durable, which costs
// one; a process killed before Durable keeps it.
func TestReleaseUnsyncedThenDurable(t *testing.T) {
	l := newLedger(t)
	committed(t, l, "vm-0", req(Item{Model: l40s, Count: 1})) // the file marked journalled: two fdatasyncs once
	c := committed(t, l, "vm-1", req(Item{Model: h100, Count: 8}))
	syncs := l.Fdatasyncs()
	rel, u, err := l.ReleaseUnsynced("vm-1", t0.Add(time.Minute), time.Hour)
	if err != nil || rel.ID != "vm-1" || len(rel.GPUs) != 8 {
		t.Fatalf("ReleaseUnsynced = %+v, %v; want vm-1's 8 GPUs released", rel, err)
	}
	if got := l.Fdatasyncs() - syncs; got != 0 {
		t.Fatalf("the release written ahead cost %d fdatasyncs before Durable; want 0", got)
	}
	if _, err := l.Get("vm-1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after the release = %v; want not found", err)
	}
	if _, ok, err := l.Recall("vm-1", t0.Add(time.Minute), time.Hour); err != nil || !ok {
		t.Fatalf("Recall after the release = %v, %v; want it remembered", ok, err)
	}
	// Its GPUs are free at once: a new claim takes them, and its commit's
	// fdatasync makes the release durable before it.
	r := mustReserve(t, l, "vm-2", req(Item{Model: h100, Count: 8}), t0.Add(time.Minute))
	if !sameGPUs(r.GPUs, c.GPUs) {
		t.Fatalf("the new reservation took %v; want the released %v", r.GPUs, c.GPUs)
	}
	if err := u.Durable(); err != nil {
		t.Fatal(err)
	}
	if got := l.Fdatasyncs() - syncs; got != 1 {
		t.Fatalf("Durable cost %d fdatasyncs; want 1", got)
	}
	if err := u.Durable(); err != nil || l.Fdatasyncs()-syncs != 1 {
		t.Fatalf("Durable again = %v, %d fdatasyncs in all; want nothing more", err, l.Fdatasyncs()-syncs)
	}
	l = reopen(t, l)
	if _, err := l.Get("vm-1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after reopen = %v; want not found", err)
	}

	// Killed before Durable: the page cache keeps the record.
	committed(t, l, "vm-3", req(Item{Model: l40s, Count: 1}))
	if _, _, err := l.ReleaseUnsynced("vm-3", t0.Add(time.Minute), time.Hour); err != nil {
		t.Fatal(err)
	}
	l = reopen(t, l)
	if _, err := l.Get("vm-3"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a release killed before Durable, after reopen = %v; want not found", err)
	}
}

func sameGPUs(a, b []string) bool {
	return strings.Join(a, ",") == strings.Join(b, ",")
}

// A later write's fdatasync, or a checkpoint, makes a release written
// ahead durable: Durable then costs nothing.
func TestReleaseUnsyncedMadeDurableByLaterWrites(t *testing.T) {
	l := newLedger(t)
	committed(t, l, "vm-0", req(Item{Model: l40s, Count: 1}))
	committed(t, l, "vm-1", req(Item{Model: h100, Count: 2}))
	_, u, err := l.ReleaseUnsynced("vm-1", t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	committed(t, l, "vm-2", req(Item{Model: h100, Count: 2})) // synced: covers the release
	syncs := l.Fdatasyncs()
	if err := u.Durable(); err != nil || l.Fdatasyncs() != syncs {
		t.Fatalf("Durable after a synced write = %v, %d more fdatasyncs; want none", err, l.Fdatasyncs()-syncs)
	}

	committed(t, l, "vm-3", req(Item{Model: h100, Count: 1}))
	_, u, err = l.ReleaseUnsynced("vm-3", t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	l.fileMu.Lock()
	err = l.checkpoint(false)
	l.fileMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	syncs = l.Fdatasyncs()
	if err := u.Durable(); err != nil || l.Fdatasyncs() != syncs {
		t.Fatalf("Durable after a checkpoint = %v, %d more fdatasyncs; want none", err, l.Fdatasyncs()-syncs)
	}
	l = reopen(t, l)
	for id, want := range map[string]bool{"vm-0": true, "vm-1": false, "vm-2": true, "vm-3": false} {
		if _, err := l.Get(id); (err == nil) != want {
			t.Errorf("after reopen, Get(%s) = %v; want held %v", id, err, want)
		}
	}
}

// A reservation's release touches no file: nothing to make durable.
func TestReleaseUnsyncedOfAReservation(t *testing.T) {
	l := newLedger(t)
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 2}), t0)
	syncs := l.Fdatasyncs()
	c, u, err := l.ReleaseUnsynced("vm-1", t0, time.Hour)
	if err != nil || c.State != StateReserved || u != (Unsynced{}) {
		t.Fatalf("ReleaseUnsynced of a reservation = %+v, %+v, %v; want it released, nothing to sync", c, u, err)
	}
	if err := u.Durable(); err != nil || l.Fdatasyncs() != syncs {
		t.Fatalf("Durable = %v, %d fdatasyncs; want none", err, l.Fdatasyncs()-syncs)
	}
	if _, _, err := l.ReleaseUnsynced("vm-1", t0, time.Hour); !errors.Is(err, ErrNotFound) {
		t.Fatalf("ReleaseUnsynced of an unknown claim = %v; want not found", err)
	}
}

// A power cut before the release's fdatasync loses the release whole: the
// claim is back as it was committed, on its GPUs and under its name token
// (a leftover once its name is gone, which the owner's anti-entropy pass
// releases), never a torn journal nor GPUs held twice.
func TestReleaseUnsyncedLostToPowerCut(t *testing.T) {
	l := newLedger(t)
	r := req(Item{Model: l40s, Count: 2})
	r.NameToken = 41
	mustReserve(t, l, "vm-1", r, t0)
	c := mustCommit(t, l, "vm-1", t0)
	l = powerCut(t, l, func() {
		if _, _, err := l.ReleaseUnsynced("vm-1", t0, time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	got, err := l.Get("vm-1")
	if err != nil || got.State != StateCommitted || !sameGPUs(got.GPUs, c.GPUs) || got.NameToken != 41 {
		t.Fatalf("after the power cut: %+v, %v; want the claim committed on %v under token 41", got, err, c.GPUs)
	}
}

// An fdatasync that fails leaves the write unacknowledged and the journal
// closed to writes, with an error that names the ledger and says what to
// do; the store reports the failure.
func TestReleaseUnsyncedWhoseSyncFails(t *testing.T) {
	var fail bool
	var reported error
	l := newLedger(t,
		WithDatasync(func(f *os.File) error {
			if fail {
				return errors.New("input/output error")
			}
			return f.Sync()
		}),
		WithWriteResult(func(_ string, err error) { reported = err }))
	committed(t, l, "vm-1", req(Item{Model: l40s, Count: 2}))
	_, u, err := l.ReleaseUnsynced("vm-1", t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	fail = true
	err = u.Durable()
	if err == nil || !strings.Contains(err.Error(), "not acknowledged") || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("Durable with a failing fdatasync = %v; want the write not acknowledged, with the disk's error", err)
	}
	if reported == nil {
		t.Error("the failed fdatasync was not reported to the write observer")
	}
	fail = false
	mustReserve(t, l, "vm-2", req(Item{Model: l40s, Count: 1}), t0)
	if _, err := l.Commit("vm-2", t0); err == nil || !strings.Contains(err.Error(), "restart the agent") {
		t.Fatalf("a commit after the failed fdatasync = %v; want the journal closed, restart the agent", err)
	}
}

// A commit awaiting its name is published before its fdatasync returns
// (it is listed as the reservation it was until its name settles it), and
// CommitAwaitingName returns only once it is durable. Another writer's
// fdatasync that comes first makes it durable: its own then costs none.
func TestCommitAwaitingNamePublishedBeforeItsSync(t *testing.T) {
	gate := make(chan struct{})
	var held atomic.Bool
	l := newLedger(t, WithDatasync(func(f *os.File) error {
		if held.CompareAndSwap(true, false) {
			<-gate
		}
		return f.Sync()
	}))
	committed(t, l, "vm-0", req(Item{Model: l40s, Count: 1}))
	r := mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 4}), t0)
	held.Store(true)
	done := make(chan error, 1)
	go func() {
		_, err := l.CommitAwaitingName("vm-1", r.CreatedAt, t0)
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := l.Get("vm-1"); err == nil && c.AwaitingName {
			break
		}
		if time.Now().After(deadline) {
			close(gate)
			t.Fatal("the commit awaiting its name was not published while its fdatasync waited")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("CommitAwaitingName returned (%v) before its record was durable", err)
	default:
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Written ahead of another writer's fdatasync: carried by it.
	r2 := mustReserve(t, l, "vm-2", req(Item{Model: h100, Count: 2}), t0)
	committed(t, l, "vm-3", req(Item{Model: l40s, Count: 1}))
	_, u, err := l.ReleaseUnsynced("vm-3", t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	syncs := l.Fdatasyncs()
	if _, err := l.CommitAwaitingName("vm-2", r2.CreatedAt, t0); err != nil {
		t.Fatal(err)
	}
	if err := u.Durable(); err != nil || l.Fdatasyncs()-syncs != 1 {
		t.Fatalf("a release and a commit written one after the other cost %d fdatasyncs (%v); want 1", l.Fdatasyncs()-syncs, err)
	}
	l = reopen(t, l)
	for id, awaiting := range map[string]bool{"vm-1": true, "vm-2": true} {
		if c, err := l.Get(id); err != nil || c.AwaitingName != awaiting {
			t.Errorf("after reopen, %s: %+v, %v; want committed awaiting its name", id, c, err)
		}
	}
	if _, err := l.Get("vm-3"); !errors.Is(err, ErrNotFound) {
		t.Errorf("after reopen, vm-3: %v; want released", err)
	}
}

// CommitAwaitingNameAhead publishes a commit awaiting its name without an
// fdatasync: the caller makes it durable later, and the first of several
// such commits to be made durable covers the others. A commit already
// written answers what it read, durable once the journal is; a lapsed
// reservation is refused as CommitAwaitingName refuses it, with nothing
// left to make durable.
func TestCommitAwaitingNameAhead(t *testing.T) {
	l := newLedger(t)
	committed(t, l, "vm-0", req(Item{Model: l40s, Count: 1})) // the file's first write
	r1 := mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 2}), t0)
	r2 := mustReserve(t, l, "vm-2", req(Item{Model: h100, Count: 2}), t0)
	syncs := l.Fdatasyncs()
	c1, u1, err := l.CommitAwaitingNameAhead("vm-1", r1.CreatedAt, t0)
	if err != nil || !c1.AwaitingName || c1.State != StateCommitted {
		t.Fatalf("vm-1 written ahead: %+v, %v; want committed awaiting its name", c1, err)
	}
	_, u2, err := l.CommitAwaitingNameAhead("vm-2", r2.CreatedAt, t0)
	if err != nil {
		t.Fatal(err)
	}
	if n := l.Fdatasyncs() - syncs; n != 0 {
		t.Fatalf("two commits written ahead cost %d fdatasyncs; want 0 until made durable", n)
	}
	if c, err := l.Get("vm-2"); err != nil || !c.AwaitingName {
		t.Fatalf("vm-2 before it is durable: %+v, %v; want published, awaiting its name", c, err)
	}
	if err := u2.Durable(); err != nil {
		t.Fatal(err)
	}
	if err := u1.Durable(); err != nil {
		t.Fatal(err)
	}
	if n := l.Fdatasyncs() - syncs; n != 1 {
		t.Fatalf("two commits made durable cost %d fdatasyncs; want 1, the second covered by the first", n)
	}
	again, u, err := l.CommitAwaitingNameAhead("vm-1", r1.CreatedAt, t0)
	if err != nil || again.State != StateCommitted {
		t.Fatalf("vm-1 again: %+v, %v; want its commit answered", again, err)
	}
	if err := u.Durable(); err != nil || l.Fdatasyncs()-syncs != 1 {
		t.Fatalf("the repeated commit cost %d fdatasyncs in all (%v); want none of its own", l.Fdatasyncs()-syncs, err)
	}
	r3 := mustReserve(t, l, "vm-3", req(Item{Model: h100, Count: 1}), t0)
	if _, u, err := l.CommitAwaitingNameAhead("vm-3", r3.CreatedAt, r3.ExpiresAt.Add(time.Second)); !errors.Is(err, ErrLeaseExpired) || u != (Unsynced{}) {
		t.Fatalf("a lapsed reservation written ahead: %+v, %v; want ErrLeaseExpired and nothing to make durable", u, err)
	}
	l = reopen(t, l)
	for _, id := range []string{"vm-1", "vm-2"} {
		if c, err := l.Get(id); err != nil || !c.AwaitingName {
			t.Errorf("after reopen, %s: %+v, %v; want committed awaiting its name", id, c, err)
		}
	}
}
