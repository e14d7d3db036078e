package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/internal/testdisk"
)

// sample is the value of metric name with labels in reg, and whether the
// series exists.
func sample(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			return value(m), true
		}
	}
	return 0, false
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

// TestStorageWriteTimes: the ledger's durable writes are timed, by
// operation, where an operator looks for a slow disk
// (gpuherd_storage_write_duration_seconds); a reservation writes nothing.
func TestStorageWriteTimes(t *testing.T) {
	dir := t.TempDir()
	a := startAgent(t, testConfig(t, dir), machine(t, "dgx-h100", dir), nil)
	defer a.Close()
	runAgent(t, a)
	name, labels := "gpuherd_storage_write_duration_seconds", map[string]string{"store": storeLedger, "op": "write"}
	before, _ := sample(t, a.metrics.Registry(), name, labels)
	ctx := context.Background()
	if _, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Release(ctx, "vm-1"); err != nil {
		t.Fatal(err)
	}
	if n, ok := sample(t, a.metrics.Registry(), name, labels); !ok || n-before != 2 {
		t.Errorf("%s{store=ledger,op=write} counted %v writes for a claim and its release (%v), want 2: the commit and the release", name, n-before, ok)
	}
}

// checkStorage asserts what every place an operator looks says of the
// ledger store: failing (with cause), or not.
func checkStorage(t *testing.T, a *Agent, when string, failing bool, cause string) {
	t.Helper()
	reg := a.metrics.Registry()
	v, ok := sample(t, reg, "gpuherd_storage_failing", map[string]string{"store": storeLedger})
	st, _ := a.Status(context.Background())
	ready := a.readiness()
	if !failing {
		if !ok || v != 0 || len(st.Storage) != 0 || ready != nil {
			t.Errorf("%s: failing gauge %v (%v), status storage %+v, readiness %v; want 0, none, ready", when, v, ok, st.Storage, ready)
		}
		return
	}
	if !ok || v != 1 {
		t.Errorf("%s: gpuherd_storage_failing{store=ledger} = %v (%v), want 1", when, v, ok)
	}
	if len(st.Storage) != 1 || st.Storage[0].Store != storeLedger || st.Storage[0].Cause != cause || st.Storage[0].Action == "" || st.Storage[0].Since.IsZero() {
		t.Errorf("%s: status storage %+v; want the ledger failing with %q and what to do", when, st.Storage, cause)
	}
	if ready == nil || !strings.Contains(ready.Error(), "ledger") || !strings.Contains(ready.Error(), cause) {
		t.Errorf("%s: readiness %v; want the ledger named with %q", when, ready, cause)
	}
}

// TestStorageFailureIsReported: a data disk that fills up under a running
// agent shows in the metrics (a counter of
// failed writes by store and operation, a gauge of the store failing
// now), in /readyz and in gpuherd status, with the cause and what to do;
// and clears once a write succeeds again.
func TestStorageFailureIsReported(t *testing.T) {
	dir := t.TempDir()
	disk := testdisk.Mount(t, 1<<20)
	cfg := testConfig(t, dir)
	cfg.DataDir = filepath.Join(disk, "data")
	a := startAgent(t, cfg, machine(t, "dgx-h100", dir), nil)
	defer a.Close()
	runAgent(t, a)
	ctx := context.Background()
	checkStorage(t, a, "before the disk fills", false, "")

	filler := testdisk.Fill(t, disk)
	_, err := claimUntilDiskFull(t, a, map[string]string{"k": strings.Repeat("v", 200)})
	// The refusal names the disk: "not available" would send the
	// operator to look for a full server.
	if api.IsCode(err, api.CodeNotAvailable) || !strings.Contains(err.Error(), "no space left on device") {
		t.Errorf("a claim on a full disk answered %v; want the disk named, not \"not available\"", err)
	}
	checkStorage(t, a, "disk full", true, "no space left on device")
	if n, _ := sample(t, a.metrics.Registry(), "gpuherd_storage_errors_total", map[string]string{"store": storeLedger, "op": "write"}); n < 1 {
		t.Errorf("gpuherd_storage_errors_total{store=ledger,op=write} = %v, want at least 1", n)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Claim(ctx, "vm-again", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}}); err != nil {
		t.Fatal(err)
	}
	checkStorage(t, a, "space freed, a claim written", false, "")
}

// TestStorageCauses: each class of storage error gets its words and its
// advice, through any wrapping.
func TestStorageCauses(t *testing.T) {
	for _, tt := range []struct {
		err   error
		cause string
		act   string
	}{
		{fmt.Errorf("ledger x: %w", &fs.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}), "no space left on device", "free space"},
		{fmt.Errorf("wal: %w", syscall.EDQUOT), "no space left on device", "free space"},
		{&fs.PathError{Op: "open", Path: "x", Err: syscall.EROFS}, "read-only file system", "read-only"},
		{fmt.Errorf("sync: %w", syscall.EIO), "I/O error", "replace the disk"},
		{&fs.PathError{Op: "open", Path: "x", Err: syscall.EACCES}, "permission denied", "owner and mode"},
		{errors.New("something else"), "something else", "log"},
	} {
		if c, a := storageCause(tt.err), storageAction(tt.err); c != tt.cause || !strings.Contains(a, tt.act) {
			t.Errorf("%v: cause %q, action %q; want %q and advice about %q", tt.err, c, a, tt.cause, tt.act)
		}
	}
}

// claimUntilDiskFull claims and releases on a with labels until a claim
// fails, and returns its ID and error; the test fails when none does.
// The ledger's journal is preallocated, so claims go on for a while on a
// full disk: until the released claims the ledger remembers make a
// checkpoint grow the ledger file, which fails, and the journal then has
// to grow past its preallocation. A release that fails first leaves its
// claim; the next claim fails too.
func claimUntilDiskFull(t *testing.T, a *Agent, labels map[string]string) (string, error) {
	t.Helper()
	ctx := context.Background()
	for i := range 2000 {
		id := fmt.Sprintf("vm-%d", i)
		if _, err := a.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}, Labels: labels}); err != nil {
			return id, err
		}
		_, _ = a.Release(ctx, id)
	}
	t.Fatal("no claim failed on a full disk")
	return "", nil
}
