package names

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuherd/gpuherd/agent/internal/testdisk"
)

// storageLog records what StorageResult was told.
type storageLog struct {
	mu   sync.Mutex
	last map[string]error // part/op → last outcome
}

func (s *storageLog) report(part, op string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last[part+"/"+op] = err
}

func (s *storageLog) get(key string) (error, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	err, ok := s.last[key]
	return err, ok
}

// soloLeader opens a registry of one voter, node-a, with its store in dir
// and its Config adjusted by observe, and waits until it leads; it is
// closed when the test ends.
func soloLeader(t *testing.T, dir string, observe func(*Config)) *Registry {
	t.Helper()
	_, trans := raft.NewInmemTransport("node-a")
	cfg := Config{
		Node: "node-a", Role: RoleVoter, Servers: []Server{{ID: "node-a", Address: "node-a"}},
		DataDir: dir, Transport: trans, Timing: FastTiming(), Lease: time.Hour,
	}
	observe(&cfg)
	reg, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	for deadline := time.Now().Add(10 * time.Second); !reg.IsLeader(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no leader")
		}
	}
	return reg
}

// TestStorageResultReportsFullDisk: a voter whose disk fills up tells
// StorageResult that its log appends fail with ENOSPC (raft itself only
// logs it), and that they succeed again once there is room.
func TestStorageResultReportsFullDisk(t *testing.T) {
	disk := testdisk.Mount(t, 2<<20)
	seen := &storageLog{last: map[string]error{}}
	reg := soloLeader(t, disk, func(c *Config) { c.StorageResult = seen.report })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := reg.Hold(ctx, Claim("vm-0"), "node-a", "node-a", "r", false); err != nil {
		t.Fatal(err)
	}
	if err, ok := seen.get("log/append"); !ok || err != nil {
		t.Fatalf("log append before the disk fills: reported %v (%v), want a success", err, ok)
	}
	filler := testdisk.Fill(t, disk)
	// The zeros the log writes ahead of its records (walPrealloc) take
	// appends for a while on a full disk: hold and release names until an
	// append needs room the disk does not have.
	failed := false
	for i := 1; i < 20000 && !failed; i++ {
		hctx, hcancel := context.WithTimeout(ctx, time.Second)
		rec, err := reg.Hold(hctx, Claim(fmt.Sprintf("vm-%d", i)), "node-a", "node-a", "r", false)
		if err == nil {
			_, err = reg.Release(hctx, Claim(fmt.Sprintf("vm-%d", i)), rec.Token, "node-a")
		}
		hcancel()
		failed = err != nil
	}
	if !failed {
		t.Fatal("no hold failed on a full disk")
	}
	if err, _ := seen.get("log/append"); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("log append on a full disk: reported %v, want ENOSPC", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	t.Logf("reported while full: log/append: %v", func() error { e, _ := seen.get("log/append"); return e }())
	// Raft steps down after a failed append and elects itself again: the
	// next hold that goes through is a successful append.
	deadline := time.Now().Add(10 * time.Second)
	for {
		hctx, hcancel := context.WithTimeout(ctx, time.Second)
		_, err := reg.Hold(hctx, Claim("vm-after"), "node-a", "node-a", "r", false)
		hcancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no hold after the disk has room again: %v", err)
		}
	}
	if err, _ := seen.get("log/append"); err != nil {
		t.Errorf("log append once there is room: reported %v, want a success", err)
	}
}

// failingSnapshots fails every snapshot it is asked to create.
type failingSnapshots struct{ raft.SnapshotStore }

func (failingSnapshots) Create(raft.SnapshotVersion, uint64, uint64, raft.Configuration, uint64, raft.Transport) (raft.SnapshotSink, error) {
	return nil, &os.PathError{Op: "mkdir", Path: "snapshots/1-2-3.tmp", Err: syscall.EROFS}
}

// TestStorageResultReportsSnapshots: a snapshot that cannot be created is
// reported as the snapshots' failure, one written in full as their
// success.
func TestStorageResultReportsSnapshots(t *testing.T) {
	seen := &storageLog{last: map[string]error{}}
	bad := observedSnapshots{failingSnapshots{}, seen.report}
	if _, err := bad.Create(raft.SnapshotVersionMax, 1, 1, raft.Configuration{}, 1, nil); err == nil {
		t.Fatal("create on a failing store succeeded")
	}
	if err, _ := seen.get("snapshots/create"); !errors.Is(err, syscall.EROFS) {
		t.Errorf("snapshots/create reported %v, want EROFS", err)
	}
	good := observedSnapshots{raft.NewInmemSnapshotStore(), seen.report}
	sink, err := good.Create(raft.SnapshotVersionMax, 1, 1, raft.Configuration{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sink.Write([]byte("state")); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if err, ok := seen.get("snapshots/write"); !ok || err != nil {
		t.Errorf("snapshots/write after a snapshot written in full: %v (%v), want a success", err, ok)
	}
}

// TestStorageTimeTimesTheLogsWrites: StorageTime, alone (no
// StorageResult), is told how long the voter's log appends and its term
// and vote writes took.
func TestStorageTimeTimesTheLogsWrites(t *testing.T) {
	var (
		mu    sync.Mutex
		times = map[string]int{}
	)
	reg := soloLeader(t, t.TempDir(), func(c *Config) {
		c.StorageTime = func(part, op string, d time.Duration) {
			if d <= 0 {
				t.Errorf("%s/%s took %v", part, op, d)
			}
			mu.Lock()
			times[part+"/"+op]++
			mu.Unlock()
		}
	})
	mu.Lock()
	before := times["log/append"]
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := reg.Hold(ctx, Claim("vm-0"), "node-a", "node-a", "r", false); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if times["log/append"] <= before || times["log/stable"] == 0 {
		t.Errorf("timed %v (%d appends before the hold); want the hold's append and the election's term and vote", times, before)
	}
}
