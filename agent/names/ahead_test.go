package names

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
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
