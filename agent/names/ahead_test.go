package names

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuherd/gpuherd/internal/datasync"
)

// setSync replaces the log's fdatasync, as an append would see it.
func setSync(s *Store, sync func(*os.File) error) {
	s.log.wmu.Lock()
	s.log.sync = sync
	s.log.wmu.Unlock()
}

// durableOf is the index up to which the log says it is on disk.
func durableOf(s *Store) uint64 {
	s.log.smu.Lock()
	defer s.log.smu.Unlock()
	return s.log.durable
}

// gatedSync is an fdatasync that waits for release, and says on started
// that one began.
func gatedSync() (sync func(*os.File) error, started chan struct{}, release chan struct{}) {
	started, release = make(chan struct{}, 1), make(chan struct{})
	return func(f *os.File) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
		return datasync.File(f)
	}, started, release
}

func openTestStore(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "names.db")
	s, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	return s, path
}

// The leader's append returns once written, before its fdatasync: its
// entries are readable at once (raft's replication reads them to send
// them), and waitDurable waits for the fdatasync that runs meanwhile.
func TestWALAppendAheadIsDurableLater(t *testing.T) {
	s, _ := openTestStore(t)
	defer s.Close()
	if err := s.StoreLogs([]*raft.Log{walLog(1, 1)}); err != nil {
		t.Fatal(err)
	}
	if d := durableOf(s); d != 1 {
		t.Fatalf("a follower's append: durable up to %d, want 1 on return", d)
	}
	sync, started, release := gatedSync()
	setSync(s, sync)
	done := make(chan error, 1)
	go func() { done <- s.log.appendAhead([]*raft.Log{walLog(2, 1), walLog(3, 1)}) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an append written ahead waited for its fdatasync")
	}
	checkLog(t, s, map[uint64]uint64{1: 1, 2: 1, 3: 1}, 1, 3)
	<-started
	if d := durableOf(s); d != 1 {
		t.Fatalf("durable up to %d while the fdatasync of 2..3 has not returned, want 1", d)
	}
	waited := make(chan error, 1)
	go func() { waited <- s.WaitDurable(3) }()
	close(release)
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if d := durableOf(s); d != 3 {
		t.Fatalf("durable up to %d after the fdatasync, want 3", d)
	}
	setSync(s, datasync.File)
}

// A failed fdatasync of entries written ahead leaves them of unknown
// durability: waiting for them fails, and the log takes no more appends
// (raft's leader then steps down), rather than going on past a hole.
func TestWALFailedSyncAheadStopsTheLog(t *testing.T) {
	s, _ := openTestStore(t)
	defer s.Close()
	if err := s.StoreLogs([]*raft.Log{walLog(1, 1)}); err != nil {
		t.Fatal(err)
	}
	setSync(s, func(*os.File) error { return errors.New("injected: the disk failed the sync") })
	if err := s.log.appendAhead([]*raft.Log{walLog(2, 1)}); err != nil {
		t.Fatal(err)
	}
	err := s.WaitDurable(2)
	if err == nil || !strings.Contains(err.Error(), "injected") || !strings.Contains(err.Error(), "written ahead") {
		t.Fatalf("waiting for an entry whose sync failed: %v", err)
	}
	setSync(s, datasync.File)
	if err := s.StoreLogs([]*raft.Log{walLog(3, 1)}); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("an append after a failed sync ahead: %v, want the sync's error", err)
	}
	if err := s.WaitDurable(1); err != nil {
		t.Fatalf("entry 1 was durable before: %v", err)
	}
}

// A log opened again after a kill, its entries written ahead never
// synced by the process that wrote them, reads them back and makes them
// durable before anything is applied from them.
func TestWALOpenedAfterAKillSyncsWhatWasWrittenAhead(t *testing.T) {
	s, path := openTestStore(t)
	defer s.Close()
	if err := s.StoreLogs([]*raft.Log{walLog(1, 1)}); err != nil {
		t.Fatal(err)
	}
	sync, started, release := gatedSync()
	setSync(s, sync)
	if err := s.log.appendAhead([]*raft.Log{walLog(2, 1), walLog(3, 1)}); err != nil {
		t.Fatal(err)
	}
	<-started // the writer's sync is stuck: as if killed before it ran
	syncs := 0
	w, err := openWAL(LogDir(path), 0, func() { syncs++ })
	if err != nil {
		t.Fatal(err)
	}
	first, last := w.bounds()
	w.smu.Lock()
	durable := w.durable
	w.smu.Unlock()
	if first != 1 || last != 3 || durable != 3 || syncs != 1 {
		t.Fatalf("reopened: entries %d..%d, durable up to %d, %d syncs; want 1..3, 3, 1", first, last, durable, syncs)
	}
	w.close()
	close(release)
	if err := s.WaitDurable(3); err != nil {
		t.Fatal(err)
	}
}

// The registry's leader answers a write only once its own copy of the
// log entry is durable, not only the follower's that committed it: when
// the leader's fdatasync fails, the write answers unavailable, uncertain
// (it was applied), never its result. Each fdatasync of entries written
// ahead is reported to the storage observer as the log's "sync".
func TestLeaderAnswersOnlyWhatItsDiskKept(t *testing.T) {
	seen := &storageLog{last: map[string]error{}}
	reg := soloLeader(t, t.TempDir(), func(c *Config) { c.StorageResult = seen.report })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := reg.Acquire(ctx, Claim("before"), "node-a", "", "req", nil); err != nil {
		t.Fatal(err)
	}
	if err, ok := seen.get("log/sync"); !ok || err != nil {
		t.Fatalf("the leader's sync ahead: reported %v (%v), want a success", err, ok)
	}
	setSync(reg.store, func(*os.File) error { return errors.New("injected: the disk failed the sync") })
	defer setSync(reg.store, datasync.File)
	g, err := reg.Acquire(ctx, Claim("vm-1"), "node-a", "", "req", nil)
	var ue *UnavailableError
	if !errors.As(err, &ue) || !ue.Uncertain || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("a write whose entry the leader's disk failed: %+v, %v; want unavailable, uncertain, naming the disk's error", g, err)
	}
	if err, _ := seen.get("log/sync"); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("the failed sync ahead: reported %v", err)
	}
}

// calledFrom says whether fn is on the calling goroutine's stack.
func calledFrom(fn string) bool {
	buf := make([]byte, 64<<10)
	return strings.Contains(string(buf[:runtime.Stack(buf, false)]), fn)
}

// Only the leader's commands are written ahead: a follower's appends, and
// the leader's configuration entries and no-ops, are synced inside
// StoreLogs, before raft sends or acknowledges them.
func TestOnlyTheLeadersCommandsAreWrittenAhead(t *testing.T) {
	s, _ := openTestStore(t)
	defer s.Close()
	var leading atomic.Bool
	s.writeAheadWhile(leading.Load)
	var (
		mu     sync.Mutex
		inline []bool
	)
	setSync(s, func(f *os.File) error {
		mu.Lock()
		inline = append(inline, calledFrom("names.(*Store).StoreLogs"))
		mu.Unlock()
		return datasync.File(f)
	})
	entry := func(i uint64, typ raft.LogType) *raft.Log {
		l := walLog(i, 1)
		l.Type = typ
		return l
	}
	for _, c := range []struct {
		name    string
		leading bool
		logs    []*raft.Log
		ahead   bool
	}{
		{"the leader's commands", true, []*raft.Log{walLog(1, 1), walLog(2, 1)}, true},
		{"the leader's commands with a configuration", true, []*raft.Log{walLog(3, 1), entry(4, raft.LogConfiguration)}, false},
		{"the leader's no-op", true, []*raft.Log{entry(5, raft.LogNoop)}, false},
		{"a follower's commands", false, []*raft.Log{walLog(6, 1), walLog(7, 1)}, false},
		{"the leader's commands again", true, []*raft.Log{walLog(8, 1)}, true},
	} {
		mu.Lock()
		inline = nil
		mu.Unlock()
		leading.Store(c.leading)
		if err := s.StoreLogs(c.logs); err != nil {
			t.Fatal(err)
		}
		last := c.logs[len(c.logs)-1].Index
		if err := s.WaitDurable(last); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		got := inline
		mu.Unlock()
		if len(got) == 0 {
			t.Fatalf("%s: no fdatasync", c.name)
		}
		for _, in := range got {
			if in == c.ahead {
				t.Fatalf("%s: fdatasync inside StoreLogs %v, want %v (written ahead: %v)", c.name, in, !c.ahead, c.ahead)
			}
		}
	}
}

// The kernel reports a write-back error to one fdatasync only. When a
// follower's synced append fails while entries written ahead wait for
// their own fdatasync (a leader that just stepped down), that one may
// return success afterwards: the log must count them lost, take no more
// appends, and cut them off the file, so that a restart does not read
// them back from the page cache as if the disk had them.
func TestFailedSyncWhileEntriesWaitCutsThemOff(t *testing.T) {
	s, path := openTestStore(t)
	if err := s.StoreLogs([]*raft.Log{walLog(1, 1)}); err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	setSync(s, func(f *os.File) error {
		switch calls.Add(1) {
		case 1: // the sync of 2..3 written ahead: held, then "succeeds"
			close(started)
			<-release
			return nil
		case 2: // the follower's append of 4
			return errors.New("injected: the disk failed the sync")
		}
		return datasync.File(f)
	})
	if err := s.log.appendAhead([]*raft.Log{walLog(2, 1), walLog(3, 1)}); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := s.StoreLogs([]*raft.Log{walLog(4, 1)}); err == nil {
		t.Fatal("an append whose fdatasync failed succeeded")
	}
	close(release)
	if err := s.WaitDurable(3); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("entries written ahead before a failed fdatasync: %v, want the failure", err)
	}
	if d := durableOf(s); d != 1 {
		t.Fatalf("durable up to %d after the failure, want 1", d)
	}
	setSync(s, datasync.File)
	if err := s.StoreLogs([]*raft.Log{walLog(4, 1)}); err == nil {
		t.Fatal("the log took an append after losing entries written ahead")
	}
	s.Close()
	s, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkLog(t, s, map[uint64]uint64{1: 1}, 1, 1)
}

// A server that no longer leads reads an entry it wrote ahead only once
// it is durable: raft acknowledges entries it finds in its log without
// storing them again, so reading one vouches for it.
func TestAFollowerReadsOnlyDurableEntries(t *testing.T) {
	s, _ := openTestStore(t)
	defer s.Close()
	var leading atomic.Bool
	s.writeAheadWhile(leading.Load)
	if err := s.StoreLogs([]*raft.Log{walLog(1, 1)}); err != nil {
		t.Fatal(err)
	}
	setSync(s, func(*os.File) error { return errors.New("injected: the disk failed the sync") })
	defer setSync(s, datasync.File)
	leading.Store(true)
	if err := s.StoreLogs([]*raft.Log{walLog(2, 1)}); err != nil {
		t.Fatal(err)
	}
	var l raft.Log
	if err := s.GetLog(2, &l); err != nil {
		t.Fatalf("the leader reading its own entry: %v", err)
	}
	leading.Store(false)
	if err := s.GetLog(2, &l); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("a follower reading an entry its fdatasync lost: %v, want the failure", err)
	}
	if err := s.GetLog(1, &l); err != nil {
		t.Fatalf("a follower reading a durable entry: %v", err)
	}
}

// waitUntil polls cond until it holds, for at most ten seconds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited ten seconds for %s", what)
		}
	}
}

// A power cut of the leader before its fdatasync, with one follower
// holding the entry: the voters that lack it (the restarted leader among
// them) elect the next leader, and the entry is dropped. The follower that
// held it must never apply it, or its copy of the registry would keep a
// name the others do not have: not when the old leader counted it
// committed, nor when the new leader's commit index passes its index
// before the follower's copy is overwritten (hashicorp/raft lets a
// request with no entries commit up to the follower's own last entry).
// Here the leader's fdatasync fails instead of the power going: the log
// then cuts the records it wrote ahead off its file, which is what the
// disk keeps after a power cut.
func TestPowerCutOfTheLeaderLeavesNoFollowerAhead(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader := c.leader()
	rest := others(c.servers, leader)
	kept, lacking := rest[0], rest[1]
	c.partition([]string{lacking})
	lreg := c.reg(leader)
	waitUntil(t, "the leader to lead without "+lacking, lreg.IsLeader)

	cut := make(chan struct{})
	var cutOnce sync.Once
	powerGoes := func() { cutOnce.Do(func() { close(cut) }) }
	t.Cleanup(powerGoes) // before the cluster closes: its leader waits for the sync
	setSync(lreg.store, func(*os.File) error {
		<-cut
		return errors.New("injected: the power went")
	})
	ctx := ctxT(t, 20*time.Second)
	write := func(name string) (uint64, chan error) {
		before := lreg.Raft().LastIndex()
		done := make(chan error, 1)
		go func() {
			_, err := lreg.Acquire(ctx, Claim(name), leader, "", "req", nil)
			done <- err
		}()
		waitUntil(t, "the leader to write "+name, func() bool { return lreg.Raft().LastIndex() > before })
		return lreg.Raft().LastIndex(), done
	}
	lost, firstDone := write("vm-lost")
	kreg := c.reg(kept)
	waitUntil(t, kept+" to store the entry", func() bool { last, _ := kreg.store.LastIndex(); return last >= lost })
	waitUntil(t, "the leader to count the entry committed", func() bool { return lreg.Raft().CommitIndex() >= lost })
	// Another write: its AppendEntries leaves after the commit above, and
	// carries the commit index the follower may apply up to.
	next, secondDone := write("vm-next")
	waitUntil(t, kept+" to store the next entry", func() bool { last, _ := kreg.store.LastIndex(); return last >= next })
	if got := kreg.Raft().CommitIndex(); got >= lost {
		t.Fatalf("%s was told entry %d is committed while the leader's copy is not durable (commit index %d)", kept, lost, got)
	}

	// The power goes: the leader is cut off at once, and its log keeps
	// what its disk had (the failed sync cuts the rest off the file).
	c.partition([]string{leader})
	powerGoes()
	for _, done := range []chan error{firstDone, secondDone} {
		var ue *UnavailableError
		if err := <-done; !errors.As(err, &ue) || !ue.Uncertain {
			t.Fatalf("a write the leader lost: %v, want unavailable, uncertain", err)
		}
	}
	// The old leader comes back without its copy, linked to the voter
	// that lacks the entry only: never, meanwhile, can the one that keeps
	// it lead.
	c.kill(leader)
	c.partition([]string{kept})
	c.mu.Lock()
	delete(c.cut, [2]string{leader, lacking})
	delete(c.cut, [2]string{lacking, leader})
	c.mu.Unlock()
	c.start(leader)
	newLeader := c.leader(leader, lacking)
	if _, err := c.reg(newLeader).Acquire(ctx, Claim("vm-after"), newLeader, "", "req", nil); err != nil {
		t.Fatal(err)
	}
	c.heal()
	c.caughtUp(t, kept)
	for _, id := range []string{leader, lacking, kept} {
		if r, err := c.reg(id).Lookup(ctx, Claim("vm-lost"), Stale); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%s's copy of the registry: vm-lost %+v, %v; the entry was dropped, want not found", id, r, err)
		}
	}
}
