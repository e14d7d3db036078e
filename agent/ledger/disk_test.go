package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/gpuherd/gpuherd/agent/internal/testdisk"
)

// The ledger on a disk that lies, fills up or was tampered with: Open
// refuses, names the file, says what to do, and never starts empty over a
// file that held claims; a write that fails leaves the ledger as it was.

func TestOpenRefusesTruncatedFile(t *testing.T) {
	full := ledgerFile(t)
	fi, err := os.Stat(full)
	if err != nil {
		t.Fatal(err)
	}
	// Every page boundary, and one byte short of the end. A ledger cut
	// after its meta pages used to crash the agent with SIGBUS.
	var sizes []int64
	for n := int64(0); n < fi.Size(); n += 4096 {
		sizes = append(sizes, n, n+100)
	}
	sizes = append(sizes, fi.Size()-1)
	refused := 0
	for _, n := range sizes {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			path := copyFile(t, full)
			if err := os.Truncate(path, n); err != nil {
				t.Fatal(err)
			}
			l, err := Open(path)
			if err == nil {
				// bbolt grows its file ahead of use: a cut in the slack
				// past the last page in use loses nothing.
				if c, err := l.Get("vm-1"); err != nil || c.State != StateCommitted {
					t.Errorf("opened a ledger cut to %d bytes without its claim: %v", n, err)
				}
				l.Close()
				return
			}
			refused++
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open of a ledger cut to %d of %d bytes = %v, want ErrCorrupt", n, fi.Size(), err)
			}
			for _, s := range []string{path, "restore it from a backup"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("message %q lacks %q", err, s)
				}
			}
		})
	}
	if refused < len(sizes)/2 {
		t.Fatalf("only %d of %d cuts were refused", refused, len(sizes))
	}
}

func TestOpenRefusesEmptyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := openMustFail(t, path)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "empty (0 bytes)") {
		t.Fatalf("Open of an empty ledger.db = %v, want ErrCorrupt: bbolt would make it a new, empty ledger", err)
	}
}

// TestOpenNeverStartsEmptyOverDamage damages every 512-byte block of a
// ledger in turn. Open either refuses the file with an error, or opens it
// with its claim still there: it never panics, crashes or comes up empty.
func TestOpenNeverStartsEmptyOverDamage(t *testing.T) {
	full := ledgerFile(t)
	data, err := os.ReadFile(full)
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	for off := 0; off < len(data); off += 512 {
		for _, junk := range [][]byte{bytes.Repeat([]byte{0xff}, 16), make([]byte, 16)} {
			path := filepath.Join(t.TempDir(), "ledger.db")
			damaged := bytes.Clone(data)
			copy(damaged[off:], junk)
			if err := os.WriteFile(path, damaged, 0o600); err != nil {
				t.Fatal(err)
			}
			l, err := Open(path, WithLockTimeout(100*time.Millisecond))
			if err != nil {
				refused++
				if !strings.Contains(err.Error(), path) {
					t.Errorf("damage at %d: error %q does not name the file", off, err)
				}
				continue
			}
			if c, err := l.Get("vm-1"); err != nil || c.State != StateCommitted {
				t.Errorf("damage at %d: opened without claim vm-1 (%v, %v)", off, c, err)
			}
			l.Close()
		}
	}
	if refused == 0 {
		t.Fatal("no damage was detected at all: the test damaged nothing")
	}
}

func TestOpenPathThatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	asDir := filepath.Join(dir, "ledger.db")
	if err := os.Mkdir(asDir, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := Open(asDir)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "is a directory") || !strings.Contains(err.Error(), asDir) {
		t.Fatalf("Open(directory) = %v", err)
	}
	// The data directory is a file: every component of the path is checked.
	notDir := filepath.Join(dir, "data")
	if err := os.WriteFile(notDir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(notDir, "ledger.db")
	_, err = Open(path)
	if !errors.Is(err, syscall.ENOTDIR) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "Nothing was changed") {
		t.Fatalf("Open under a file = %v, want ENOTDIR naming %s", err, path)
	}
}

func TestCreateIsAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ledger.db")
	openAt(t, path)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].Name() != "ledger.db" || entries[1].Name() != "ledger.db"+journalSuffix {
		t.Fatalf("data directory holds %v, want only ledger.db and its journal (no temporary files)", entries)
	}
	if _, err := Open(path, WithLockTimeout(50*time.Millisecond)); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
}

func TestInspectReadsWithoutWriting(t *testing.T) {
	path := ledgerFile(t)
	before, _ := os.ReadFile(path)
	rep, err := Inspect(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Claims) != 1 || rep.Claims[0].ID != "vm-1" || rep.Claims[0].State != StateCommitted || rep.Schema != schemaSettled || rep.Revision == 0 {
		t.Fatalf("Inspect = %+v", rep)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("Inspect changed the file")
	}

	l := openAt(t, path)
	if _, err := Inspect(path, 50*time.Millisecond); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "stop the agent") {
		t.Fatalf("Inspect while open = %v, want ErrLocked telling to stop the agent", err)
	}
	l.Close()

	if _, err := Inspect(filepath.Join(t.TempDir(), "ledger.db"), 0); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Inspect of a missing file = %v", err)
	}
	rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketClaims).Put([]byte("vm-1"), []byte("{")) })
	var ce *CorruptError
	if _, err := Inspect(path, 0); !errors.As(err, &ce) || ce.Key != "vm-1" {
		t.Fatalf("Inspect of a bad record = %v, want *CorruptError on vm-1", err)
	}
}

func TestBackupAndRestore(t *testing.T) {
	l := newLedger(t)
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 2}), t0)
	mustCommit(t, l, "vm-1", t0)
	if err := l.Drain("0000:db:00.0", "fan", t0); err != nil {
		t.Fatal(err)
	}
	// Online: through the open ledger, as the agent would.
	online := filepath.Join(t.TempDir(), "online.db")
	f, err := os.Create(online)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Backup(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// The copy holds every write, so it says so: a gpuherd without the
	// journal may read it.
	if rep, err := Inspect(online, 0); err != nil || rep.Schema != schemaSettled {
		t.Errorf("online backup: schema %d, %v; want %d", rep.Schema, err, schemaSettled)
	}
	want := l.List()
	l.Close()

	// Offline: the file of a stopped agent.
	offline := filepath.Join(t.TempDir(), "offline.db")
	rep, err := BackupFile(l.Path(), offline, 0)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Path != offline || len(rep.Claims) != 1 || rep.Drains["0000:db:00.0"].Reason != "fan" {
		t.Fatalf("BackupFile report = %+v", rep)
	}
	for _, path := range []string{online, offline} {
		r := openAt(t, path)
		if got := r.List(); !reflect.DeepEqual(got, want) {
			t.Errorf("restored %s holds %+v, want %+v", path, got, want)
		}
		r.Close()
	}

	// A damaged source is refused and the destination not created.
	bad := filepath.Join(t.TempDir(), "ledger.db")
	if err := os.WriteFile(bad, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "copy.db")
	if _, err := BackupFile(bad, dst, 0); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("BackupFile(junk) = %v", err)
	}
	if _, err := os.Stat(dst); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a failed backup left %s", dst)
	}
}

func TestOpenOnReadOnlyFileSystem(t *testing.T) {
	dir := testdisk.Mount(t, 1<<20)
	path := filepath.Join(dir, "ledger.db")
	l := openAt(t, path)
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 1}), t0)
	mustCommit(t, l, "vm-1", t0)
	l.Close()
	if out, err := exec.Command("mount", "-o", "remount,ro", dir).CombinedOutput(); err != nil {
		t.Fatalf("remount ro: %v: %s", err, out)
	}
	_, err := Open(path)
	if !errors.Is(err, syscall.EROFS) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("Open on a read-only file system = %v, want EROFS naming the file", err)
	}
	// Checking and backing up need no write access.
	if rep, err := Inspect(path, 0); err != nil || len(rep.Claims) != 1 {
		t.Fatalf("Inspect on a read-only file system = %+v, %v", rep, err)
	}
}

func TestCreateOnFullDisk(t *testing.T) {
	dir := testdisk.Mount(t, 256<<10)
	testdisk.Fill(t, dir)
	path := filepath.Join(dir, "ledger.db")
	_, err := Open(path)
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "full") {
		t.Fatalf("Open on a full disk = %v, want ENOSPC naming the file", err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Name() != "filler" {
			t.Errorf("a failed create left %s behind", e.Name())
		}
	}
}

// TestWriteOnFullDisk fills the disk under an open ledger, then claims
// until a write fails (the journal's preallocation and the pages the file
// reuses hold out a while: see the loop). Reserving writes no file, so it is a Commit or a
// Release of a committed claim that fails. The failed write changes
// nothing, in memory (reservations included) or on disk; once space is freed
// the ledger carries on, and the reservation whose Commit failed can still
// be committed.
func TestWriteOnFullDisk(t *testing.T) {
	dir := testdisk.Mount(t, 512<<10)
	path := filepath.Join(dir, "ledger.db")
	// What the agent is told of each write: a journal that cannot be
	// stored in the file keeps the store failing, although its appends
	// are acknowledged, until a checkpoint succeeds.
	var (
		resultsMu sync.Mutex
		results   []string
	)
	l := openAt(t, path, WithWriteResult(func(op string, err error) {
		resultsMu.Lock()
		defer resultsMu.Unlock()
		results = append(results, fmt.Sprintf("%s %v", op, err != nil))
	}))
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	filler := testdisk.Fill(t, dir)
	labels := map[string]string{}
	for i := range MaxLabels {
		labels[fmt.Sprintf("k%02d", i)] = strings.Repeat("v", MaxLabelValueLen)
	}
	var (
		failed   error
		failedOn string
		id       string
	)
	for i := 0; failed == nil && i < 1000; i++ {
		// The journal is preallocated, and the bbolt file reuses the
		// pages that releases free: claims alone would go on forever.
		// Facts of new GPUs make the checkpoints grow the file, which
		// fails, and then the journal, which must grow past its
		// preallocation.
		_ = l.PutFacts(fmt.Sprintf("0000:%02x:00.1", i%250+1), []byte(fmt.Sprintf(`{"pad":%q}`, strings.Repeat("f", 32<<10))))
		id = fmt.Sprintf("vm-%d", i)
		if _, err := l.Reserve(id, Request{Items: []Item{{Model: h100, Count: 1}}, Labels: labels}, "c", t0, lease); err != nil {
			t.Fatalf("Reserve %d on a full disk: %v; a reservation writes no file", i, err)
		}
		// Another live reservation, that the failed write must keep.
		if _, err := l.Reserve("bystander", req(Item{Model: l40s, Count: 1}), "c", t0, lease); err != nil {
			t.Fatal(err)
		}
		rev, before, free := l.Revision(), l.List(), l.Free(t0)
		failedOn = "Commit"
		_, failed = l.Commit(id, t0)
		if failed == nil {
			rev, before, free = l.Revision(), l.List(), l.Free(t0)
			failedOn = "Release"
			_, failed = l.Release(id, t0)
		}
		if failed != nil {
			if !errors.Is(failed, syscall.ENOSPC) || !strings.Contains(failed.Error(), path) || !strings.Contains(failed.Error(), "not acknowledged") {
				t.Fatalf("%s %d on a full disk: %v, want ENOSPC naming the ledger", failedOn, i, failed)
			}
			if l.Revision() != rev || !reflect.DeepEqual(l.List(), before) || !reflect.DeepEqual(l.Free(t0), free) {
				t.Fatalf("a failed %s changed the ledger: revision %d → %d", failedOn, rev, l.Revision())
			}
		}
	}
	if failed == nil {
		t.Fatal("no write failed on a full disk")
	}
	resultsMu.Lock()
	first := slices.Index(results, OpCheckpoint+" true")
	if first < 0 {
		t.Errorf("no failed checkpoint was reported before a write failed: %v", results)
	} else if i := slices.IndexFunc(results[first:], func(r string) bool { return strings.HasSuffix(r, " false") }); i >= 0 {
		t.Errorf("after the failed checkpoint, %q told the store writes again while the journal was not in the file", results[first+i])
	}
	resultsMu.Unlock()
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if failedOn == "Commit" {
		if c, err := l.Commit(id, t0); err != nil || c.State != StateCommitted {
			t.Fatalf("Commit of %s once space is back = %+v, %v", id, c, err)
		}
	} else if _, err := l.Release(id, t0); err != nil {
		t.Fatalf("Release of %s once space is back: %v", id, err)
	}
	var want []Claim
	for _, c := range l.List() {
		if c.State == StateCommitted {
			want = append(want, c)
		}
	}
	if _, err := l.Reserve("after", req(Item{Model: l40s, Count: 1}), "c", t0, lease); err != nil {
		t.Fatalf("Reserve once space is back: %v", err)
	}
	resultsMu.Lock()
	if last := results[len(results)-1]; last != OpWrite+" false" && last != OpCheckpoint+" false" {
		t.Errorf("once space is back the store is still failing: last report %q", last)
	}
	resultsMu.Unlock()
	l.Close()
	r := openAt(t, path)
	if got := r.List(); !reflect.DeepEqual(got, want) {
		t.Fatalf("after reopen: %d claims, want the %d committed before", len(got), len(want))
	}
}

func copyFile(t *testing.T, src string) string {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "ledger.db")
	if err := os.WriteFile(dst, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return dst
}
