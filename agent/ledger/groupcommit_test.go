package ledger

import (
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// queued waits until n writers wait for the next file transaction.
func queued(l *Ledger, n int) {
	for {
		l.queueMu.Lock()
		got := len(l.queue)
		l.queueMu.Unlock()
		if got >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// commitTogether reserves ids, then commits them from as many goroutines
// while the write lock is held, so that they all queue for one
// transaction, and returns each commit's error.
func commitTogether(t *testing.T, l *Ledger, ids []string) []error {
	t.Helper()
	for i, id := range ids {
		if !slices.Contains(ids[:i], id) {
			mustReserve(t, l, id, req(Item{Model: h100, Count: 1}), t0)
		}
	}
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	l.fileMu.Lock()
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = l.Commit(id, t0)
		}()
		queued(l, i+1) // in this order
	}
	l.fileMu.Unlock()
	wg.Wait()
	return errs
}

// Commits that wait on the same ledger share one transaction and one
// fsync, and each is answered as if alone.
func TestGroupCommit(t *testing.T) {
	l := newLedger(t)
	before := l.Syncs()
	ids := []string{"vm-1", "vm-2", "vm-3", "vm-4", "vm-5"}
	for i, err := range commitTogether(t, l, ids) {
		if err != nil {
			t.Errorf("commit %s: %v", ids[i], err)
		}
	}
	if n := l.Syncs() - before; n != 1 {
		t.Errorf("%d queued commits took %d fsync'ed transactions, want 1", len(ids), n)
	}
	for _, id := range ids {
		if c, err := l.Get(id); err != nil || c.State != StateCommitted {
			t.Errorf("%s after the batch: %+v, %v", id, c, err)
		}
	}
}

// A write of the batch that changes nothing (here a commit of a claim
// the batch commits before it) is answered alone and leaves nothing; the
// others commit without it, still in one fsync.
func TestGroupCommitWithAWriteThatChangesNothing(t *testing.T) {
	l := newLedger(t)
	before := l.Syncs()
	ids := []string{"vm-1", "vm-1", "vm-3"}
	for i, err := range commitTogether(t, l, ids) {
		if err != nil {
			t.Errorf("commit %d (%s): %v", i, ids[i], err)
		}
	}
	if n := l.Syncs() - before; n != 1 {
		t.Errorf("took %d fsync'ed transactions, want 1", n)
	}
	for _, id := range []string{"vm-1", "vm-3"} {
		if c, err := l.Get(id); err != nil || c.State != StateCommitted {
			t.Errorf("%s: %+v, %v", id, c, err)
		}
	}
}

// A batch torn by a crash between its fsync and its answers: at the fsync
// every write of the batch is in the file, and none has been answered yet.
// A batch whose transaction fails publishes nothing and fails every writer.
func TestGroupCommitTornByACrash(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ledger.db")
	l := openAt(t, path)
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	ids := []string{"vm-1", "vm-2", "vm-3"}
	var (
		snapshot, journal []byte
		answered          int
	)
	var mu sync.Mutex
	testAfterCommit = func(writes int) {
		mu.Lock()
		defer mu.Unlock()
		snapshot, journal = ledgerFiles(t, path)
		answered = 0
		for _, id := range ids {
			if c, err := l.Get(id); err == nil && c.State == StateCommitted {
				answered++
			}
		}
	}
	defer func() { testAfterCommit = nil }()
	commitTogether(t, l, ids)
	if answered != 0 {
		t.Errorf("%d commits were visible before their batch's fsync returned", answered)
	}
	crashed := filepath.Join(dir, "crashed.db")
	writeLedgerFiles(t, crashed, snapshot, journal)
	after := openAt(t, crashed)
	for _, id := range ids {
		if c, err := after.Get(id); err != nil || c.State != StateCommitted {
			t.Errorf("%s in the file at the batch's fsync: %+v, %v", id, c, err)
		}
	}
	testAfterCommit = nil

	// A transaction that fails: the database closes under the queued writers.
	mustReserve(t, l, "vm-4", req(Item{Model: h100, Count: 1}), t0)
	mustReserve(t, l, "vm-5", req(Item{Model: h100, Count: 1}), t0)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	l.fileMu.Lock()
	for i, id := range []string{"vm-4", "vm-5"} {
		wg.Add(1)
		go func() { defer wg.Done(); _, errs[i] = l.Commit(id, t0) }()
		queued(l, i+1)
	}
	if err := l.db.Close(); err != nil {
		t.Fatal(err)
	}
	l.fileMu.Unlock()
	wg.Wait()
	for i, err := range errs {
		if err == nil {
			t.Errorf("commit %d answered success from a failed transaction", i)
		}
	}
	for _, id := range []string{"vm-4", "vm-5"} {
		if c, _ := l.Get(id); c.State == StateCommitted {
			t.Errorf("%s published as committed after its transaction failed", id)
		}
	}
}
