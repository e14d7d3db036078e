package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/vfio"
)

// testClock is a clock the test moves by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func testConfig(t *testing.T, dir string) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.NodeName = "test-node"
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.Socket = filepath.Join(dir, "api.sock")
	cfg.IdleDriver = "nvidia"
	return cfg
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// machine boots a simulated server whose kernel the test can also reach.
func machine(t *testing.T, profile, dir string) *sim.Machine {
	t.Helper()
	p, err := sim.Load(profile)
	if err != nil {
		t.Fatal(err)
	}
	m, err := sim.Start(p, filepath.Join(dir, "data"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func startAgent(t *testing.T, cfg Config, m *sim.Machine, clock *testClock) *Agent {
	t.Helper()
	opts := []Option{WithSysfs(m.Kernel, m.NVML)}
	if clock != nil {
		opts = append(opts, WithClock(clock.Now))
	}
	a, err := New(context.Background(), cfg, quietLog(), opts...)
	if err != nil {
		t.Fatalf("starting the agent: %v", err)
	}
	return a
}

func driverOf(t *testing.T, fs vfio.FS, addr string) string {
	t.Helper()
	d, err := vfio.New(fs).Device(addr)
	if err != nil {
		t.Fatal(err)
	}
	return d.Driver
}

func apiErr(t *testing.T, err error) *api.Error {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) {
		t.Fatalf("want an *api.Error, got %T: %v", err, err)
	}
	return ae
}

func TestClaimSurvivesRestartAndReleaseReturnsToIdleDriver(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	m := machine(t, "dgx-h100", dir)
	ctx := context.Background()

	a := startAgent(t, cfg, m, nil)
	st, err := a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.GPUs) != 8 {
		t.Fatalf("status lists %d GPUs, want 8", len(st.GPUs))
	}
	for _, g := range st.GPUs {
		if g.Model != "NVIDIA H100 80GB" || g.Driver != "nvidia" || g.State != api.StateFree || g.MemoryBytes != 80<<30 {
			t.Errorf("GPU %+v: want a free NVIDIA H100 80GB of 80 GiB on nvidia", g)
		}
	}

	c, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "h100-80gb", Count: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if c.State != api.StateClaimed || len(c.GPUs) != 2 {
		t.Fatalf("claim = %+v, want 2 claimed GPUs", c)
	}
	numa := map[int]bool{}
	for _, g := range c.GPUs {
		if got := driverOf(t, m.Kernel, g.PCIAddress); got != vfio.DriverVFIO {
			t.Errorf("%s on %q after claim, want vfio-pci", g.PCIAddress, got)
		}
		if g.VFIODevice != fmt.Sprintf("/dev/vfio/%d", g.IOMMUGroup) || !m.Kernel.Exists(g.VFIODevice) {
			t.Errorf("%s: vfio device %q missing", g.PCIAddress, g.VFIODevice)
		}
		for _, s := range st.GPUs {
			if s.PCIAddress == g.PCIAddress {
				numa[s.NUMANode] = true
			}
		}
	}
	if len(numa) != 1 {
		t.Errorf("claim spans NUMA nodes %v; two GPUs fit on one", numa)
	}

	_, err = a.Claim(ctx, "vm-2", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}})
	if e := apiErr(t, err); e.Code != api.CodeNotAvailable || e.Message != "The following GPUs are not available: 1x NVIDIA L40S" {
		t.Fatalf("claim of an L40S on a DGX H100: %+v", e)
	}

	// Restart: the claim is in the ledger and its GPUs stay on vfio-pci.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a = startAgent(t, cfg, m, nil)
	defer a.Close()
	got, err := a.Get(ctx, "vm-1")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != api.StateClaimed || !slices.Equal(gpuAddrs(got), gpuAddrs(c)) {
		t.Fatalf("after restart vm-1 = %+v, want %v claimed", got, gpuAddrs(c))
	}
	for _, addr := range gpuAddrs(c) {
		if d := driverOf(t, m.Kernel, addr); d != vfio.DriverVFIO {
			t.Errorf("%s on %q after restart", addr, d)
		}
	}

	if _, err := a.Release(ctx, "vm-1"); err != nil {
		t.Fatal(err)
	}
	for _, addr := range gpuAddrs(c) {
		if d := driverOf(t, m.Kernel, addr); d != vfio.DriverNVIDIA {
			t.Errorf("%s on %q after release, want nvidia (the idle driver)", addr, d)
		}
	}
	if _, err := a.Release(ctx, "vm-1"); apiErr(t, err).Code != api.CodeNotFound {
		t.Errorf("second release: %v, want not_found", err)
	}
}

func gpuAddrs(c api.Claim) []string {
	var out []string
	for _, g := range c.GPUs {
		out = append(out, g.PCIAddress)
	}
	slices.Sort(out)
	return out
}

func TestReconcileRebindsClaimedAndDropsExpired(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	m := machine(t, "dgx-h100", dir)
	clock := &testClock{now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	ctx := context.Background()

	a := startAgent(t, cfg, m, clock)
	c, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	// A reservation nobody commits (a coordinator that died).
	r, err := a.Reserve(ctx, "vm-orphan", api.ReserveRequest{Items: []api.Item{{Model: "NVIDIA H100 80GB", Count: 2}}, Coordinator: "coordinator-x"})
	if err != nil {
		t.Fatal(err)
	}
	a.Close()

	// While the agent is down, someone puts the claimed GPU back on nvidia.
	addr := c.GPUs[0].PCIAddress
	if _, err := vfio.NewBinder(vfio.New(m.Kernel)).Release(ctx, addr, vfio.IdleNVIDIA); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour)

	a = startAgent(t, cfg, m, clock)
	defer a.Close()
	if d := driverOf(t, m.Kernel, addr); d != vfio.DriverVFIO {
		t.Errorf("claimed GPU %s on %q after reconcile, want vfio-pci", addr, d)
	}
	if _, err := a.Get(ctx, "vm-orphan"); apiErr(t, err).Code != api.CodeNotFound {
		t.Errorf("expired reservation still there: %v", err)
	}
	for _, g := range r.GPUs {
		if d := driverOf(t, m.Kernel, g.PCIAddress); d != vfio.DriverNVIDIA {
			t.Errorf("GPU %s of the expired reservation on %q, want the idle driver nvidia", g.PCIAddress, d)
		}
	}
}

func TestStuckUnbindFencesGPUAndClaimMovesOn(t *testing.T) {
	t.Parallel() // waits for four bind deadlines, computing nothing
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	// The deadline must stay far above what a healthy fake-kernel write
	// takes on a loaded machine (200 ms fenced a healthy GPU under -race
	// with other packages' tests running): each held GPU costs one
	// deadline, so this test takes about 4 s.
	cfg.BindTimeout = Duration(time.Second)
	m := machine(t, "dgx-h100", dir)
	ctx := context.Background()
	a := startAgent(t, cfg, m, nil)
	defer a.Close()

	st, _ := a.Status(ctx)
	// Hold every GPU of NUMA node 0: placement tries them first (ties go to
	// the lower node), each unbind hangs past the deadline and fences its
	// GPU, and the claim must end on node 1.
	var held []string
	for _, g := range st.GPUs {
		if g.NUMANode == 0 {
			held = append(held, g.PCIAddress)
			if err := m.Kernel.Hold(g.PCIAddress); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer func() {
		// Let the leaked unbind writes finish before the test's directory goes.
		for _, h := range held {
			m.Kernel.Unhold(h)
			if err := a.host.WaitUnstuck(ctx, h); err != nil {
				t.Error(err)
			}
		}
	}()

	c, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}})
	if err != nil {
		t.Fatalf("claim with a stuck GPU: %v", err)
	}
	if slices.Contains(held, c.GPUs[0].PCIAddress) {
		t.Fatalf("claim got held GPU %s", c.GPUs[0].PCIAddress)
	}
	st, _ = a.Status(ctx)
	unhealthy := 0
	for _, g := range st.GPUs {
		if g.State == api.StateUnhealthy {
			unhealthy++
			if !slices.Contains(held, g.PCIAddress) || g.Health == "" {
				t.Errorf("unexpected unhealthy GPU %+v", g)
			}
		}
	}
	if unhealthy == 0 {
		t.Fatal("the GPU whose unbind hung is not reported unhealthy")
	}
}

func TestBadRequestsChangeNothing(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	m := machine(t, "dgx-h100", dir)
	a := startAgent(t, cfg, m, nil)
	defer a.Close()
	ctx := context.Background()
	bigLabels := map[string]string{}
	for i := range 40 {
		bigLabels[fmt.Sprintf("k%d", i)] = "v"
	}
	cases := []struct {
		name  string
		id    string
		req   api.ClaimRequest
		code  string
		field string
	}{
		{"no gpus", "vm-1", api.ClaimRequest{}, api.CodeInvalid, "gpus"},
		{"count 0", "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 0}}}, api.CodeInvalid, "gpus[0].count"},
		{"count above max", "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 17}}}, api.CodeInvalid, "gpus[0].count"},
		{"unknown model", "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "V100", Count: 1}}}, api.CodeUnknownModel, "gpus[0].model"},
		{"ambiguous model", "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "h100", Count: 1}}}, api.CodeUnknownModel, "gpus[0].model"},
		{"bad id", "vm/../1", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}}, api.CodeInvalid, "id"},
		{"empty id", "", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}}, api.CodeInvalid, "id"},
		{"too many labels", "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}, Labels: bigLabels}, api.CodeInvalid, "labels"},
	}
	before := a.ledger.Revision()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.Claim(ctx, tc.id, tc.req)
			e := apiErr(t, err)
			if e.Code != tc.code || e.HTTPStatus() != http.StatusBadRequest || e.Field != tc.field {
				t.Errorf("got code=%s status=%d field=%q (%s), want %s 400 field %q", e.Code, e.HTTPStatus(), e.Field, e.Message, tc.code, tc.field)
			}
		})
	}
	if after := a.ledger.Revision(); after != before {
		t.Errorf("ledger revision moved from %d to %d on bad input", before, after)
	}
}

func TestIdempotentClaimAndConflict(t *testing.T) {
	dir := t.TempDir()
	m := machine(t, "a100-pcie-4", dir)
	a := startAgent(t, testConfig(t, dir), m, nil)
	defer a.Close()
	ctx := context.Background()
	req := api.ClaimRequest{GPUs: []api.Item{{Model: "A100 80GB", Count: 2}}}
	c1, err := a.Claim(ctx, "vm-1", req)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := a.Claim(ctx, "vm-1", req)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(gpuAddrs(c1), gpuAddrs(c2)) {
		t.Errorf("retry got %v, first %v", gpuAddrs(c2), gpuAddrs(c1))
	}
	_, err = a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "A100 80GB", Count: 1}}})
	if e := apiErr(t, err); e.Code != api.CodeConflict {
		t.Errorf("same ID, other request: %+v, want conflict", e)
	}
}

func TestConcurrentClaimersNeverShareAGPU(t *testing.T) {
	dir := t.TempDir()
	m := machine(t, "dgx-h100", dir)
	a := startAgent(t, testConfig(t, dir), m, nil)
	defer a.Close()
	ctx := context.Background()
	const claimers = 12
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		owners  = map[string]string{}
		granted int
		refused int
	)
	for i := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("vm-%d", i)
			c, err := a.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if e := apiErr(t, err); e.Code != api.CodeNotAvailable {
					t.Errorf("%s: %v", id, err)
				}
				refused++
				return
			}
			granted++
			for _, g := range c.GPUs {
				if prev, dup := owners[g.PCIAddress]; dup {
					t.Errorf("GPU %s given to %s and %s", g.PCIAddress, prev, id)
				}
				owners[g.PCIAddress] = id
			}
		}()
	}
	wg.Wait()
	if granted != 8 || refused != claimers-8 {
		t.Errorf("granted %d, refused %d; want 8 and %d", granted, refused, claimers-8)
	}
	t.Logf("concurrent claimers: %d granted, %d not available, 0 GPUs shared", granted, refused)
}

func TestRestartDropsEveryReservation(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	m := machine(t, "a100-pcie-4", dir)
	ctx := context.Background()
	a := startAgent(t, cfg, m, nil)
	r, err := a.Reserve(ctx, "vm-inflight", api.ReserveRequest{Items: []api.Item{{Model: "NVIDIA A100 80GB", Count: 1}}, Coordinator: "c"})
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	// Restarted well within the lease: the reservation still goes.
	a = startAgent(t, cfg, m, nil)
	defer a.Close()
	if _, err := a.Lookup(ctx, "vm-inflight"); apiErr(t, err).Code != api.CodeNotFound {
		t.Fatalf("a reservation survived the restart: %v", err)
	}
	if _, err := a.Commit(ctx, "vm-inflight"); err == nil {
		t.Fatal("its coordinator could still commit it after the restart")
	}
	if d := driverOf(t, m.Kernel, r.GPUs[0].PCIAddress); d != vfio.DriverNVIDIA {
		t.Errorf("its GPU is on %q after the restart, want the idle driver", d)
	}
}

// TestCommitLeavesEveryGPUOnVFIO: a commit never makes a claim whose GPUs are
// not ready for its VM, even when the reservation's own bind did not finish
// (a retry through another coordinator adopting it mid-bind).
func TestCommitLeavesEveryGPUOnVFIO(t *testing.T) {
	dir := t.TempDir()
	m := machine(t, "a100-pcie-4", dir)
	a := startAgent(t, testConfig(t, dir), m, nil)
	defer a.Close()
	ctx := context.Background()
	// Play an unfinished bind: the reservation is in the ledger, its
	// binding has not run to the end, and one of its GPUs is on the host
	// driver.
	r, err := a.ledger.Reserve("vm-1", ledger.Request{Items: []ledger.Item{{Model: "NVIDIA A100 80GB", Count: 2}}}, "c", a.clk.Now(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	addr := r.GPUs[1]
	if _, err := vfio.NewBinder(vfio.New(m.Kernel)).Release(ctx, addr, vfio.IdleNVIDIA); err != nil {
		t.Fatal(err)
	}
	c, err := a.Commit(ctx, "vm-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range c.GPUs {
		if d := driverOf(t, m.Kernel, g.PCIAddress); d != vfio.DriverVFIO {
			t.Errorf("committed claim's GPU %s is on %q", g.PCIAddress, d)
		}
	}
}

// onDriverRead is a sysfs that calls a function each time the driver link
// of one device is read, before answering: a release that lands between a
// status's ledger read and its driver read.
type onDriverRead struct {
	vfio.FS
	link string
	fn   atomic.Pointer[func()]
}

func (r *onDriverRead) Readlink(name string) (string, error) {
	if fn := r.fn.Load(); fn != nil && name == r.link {
		(*fn)()
	}
	return r.FS.Readlink(name)
}

// TestStatusNeverShowsAClaimedGPUOffVFIO: a claim released (and its GPU
// returned to the idle driver) while a status is being read shows either
// claimed on vfio-pci or free, never claimed on the idle driver: the monitor
// of the fault runs read that as a claimed GPU its VM could not use.
func TestStatusNeverShowsAClaimedGPUOffVFIO(t *testing.T) {
	dir := t.TempDir()
	m := machine(t, "a100-pcie-4", dir)
	fs := &onDriverRead{FS: m.Kernel}
	a, err := New(context.Background(), testConfig(t, dir), quietLog(), WithSysfs(fs, m.NVML))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()
	status := func() ([]api.GPU, error) { st, err := a.Status(ctx); return st.GPUs, err }
	for _, tc := range []struct {
		name string
		// busy: the ledger changes at every driver read as well, so that
		// only the device locks give a consistent picture.
		busy bool
		read func(addr string) ([]api.GPU, error)
	}{
		{"status", false, func(string) ([]api.GPU, error) { return status() }},
		{"one GPU", false, func(addr string) ([]api.GPU, error) { g, err := a.Drain(ctx, addr, ""); return []api.GPU{g}, err }},
		{"busy ledger", true, func(string) ([]api.GPU, error) { return status() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "NVIDIA A100 80GB", Count: 1}}})
			if err != nil {
				t.Fatal(err)
			}
			addr := c.GPUs[0].PCIAddress
			other := ""
			for _, o := range a.host.Addresses() {
				if o != addr {
					other = o
				}
			}
			fs.link = "bus/pci/devices/" + addr + "/driver"
			released, reads, locked := false, 0, false
			hook := func() {
				reads++
				if tc.busy {
					if reads <= 3 {
						if err := a.ledger.Drain(other, fmt.Sprint(reads), a.clk.Now()); err != nil {
							t.Error(err)
						}
						return
					}
					locked = a.host.DeviceLockUsers(addr) > 0
					if err := a.ledger.Undrain(other); err != nil {
						t.Error(err)
					}
				}
				if !released {
					released = true // before: the release reads the link too
					if _, err := a.ledger.Release(c.ID, a.clk.Now()); err != nil {
						t.Error(err)
					}
					if tc.busy {
						return // the device locks are held: the unbind waits
					}
					unlock := a.host.LockGPUs(addr)
					a.host.ToIdleLocked(ctx, "test release", []string{addr}, "")
					unlock()
				}
			}
			fs.fn.Store(&hook)
			gpus, err := tc.read(addr)
			fs.fn.Store(nil)
			if err != nil {
				t.Fatal(err)
			}
			if !released {
				t.Fatal("the release did not run during the read")
			}
			if tc.busy && !locked {
				t.Errorf("the driver read after %d changes of the ledger was not under the device lock", reads-1)
			}
			for _, g := range gpus {
				if g.PCIAddress == addr && g.State == api.StateClaimed && g.Driver != vfio.DriverVFIO {
					t.Errorf("%s shows %s claimed by %s on %q", tc.name, addr, g.Claim, g.Driver)
				}
			}
			unlock := a.host.LockGPUs(addr)
			a.host.ToIdleLocked(ctx, "test", []string{addr}, "")
			unlock()
			if tc.name == "one GPU" {
				if _, err := a.Undrain(ctx, addr); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestResizeBindsBeforeTheLedgerHandsOver: a GPU a resize adds is never
// shown claimed while still on the idle driver; the status read during its
// bind shows it free.
func TestResizeBindsBeforeTheLedgerHandsOver(t *testing.T) {
	dir := t.TempDir()
	m := machine(t, "a100-pcie-4", dir)
	fs := &onDriverRead{FS: m.Kernel}
	a, err := New(context.Background(), testConfig(t, dir), quietLog(), WithSysfs(fs, m.NVML))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()
	if _, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "NVIDIA A100 80GB", Count: 1}}}); err != nil {
		t.Fatal(err)
	}
	two := ledger.Request{Items: []ledger.Item{{Model: "NVIDIA A100 80GB", Count: 2}}}
	plan, err := a.ledger.PlanResize("vm-1", two, a.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	before, _ := a.ledger.Get("vm-1")
	var added string
	for _, g := range plan.GPUs {
		if !slices.Contains(before.GPUs, g) {
			added = g
		}
	}
	fs.link = "bus/pci/devices/" + added + "/driver"
	seen, inHook := 0, false
	hook := func() {
		if inHook {
			return // the status reads the link too
		}
		inHook = true
		defer func() { inHook = false }()
		st, err := a.Status(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		for _, g := range st.GPUs {
			if g.PCIAddress == added {
				seen++
				if g.State == api.StateClaimed && g.Driver != vfio.DriverVFIO {
					t.Errorf("during the resize, %s shows claimed by %s on %q", added, g.Claim, g.Driver)
				}
			}
		}
	}
	fs.fn.Store(&hook)
	c, err := a.Resize(ctx, "vm-1", api.ResizeRequest{GPUs: []api.Item{{Model: "NVIDIA A100 80GB", Count: 2}}})
	fs.fn.Store(nil)
	if err != nil {
		t.Fatal(err)
	}
	if seen == 0 {
		t.Fatal("no status was read during the resize's bind")
	}
	if !slices.Contains(gpuAddrs(c), added) {
		t.Fatalf("the resize picked %v, not the planned %s", gpuAddrs(c), added)
	}
	if d := driverOf(t, m.Kernel, added); d != vfio.DriverVFIO {
		t.Errorf("the added GPU is on %q", d)
	}
}

// TestAbortReservationNeverReleasesAClaim: the owner's side of the abort a
// coordinator sends after a reserve it could not confirm. A reservation is
// dropped and its GPUs go back to the idle driver; a claim committed under
// the same ID (a concurrent coordinator's) stays, on vfio-pci.
func TestAbortReservationNeverReleasesAClaim(t *testing.T) {
	dir := t.TempDir()
	m := machine(t, "a100-pcie-4", dir)
	a := startAgent(t, testConfig(t, dir), m, nil)
	defer a.Close()
	ctx := context.Background()
	rr := api.ReserveRequest{Items: []api.Item{{Model: "NVIDIA A100 80GB", Count: 1}}, Coordinator: "c1"}
	r, err := a.Reserve(ctx, "vm-1", rr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.AbortReservation(ctx, "vm-1"); err != nil {
		t.Fatalf("aborting a reservation: %v", err)
	}
	if d := driverOf(t, m.Kernel, r.GPUs[0].PCIAddress); d != vfio.DriverNVIDIA {
		t.Errorf("the aborted reservation's GPU is on %q, want the idle driver", d)
	}
	if _, err := a.Reserve(ctx, "vm-1", rr); err != nil {
		t.Fatal(err)
	}
	c, err := a.Commit(ctx, "vm-1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.AbortReservation(ctx, "vm-1")
	if e := apiErr(t, err); e.Code != api.CodeConflict || !strings.Contains(e.Message, "committed") {
		t.Fatalf("aborting a committed claim as a reservation: %v, want a conflict saying it is committed", err)
	}
	if got, err := a.Lookup(ctx, "vm-1"); err != nil || got.State != api.StateClaimed {
		t.Fatalf("the claim after the refused abort: %+v, %v", got, err)
	}
	if d := driverOf(t, m.Kernel, c.GPUs[0].PCIAddress); d != vfio.DriverVFIO {
		t.Errorf("the claim's GPU is on %q after the refused abort", d)
	}
}
