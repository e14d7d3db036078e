package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/internal/testdisk"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// The agent over a ledger it cannot trust or cannot write: it refuses to
// start rather than hand out GPUs it cannot account for, says which file,
// what is wrong and what to do, and touches no GPU.

// claimedLedger runs an agent that claims two GPUs and stops; it returns
// the config and the machine, whose GPUs of the claim are on vfio-pci.
func claimedLedger(t *testing.T, dir string, dataDir string) (Config, *sim.Machine) {
	t.Helper()
	cfg := testConfig(t, dir)
	if dataDir != "" {
		cfg.DataDir = dataDir
	}
	m := machine(t, "dgx-h100", dir)
	a := startAgent(t, cfg, m, nil)
	if _, err := a.Claim(context.Background(), "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 2}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	return cfg, m
}

func TestAgentRefusesLedgerItCannotRead(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, path string)
		want   []string
	}{
		{"truncated", func(t *testing.T, path string) {
			if err := os.Truncate(path, 8192); err != nil {
				t.Fatal(err)
			}
		}, []string{"truncated", "restore it from a backup"}},
		{"emptied", func(t *testing.T, path string) {
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
		}, []string{"empty (0 bytes)", "restore it from a backup"}},
		{"overwritten", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte(strings.Repeat("garbage ", 4096)), 0o600); err != nil {
				t.Fatal(err)
			}
		}, []string{"invalid database", "restore it from a backup"}},
		{"a directory", func(t *testing.T, path string) {
			if err := os.Rename(path, path+".old"); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}, []string{"is a directory"}},
		{"damaged freelist", func(t *testing.T, path string) {
			// Junk over the header of every page but the metas, the
			// freelist's among them, wherever the last transactions put
			// it: junk there made bbolt panic.
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fi, err := f.Stat()
			if err != nil {
				t.Fatal(err)
			}
			for off := int64(2 * 4096); off < fi.Size(); off += 4096 {
				if _, err := f.WriteAt([]byte(strings.Repeat("\xff", 64)), off); err != nil {
					t.Fatal(err)
				}
			}
		}, []string{"restore it from a backup"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg, am := claimedLedger(t, dir, "")
			tc.damage(t, cfg.LedgerPath())
			writes := len(am.Kernel.Writes())
			_, err := New(context.Background(), cfg, quietLog(), WithSysfs(am.Kernel, nil))
			if err == nil {
				t.Fatal("the agent started over a damaged ledger")
			}
			for _, s := range append([]string{cfg.LedgerPath()}, tc.want...) {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q lacks %q", err, s)
				}
			}
			if w := am.Kernel.Writes()[writes:]; len(w) != 0 {
				t.Errorf("the agent wrote to sysfs before refusing: %v", w)
			}
		})
	}
}

func TestAgentRefusesReadOnlyLedger(t *testing.T) {
	dir := t.TempDir()
	disk := testdisk.Mount(t, 4<<20)
	cfg, am := claimedLedger(t, dir, filepath.Join(disk, "data"))
	if out, err := exec.Command("mount", "-o", "remount,ro", disk).CombinedOutput(); err != nil {
		t.Fatalf("remount ro: %v: %s", err, out)
	}
	writes := len(am.Kernel.Writes())
	_, err := New(context.Background(), cfg, quietLog(), WithSysfs(am.Kernel, nil))
	if !errors.Is(err, syscall.EROFS) || !strings.Contains(err.Error(), cfg.LedgerPath()) || !strings.Contains(err.Error(), "remount it read-write") {
		t.Fatalf("New on a read-only ledger = %v", err)
	}
	if w := am.Kernel.Writes()[writes:]; len(w) != 0 {
		t.Errorf("the agent wrote to sysfs before refusing: %v", w)
	}
}

func TestAgentStartsOnFullDiskWithItsClaims(t *testing.T) {
	dir := t.TempDir()
	disk := testdisk.Mount(t, 4<<20)
	cfg, am := claimedLedger(t, dir, filepath.Join(disk, "data"))
	testdisk.Fill(t, disk)
	// Reading needs no space: the claims are all there.
	a, err := New(context.Background(), cfg, quietLog(), WithSysfs(am.Kernel, nil))
	if err != nil {
		t.Fatalf("New on a full disk: %v", err)
	}
	defer a.Close()
	if c, err := a.Get(context.Background(), "vm-1"); err != nil || c.State != api.StateClaimed {
		t.Fatalf("vm-1 after a start on a full disk: %+v, %v", c, err)
	}
}

// TestClaimOnFullDiskFailsCleanly fills the disk under a running agent and
// claims until a claim fails. A failed claim leaves no claim behind (none
// committed, the revision moved by no committed write) and says that the
// ledger could not be written; a GPU left on vfio-pci by a failure half-way
// is held by nothing live once its lease is over, and returns to the idle
// driver as soon as the disk has room again.
func TestClaimOnFullDiskFailsCleanly(t *testing.T) {
	dir := t.TempDir()
	disk := testdisk.Mount(t, 1<<20)
	cfg := testConfig(t, dir)
	cfg.DataDir = filepath.Join(disk, "data")
	m := machine(t, "dgx-h100", dir) // the simulated machine's own state stays off the full disk
	clock := &testClock{now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	a := startAgent(t, cfg, m, clock)
	defer a.Close()
	ctx := context.Background()
	filler := testdisk.Fill(t, disk)

	labels := map[string]string{}
	for i := range ledger.MaxLabels {
		labels[fmt.Sprintf("k%02d", i)] = strings.Repeat("v", ledger.MaxLabelValueLen)
	}
	failedID, err := claimUntilDiskFull(t, a, labels)
	t.Logf("claim %s on a full disk: %v", failedID, err)
	// The answer must say why, not pretend the GPUs are taken.
	if api.IsCode(err, api.CodeNotAvailable) || !strings.Contains(err.Error(), "no space left on device") {
		t.Errorf("a claim refused by a full disk answers %v; want an error naming the full disk", err)
	}
	if c, err := a.ledger.Get(failedID); err == nil && c.State == ledger.StateCommitted {
		t.Fatalf("the failed claim %s is committed", failedID)
	}
	// Whatever the failure left (a reservation whose abort could not be
	// written either), its lease ends it.
	clock.Advance(2 * time.Duration(a.cfg.ReservationLease))
	a.Sweep(ctx)
	checkBound(t, a, m.Kernel, false)

	// Room again: the next sweep writes the expiry and frees the GPUs.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	a.Sweep(ctx)
	checkBound(t, a, m.Kernel, true)
	if _, err := a.Claim(ctx, failedID, api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}}); err != nil {
		t.Fatalf("claim once the disk has room: %v", err)
	}
}

// checkBound checks that every GPU on vfio-pci is held by a live claim; with
// strict, also that no expired reservation is left in the ledger.
func checkBound(t *testing.T, a *Agent, k *fakekernel.Kernel, strict bool) {
	t.Helper()
	now := a.clk.Now()
	held := map[string]bool{}
	for _, c := range a.ledger.List() {
		if strict && !c.Live(now) {
			t.Errorf("expired reservation %s still in the ledger", c.ID)
		}
		if c.Live(now) {
			for _, g := range c.GPUs {
				held[g] = true
			}
		}
	}
	for _, s := range a.ledger.GPUStates(now) {
		d := driverOf(t, k, s.GPU.Address)
		if d == vfio.DriverVFIO && !held[s.GPU.Address] && strict {
			t.Errorf("GPU %s is on vfio-pci but no live claim holds it", s.GPU.Address)
		}
	}
}

// TestCommitOnFullDiskLeavesNoClaim is the owner's side of a disk that
// fills between reserve and commit: the commit fails naming the ledger and
// the cause, nothing is committed, and the GPUs bound for the reservation
// go back to the idle driver when it is aborted or its lease runs out.
func TestCommitOnFullDiskLeavesNoClaim(t *testing.T) {
	dir := t.TempDir()
	disk := testdisk.Mount(t, 1<<20)
	cfg := testConfig(t, dir)
	cfg.DataDir = filepath.Join(disk, "data")
	m := machine(t, "dgx-h100", dir)
	clock := &testClock{now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	a := startAgent(t, cfg, m, clock)
	defer a.Close()
	ctx := context.Background()
	labels := map[string]string{}
	for i := range ledger.MaxLabels {
		labels[fmt.Sprintf("k%02d", i)] = strings.Repeat("v", ledger.MaxLabelValueLen)
	}
	r, err := a.Reserve(ctx, "vm-1", api.ReserveRequest{Items: []api.Item{{Model: "NVIDIA H100 80GB", Count: 2}}, Labels: labels, Coordinator: "c"})
	if err != nil {
		t.Fatal(err)
	}
	filler := testdisk.Fill(t, disk)
	rev := a.ledger.Revision()
	// The committed record is larger than the reserved one and bbolt
	// writes it to new pages: this commit needs space the disk lacks.
	_, err = a.Commit(ctx, "vm-1")
	if err == nil {
		t.Skip("the commit found room on the full disk (bbolt reused pages); nothing to test")
	}
	for _, s := range []string{cfg.LedgerPath(), "no space left on device", "not acknowledged"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("commit error %q lacks %q", err, s)
		}
	}
	if a.ledger.Revision() != rev {
		t.Errorf("a failed commit moved the revision %d → %d", rev, a.ledger.Revision())
	}
	if c, err := a.Lookup(ctx, "vm-1"); err != nil || c.State != api.StateReserved {
		t.Fatalf("after a failed commit vm-1 = %+v, %v; want still a reservation", c, err)
	}
	if _, err := a.Abort(ctx, "vm-1"); err != nil {
		// The delete found no room either: the lease ends the reservation.
		t.Logf("abort on a full disk: %v", err)
		clock.Advance(2 * time.Duration(a.cfg.ReservationLease))
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		a.Sweep(ctx)
	}
	for _, g := range r.GPUs {
		if d := driverOf(t, m.Kernel, g.PCIAddress); d != vfio.DriverNVIDIA {
			t.Errorf("GPU %s of the failed claim on %q, want the idle driver nvidia", g.PCIAddress, d)
		}
	}
	if _, err := a.Lookup(ctx, "vm-1"); apiErr(t, err).Code != api.CodeNotFound {
		t.Errorf("vm-1 still there: %v", err)
	}
	checkBound(t, a, m.Kernel, true)
}
