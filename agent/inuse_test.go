package agent

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// qemu is the simulated QEMU of libvirt domain name.
func qemu(pid int, name string) fakekernel.Process {
	return fakekernel.Process{PID: pid, Comm: "qemu-system-x86", Cmdline: []string{
		"/usr/bin/qemu-system-x86_64", "-name", "guest=" + name + ",debug-threads=on", "-S", "-machine", "q35"}}
}

// startVM claims one GPU as id and opens its group as the VM's QEMU does.
func startVM(t *testing.T, a *Agent, m *sim.Machine, id string, pid int) (api.ClaimGPU, func()) {
	t.Helper()
	c, err := a.Claim(context.Background(), id, api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	g := c.GPUs[0]
	stop, err := m.Kernel.OpenGroup(g.IOMMUGroup, qemu(pid, id))
	if err != nil {
		t.Fatalf("the VM's QEMU opening %s: %v", g.VFIODevice, err)
	}
	t.Cleanup(stop)
	return g, stop
}

func gpuStatus(t *testing.T, a *Agent, addr string) api.GPU {
	t.Helper()
	st, err := a.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range st.GPUs {
		if g.PCIAddress == addr {
			return g
		}
	}
	t.Fatalf("%s not in status", addr)
	return api.GPU{}
}

// counter sums the samples of the counter name in the agent's metrics.
func counter(t *testing.T, a *Agent, name string) float64 {
	t.Helper()
	mfs, err := a.metrics.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += counterOf(m)
			}
		}
	}
	return sum
}

func counterOf(m *dto.Metric) float64 { return m.GetCounter().GetValue() }

// gauge is the value of gauge name for the GPU at addr (and state, when
// given); -1 when there is no such sample.
func gauge(t *testing.T, a *Agent, name, addr, state string) float64 {
	t.Helper()
	mfs, err := a.metrics.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["pci_address"] == addr && (state == "" || labels["state"] == state) {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

func freeGPUs(t *testing.T, a *Agent) int {
	t.Helper()
	av, err := a.Availability(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range av.Models {
		n += m.Free
	}
	return n
}

func TestReleaseRefusedWhileTheVMHoldsTheGroup(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	m := machine(t, "dgx-h100", dir)
	ctx := context.Background()
	a := startAgent(t, cfg, m, nil)
	defer a.Close()

	g, stop := startVM(t, a, m, "vm-b", 4242)
	st := gpuStatus(t, a, g.PCIAddress)
	if st.InUseBy == nil || *st.InUseBy != (api.InUse{PID: 4242, Comm: "qemu-system-x86", Domain: "vm-b"}) || st.State != api.StateClaimed {
		t.Fatalf("status of the VM's GPU = %+v (in_use_by %+v), want claimed and in use by pid 4242, domain vm-b", st, st.InUseBy)
	}

	_, err := a.Release(ctx, "vm-b")
	e := apiErr(t, err)
	want := "claim vm-b: GPU " + g.PCIAddress + " is in use by pid 4242 (qemu-system-x86, domain vm-b); stop the VM first, or release with --force"
	if e.HTTPStatus() != 409 || e.Code != api.CodeInUse || e.Message != want {
		t.Fatalf("release while the VM runs = %d %s %q, want 409 in_use %q", e.HTTPStatus(), e.Code, e.Message, want)
	}
	if c, err := a.Get(ctx, "vm-b"); err != nil || c.State != api.StateClaimed {
		t.Fatalf("after the refused release: %+v, %v; want the claim still held", c, err)
	}
	if d := driverOf(t, m.Kernel, g.PCIAddress); d != vfio.DriverVFIO {
		t.Fatalf("GPU on %q after the refused release, want vfio-pci", d)
	}
	if n := counter(t, a, "gpuherd_releases_refused_in_use_total"); n != 1 {
		t.Errorf("gpuherd_releases_refused_in_use_total = %v, want 1", n)
	}

	stop() // the VM stops
	if _, err := a.Release(ctx, "vm-b"); err != nil {
		t.Fatalf("release after the VM stopped: %v", err)
	}
	if d := driverOf(t, m.Kernel, g.PCIAddress); d != vfio.DriverNVIDIA {
		t.Errorf("GPU on %q after release, want nvidia (the idle driver)", d)
	}
	if st := gpuStatus(t, a, g.PCIAddress); st.InUseBy != nil || st.State != api.StateFree {
		t.Errorf("after release: %+v, want free and not in use", st)
	}
	if n := m.Kernel.UnbindsWhileOpen(); n != 0 {
		t.Errorf("%d unbinds under an open group", n)
	}
}

// A forced release frees the claim at once, but the GPU waits, offered to
// nobody and still on vfio-pci, until the VM lets go; then it goes to the
// idle driver.
func TestForcedReleaseReturnsTheGPUOnlyOnceTheVMLetsGo(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	m := machine(t, "dgx-h100", dir)
	ctx := context.Background()
	a := startAgent(t, cfg, m, nil)
	defer a.Close()

	g, stop := startVM(t, a, m, "vm-b", 4242)
	if _, err := a.Release(api.WithForce(ctx), "vm-b"); err != nil {
		t.Fatalf("forced release: %v", err)
	}
	if _, err := a.Get(ctx, "vm-b"); apiErr(t, err).Code != api.CodeNotFound {
		t.Fatalf("claim after a forced release: %v, want not found", err)
	}
	st := gpuStatus(t, a, g.PCIAddress)
	if st.State != api.StateReturning || st.Driver != vfio.DriverVFIO || st.InUseBy == nil || st.InUseBy.PID != 4242 {
		t.Fatalf("GPU after a forced release = %+v, want returning, on vfio-pci, in use by 4242", st)
	}
	if free := freeGPUs(t, a); free != 7 {
		t.Errorf("%d GPUs free, want 7: the returning GPU is offered to nobody", free)
	}
	if _, err := a.Claim(ctx, "vm-c", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 8}}}); apiErr(t, err).Code != api.CodeNotAvailable {
		t.Errorf("claim of all 8 GPUs while one is returning: %v, want not available", err)
	}

	if v := gauge(t, a, "gpuherd_gpu_state", g.PCIAddress, "returning"); v != 1 {
		t.Errorf("gpuherd_gpu_state{state=returning} = %v, want 1", v)
	}
	if v := gauge(t, a, "gpuherd_gpu_healthy", g.PCIAddress, ""); v != 1 {
		t.Errorf("gpuherd_gpu_healthy of the returning GPU = %v, want 1 (kept back, not sick)", v)
	}

	a.host.CheckReturning(ctx) // still open: stays
	if st := gpuStatus(t, a, g.PCIAddress); st.State != api.StateReturning || st.Driver != vfio.DriverVFIO {
		t.Fatalf("still open: %+v, want returning on vfio-pci", st)
	}

	stop()
	a.host.CheckReturning(ctx)
	st = gpuStatus(t, a, g.PCIAddress)
	if st.State != api.StateFree || st.Driver != vfio.DriverNVIDIA || st.InUseBy != nil {
		t.Fatalf("after the VM let go: %+v, want free on nvidia", st)
	}
	if free := freeGPUs(t, a); free != 8 {
		t.Errorf("%d GPUs free, want 8", free)
	}
	if n := m.Kernel.UnbindsWhileOpen(); n != 0 {
		t.Errorf("%d unbinds under an open group", n)
	}
}

// A VM running without a claim when the agent starts (started before
// gpuherd, or around it) keeps its GPU: reconcile adopts it as a claim and
// never unbinds it, though the idle driver is nvidia.
func TestReconcileAdoptsARunningVMAndNeverUnbindsIt(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	m := machine(t, "dgx-h100", dir)
	ctx := context.Background()
	a := startAgent(t, cfg, m, nil)
	addrs := a.host.Addresses()[:2]
	a.Close()

	// Outside gpuherd: a VM gets two GPUs (libvirt managed='yes').
	b := vfio.NewBinder(vfio.New(m.Kernel))
	var groups []int
	for _, addr := range addrs {
		if _, err := b.Bind(ctx, addr); err != nil {
			t.Fatal(err)
		}
		d, err := vfio.New(m.Kernel).Device(addr)
		if err != nil {
			t.Fatal(err)
		}
		groups = append(groups, d.IOMMUGroup)
	}
	for _, g := range groups {
		stop, err := m.Kernel.OpenGroup(g, qemu(777, "tenant-vm"))
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
	}

	a = startAgent(t, cfg, m, nil)
	defer a.Close()
	c, err := a.Get(ctx, "adopted-test-node-tenant-vm")
	if err != nil {
		t.Fatalf("the running VM's claim: %v", err)
	}
	if c.State != api.StateClaimed || strings.Join(gpuAddrs(c), ",") != strings.Join(addrs, ",") || api.DescribeItems(c.Items) != "2x NVIDIA H100 80GB" {
		t.Fatalf("adopted claim = %+v, want both GPUs of the VM claimed", c)
	}
	for _, addr := range addrs {
		if d := driverOf(t, m.Kernel, addr); d != vfio.DriverVFIO {
			t.Errorf("%s on %q after reconcile, want vfio-pci (the VM runs on it)", addr, d)
		}
		if st := gpuStatus(t, a, addr); st.InUseBy == nil || st.InUseBy.Domain != "tenant-vm" || st.Claim != c.ID {
			t.Errorf("%s: %+v, want claimed by %s and in use by tenant-vm", addr, st, c.ID)
		}
	}
	if n := m.Kernel.UnbindsWhileOpen(); n != 0 {
		t.Errorf("%d unbinds under an open group", n)
	}
	if n := counter(t, a, "gpuherd_claims_adopted_total"); n != 1 {
		t.Errorf("gpuherd_claims_adopted_total = %v, want 1", n)
	}
	if free := freeGPUs(t, a); free != 6 {
		t.Errorf("%d GPUs free, want 6", free)
	}
}

// A GPU rebound behind the ledger (libvirt's managed='yes' re-attaching a
// claimed GPU to nvidia when its VM stops; a free GPU moved by hand) is
// found by the driver check, counted, and put back.
func TestDriverCheckPutsBackAGPUReboundBehindTheLedger(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.IdleDriver = "vfio-pci"
	m := machine(t, "dgx-h100", dir)
	ctx := context.Background()
	a := startAgent(t, cfg, m, nil)
	defer a.Close()

	if n := a.host.CheckDrivers(ctx, nil); n != 0 {
		t.Fatalf("check of an untouched server found %d GPUs off their driver", n)
	}
	c, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	claimed := c.GPUs[0].PCIAddress
	var free string
	for _, addr := range a.host.Addresses() {
		if addr != claimed {
			free = addr
			break
		}
	}
	b := vfio.NewBinder(vfio.New(m.Kernel))
	for _, addr := range []string{claimed, free} {
		if _, err := b.Release(ctx, addr, vfio.IdleNVIDIA); err != nil {
			t.Fatal(err)
		}
		if d := driverOf(t, m.Kernel, addr); d != vfio.DriverNVIDIA {
			t.Fatalf("setup: %s on %q", addr, d)
		}
	}

	if n := a.host.CheckDrivers(ctx, []string{claimed, free, "0000:ff:00.0"}); n != 2 {
		t.Fatalf("driver check found %d GPUs off their driver, want 2", n)
	}
	for _, addr := range []string{claimed, free} {
		if d := driverOf(t, m.Kernel, addr); d != vfio.DriverVFIO {
			t.Errorf("%s on %q after the check, want vfio-pci", addr, d)
		}
	}
	if n := counter(t, a, "gpuherd_driver_changes_unexpected_total"); n != 2 {
		t.Errorf("gpuherd_driver_changes_unexpected_total = %v, want 2", n)
	}
	if st := gpuStatus(t, a, claimed); st.State != api.StateClaimed || st.Health != "" {
		t.Errorf("claimed GPU after the check: %+v", st)
	}
	if n := a.host.CheckDrivers(ctx, nil); n != 0 {
		t.Errorf("a second check found %d", n)
	}
}

// A claimed GPU that cannot be bound back (the host driver holds it) is
// fenced, by the same rule as at start.
func TestDriverCheckFencesAGPUItCannotPutBack(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.BindTimeout = Duration(200 * time.Millisecond)
	m := machine(t, "dgx-h100", dir)
	ctx := context.Background()
	a := startAgent(t, cfg, m, nil)
	defer a.Close()
	c, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	addr := c.GPUs[0].PCIAddress
	if _, err := vfio.NewBinder(vfio.New(m.Kernel)).Release(ctx, addr, vfio.IdleNVIDIA); err != nil {
		t.Fatal(err)
	}
	if err := m.Kernel.Hold(addr); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// Let the leaked unbind write finish before the test's directory goes.
		m.Kernel.Unhold(addr)
		if err := a.host.WaitUnstuck(ctx, addr); err != nil {
			t.Error(err)
		}
	}()
	if n := a.host.CheckDrivers(ctx, []string{addr}); n != 1 {
		t.Fatalf("found %d, want 1", n)
	}
	if h := a.host.Health(addr); !strings.Contains(h, "bind to vfio-pci failed (driver check: claim vm-1)") {
		t.Errorf("health = %q, want fenced by the driver check", h)
	}
}

// Statuses, driver checks and the returning check running while VMs come
// and go and claims are released by force: no data race (go test -race),
// no unbind under an open group, and every GPU back on the idle driver at
// the end.
func TestInUseChecksRunConcurrently(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	m := machine(t, "dgx-h100", dir)
	ctx := context.Background()
	done := make(chan struct{})
	a := startAgent(t, cfg, m, nil)
	defer a.Close()

	var bg sync.WaitGroup
	for _, f := range []func(){
		func() { _, _ = a.Status(ctx) },
		func() { a.host.CheckDrivers(ctx, nil) },
		func() { a.host.CheckReturning(ctx) },
	} {
		bg.Add(1)
		go func() {
			defer bg.Done()
			for {
				select {
				case <-done:
					return
				default:
					f()
				}
			}
		}()
	}
	// Two VMs: each may hold a claimed GPU and one still returning, and
	// one being returned is off the market for a moment; the dgx-h100 has
	// eight.
	var vms sync.WaitGroup
	for i := range 2 {
		vms.Add(1)
		go func() {
			defer vms.Done()
			id := fmt.Sprintf("vm-%d", i)
			for range 5 {
				c, err := a.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}})
				if err != nil {
					t.Error(err)
					return
				}
				stop, err := m.Kernel.OpenGroup(c.GPUs[0].IOMMUGroup, qemu(100+i, id))
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := a.Release(api.WithForce(ctx), id); err != nil {
					t.Error(err)
				}
				stop()
			}
		}()
	}
	vms.Wait()
	close(done)
	bg.Wait()
	a.host.CheckReturning(context.Background())
	if n := m.Kernel.UnbindsWhileOpen(); n != 0 {
		t.Errorf("%d unbinds under an open group", n)
	}
	st, _ := a.Status(context.Background())
	for _, g := range st.GPUs {
		if g.State != api.StateFree || g.Driver != vfio.DriverNVIDIA {
			t.Errorf("%s at the end: %s on %s (%s), want free on nvidia", g.PCIAddress, g.State, g.Driver, g.Health)
		}
	}
}

// A release frees a GPU in the ledger before it marks the GPU kept back
// (both under the GPU's device lock): a reservation made in that window
// waits for the lock and then finds the GPU held open by the released
// VM. It must not take it: a second VM's QEMU would find the group busy
// (TestInUseChecksRunConcurrently once failed so, with EBUSY on open).
func TestReservationNeverTakesAGPUAVMStillHolds(t *testing.T) {
	dir := t.TempDir()
	a := startAgent(t, testConfig(t, dir), machine(t, "dgx-h100", dir), nil)
	defer a.Close()
	ctx := context.Background()
	if _, err := a.Claim(ctx, "fill", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 7}}}); err != nil {
		t.Fatal(err)
	}
	c, err := a.Claim(ctx, "vm-0", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	held := c.GPUs[0].PCIAddress
	// The window: vm-0 released in the ledger, its GPU not yet marked as
	// kept back (what the release does next, under the lock the
	// reservation below then waits for).
	if _, err := a.ledger.Release("vm-0", a.clk.Now()); err != nil {
		t.Fatal(err)
	}
	a.host.KeepBack(held, "release vm-0")

	got, err := a.Reserve(ctx, "vm-1", api.ReserveRequest{Items: []api.Item{{Model: "NVIDIA H100 80GB", Count: 1}}, Coordinator: a.cfg.NodeName})
	if err == nil {
		t.Fatalf("reserved %+v: the GPU a VM still holds open went to another claim", got.GPUs)
	}
	if !strings.Contains(err.Error(), "still holds") {
		t.Errorf("refusal does not say why: %v", err)
	}
	if _, err := a.ledger.Get("vm-1"); err == nil {
		t.Error("the refused reservation was left in the ledger")
	}
}

// releaseHook runs its hook, once, when the agent lets go of a released
// claim's name: after the ledger freed the claim's GPUs and before they
// go back to the idle driver.
type releaseHook struct {
	NameAuthority
	hook atomic.Pointer[func()]
}

func (h *releaseHook) ReleaseRemembering(ctx context.Context, key names.Key, token uint64, node string, keep time.Duration) (names.Record, error) {
	if f := h.hook.Swap(nil); f != nil {
		(*f)()
	}
	return h.NameAuthority.ReleaseRemembering(ctx, key, token, node, keep)
}

// A forced release frees its GPUs in the ledger, lets go of the claim's
// name, then returns the GPUs to the idle driver. A reservation made while
// the name was let go took the GPU the released VM still held open: the
// release kept GPUs back only on the way to the idle driver, and skipped
// those a claim held by then. (TestInUseChecksRunConcurrently failed so
// again, with EBUSY when the second VM opened the group.) The release now
// keeps them back under the device locks it frees them under.
func TestReleaseKeepsBackBeforeAReservationCanBind(t *testing.T) {
	dir := t.TempDir()
	h := &releaseHook{NameAuthority: soloRegistry(t, "test-node")}
	m := machine(t, "dgx-h100", dir)
	a, err := New(context.Background(), testConfig(t, dir), quietLog(), WithSysfs(m.Kernel, m.NVML), WithNames(h))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()
	if _, err := a.Claim(ctx, "fill", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 7}}}); err != nil {
		t.Fatal(err)
	}
	held, stop := startVM(t, a, m, "vm-0", 100)

	var (
		got  api.Claim
		rerr error
	)
	reserve := func() {
		got, rerr = a.Reserve(ctx, "vm-1", api.ReserveRequest{Items: []api.Item{{Model: "NVIDIA H100 80GB", Count: 1}}, Coordinator: a.cfg.NodeName})
	}
	h.hook.Store(&reserve)
	if _, err := a.Release(api.WithForce(ctx), "vm-0"); err != nil {
		t.Fatal(err)
	}
	if h.hook.Load() != nil {
		t.Fatal("the release let go of no name: the reservation never ran in its window")
	}
	if rerr == nil {
		t.Fatalf("reserved %+v while vm-0 still held %s open", got.GPUs, held.PCIAddress)
	}
	if _, err := a.ledger.Get("vm-1"); err == nil {
		t.Error("the refused reservation was left in the ledger")
	}
	if g := gpuStatus(t, a, held.PCIAddress); g.State != api.StateReturning {
		t.Errorf("%s after the forced release: %s, want returning while vm-0 holds it", held.PCIAddress, g.State)
	}
	stop()
	a.host.CheckReturning(ctx)
	if g := gpuStatus(t, a, held.PCIAddress); g.State != api.StateFree || g.Driver != vfio.DriverNVIDIA {
		t.Errorf("%s once vm-0 let go: %s on %s, want free on nvidia", held.PCIAddress, g.State, g.Driver)
	}
}
