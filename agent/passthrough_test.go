package agent

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// The readiness machine: GPU a shares IOMMU group 14 with its audio
// function and with a network card the host uses (a board without ACS);
// GPUs b and c are alone with their groups.
const (
	gpuA   = "0000:41:00.0"
	audioA = "0000:41:00.1"
	nicA   = "0000:42:00.0"
	gpuB   = "0000:51:00.0"
	gpuC   = "0000:61:00.0"
	nicB   = "0000:52:00.0" // hot-added into b's group by the tests
)

var idleDrivers = []string{"vfio-pci", "nvidia", "none"}

func readinessKernel(t *testing.T) *fakekernel.Kernel {
	t.Helper()
	l40s := func(addr string, group int) fakekernel.Function {
		return fakekernel.Function{Address: addr, Vendor: vfio.VendorNVIDIA, Device: 0x26b9, Class: vfio.Class3D, IOMMUGroup: group, Driver: "nvidia"}
	}
	k, err := fakekernel.New(fakekernel.Config{Drivers: []string{"nvidia", "snd_hda_intel", "igb"}, Devices: []fakekernel.Function{
		l40s(gpuA, 14),
		{Address: audioA, Vendor: vfio.VendorNVIDIA, Device: 0x22ba, Class: vfio.ClassAudio, IOMMUGroup: 14, Driver: "snd_hda_intel"},
		{Address: nicA, Vendor: 0x8086, Device: 0x1521, Class: 0x020000, IOMMUGroup: 14, Driver: "igb"},
		l40s(gpuB, 15),
		l40s(gpuC, 16),
	}})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// readinessAgent is an agent on k whose every capacity change is signalled
// on changes, so tests await transitions instead of sleeping.
type readinessAgent struct {
	*Agent
	k       *fakekernel.Kernel
	changes chan struct{}
	logs    *syncBuffer
}

func newReadinessAgent(t *testing.T, k *fakekernel.Kernel, idle string, run bool) *readinessAgent {
	t.Helper()
	return newReadinessAgentConfig(t, k, idle, run, nil)
}

// newReadinessAgentWith is a running readiness agent with its
// configuration adjusted.
func newReadinessAgentWith(t *testing.T, k *fakekernel.Kernel, idle string, adjust func(*Config)) *readinessAgent {
	t.Helper()
	return newReadinessAgentConfig(t, k, idle, true, adjust)
}

func newReadinessAgentConfig(t *testing.T, k *fakekernel.Kernel, idle string, run bool, adjust func(*Config)) *readinessAgent {
	t.Helper()
	cfg := testConfig(t, t.TempDir())
	cfg.IdleDriver = idle
	if adjust != nil {
		adjust(&cfg)
	}
	ra := &readinessAgent{k: k, changes: make(chan struct{}, 1), logs: &syncBuffer{}}
	log := slog.New(slog.NewTextHandler(ra.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a, err := New(context.Background(), cfg, log, WithSysfs(k, nil), WithOnChange(func() {
		select {
		case ra.changes <- struct{}{}:
		default:
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	ra.Agent = a
	t.Cleanup(func() { a.Close() })
	if run {
		ctx, cancel := context.WithCancel(context.Background())
		ready, done := make(chan struct{}), make(chan error, 1)
		go func() { done <- a.Run(ctx, func() { close(ready) }) }()
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("agent stopped: %v", err)
		}
		t.Cleanup(func() { cancel(); <-done })
	}
	return ra
}

func (ra *readinessAgent) gpu(t *testing.T, addr string) api.GPU {
	t.Helper()
	st, err := ra.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range st.GPUs {
		if g.PCIAddress == addr {
			return g
		}
	}
	t.Fatalf("no GPU %s in status", addr)
	return api.GPU{}
}

// await waits until cond holds, woken by every capacity change; it returns
// how long that took.
func (ra *readinessAgent) await(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-ra.changes:
		case <-deadline:
			t.Fatalf("%s: not within 10 s; logs:\n%s", what, ra.logs.String())
		}
	}
	return time.Since(start)
}

func (ra *readinessAgent) state(t *testing.T, addr string) func() bool {
	return func() bool { return ra.gpu(t, addr).State == api.StateFree }
}

// idleDriverOf is where a free GPU rests under the idle policy; nvidia
// keeps what it had (the host driver).
func idleDriverOf(idle string) string {
	switch idle {
	case "vfio-pci":
		return vfio.DriverVFIO
	case "nvidia":
		return "nvidia"
	}
	return ""
}

func l40sCounts(t *testing.T, a *Agent) (free, unusable int) {
	t.Helper()
	c := a.ledger.Totals(a.clk.Now())["NVIDIA L40S"]
	return c.Free, c.Unusable
}

// TestUnusableAtStart: whatever the idle driver, the GPU sharing its group
// with the host's NIC is unusable from the start, with the NIC named, is
// never free and never counted, and nothing of its group is written; the
// other GPUs are free on the idle driver. The verdict is the one `gpuherd
// inventory` prints (vfio's Readiness on the same machine).
func TestUnusableAtStart(t *testing.T) {
	for _, idle := range idleDrivers {
		t.Run(idle, func(t *testing.T) {
			k := readinessKernel(t)
			ra := newReadinessAgent(t, k, idle, false)
			g := ra.gpu(t, gpuA)
			if g.State != api.StateUnusable || g.Driver != "nvidia" {
				t.Fatalf("GPU a: state %q on %q, want unusable and left on nvidia", g.State, g.Driver)
			}
			r := g.Readiness
			if r == nil || r.Ready || len(r.Blocking) != 1 || r.Blocking[0].Code != vfio.ProblemGroupNotViable {
				t.Fatalf("GPU a readiness %+v", r)
			}
			bd := r.Blocking[0].BlockingDevice
			if bd == nil || *bd != (api.PCIDevice{PCIAddress: nicA, Vendor: "8086", Device: "1521", Class: "020000", Driver: "igb"}) {
				t.Errorf("blocking device %+v, want the NIC with its IDs, class and driver", bd)
			}
			if !strings.Contains(r.Blocking[0].Fix, "unbind") || !strings.Contains(g.Health, nicA) {
				t.Errorf("fix %q / health %q: want what to do, naming the NIC", r.Blocking[0].Fix, g.Health)
			}
			for _, addr := range []string{gpuB, gpuC} {
				if g := ra.gpu(t, addr); g.State != api.StateFree || g.Driver != idleDriverOf(idle) {
					t.Errorf("GPU %s: %q on %q, want free on %q", addr, g.State, g.Driver, idleDriverOf(idle))
				}
			}
			if free, unusable := l40sCounts(t, ra.Agent); free != 2 || unusable != 1 {
				t.Errorf("ledger: %d free, %d unusable; want 2 and 1", free, unusable)
			}
			av, _ := ra.Availability(context.Background())
			for _, m := range av.Models {
				if m.Model == "NVIDIA L40S" && (m.Free != 2 || m.Healthy != 2 || m.Unusable != 1 || m.MaxFreeOnOneServer != 2) {
					t.Errorf("availability %+v, want 2 free, 2 healthy, 1 unusable", m)
				}
			}
			for _, w := range k.Writes() {
				if strings.Contains(w.Name, "0000:41:") || strings.Contains(w.Name, nicA) || w.Data == gpuA || w.Data == audioA || w.Data == nicA {
					t.Errorf("write to the unusable GPU's group: %+v", w)
				}
			}
			// The same verdict as `gpuherd inventory` computes.
			v, err := vfio.New(k).Readiness(gpuA, vfio.ReadinessConfig{Allow: vfio.DefaultAllowList()}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := host.ReadinessView(v); got.Blocking[0] != r.Blocking[0] && got.Blocking[0].Message != r.Blocking[0].Message {
				t.Errorf("inventory verdict %+v, status %+v", got, r)
			}
			logs := ra.logs.String()
			if !strings.Contains(logs, "GPU unusable: it cannot be passed through") || strings.Contains(logs, "release") || strings.Contains(logs, "fenced") {
				t.Errorf("start-up logs should say the GPU is unusable, and neither release nor fence anything:\n%s", logs)
			}
		})
	}
}

// TestUnusableFollowsTheMachine: with the agent running, each change of the
// machine reaches the offer through the PCI uevents alone: the NIC
// unbound makes GPU a free on the idle driver; the NIC bound again takes it
// out; a device hot-added into free GPU b's group takes b out at once;
// removing it, or allow-listing it on reload, brings b back.
func TestUnusableFollowsTheMachine(t *testing.T) {
	for _, idle := range idleDrivers {
		t.Run(idle, func(t *testing.T) {
			k := readinessKernel(t)
			ra := newReadinessAgent(t, k, idle, true)
			if g := ra.gpu(t, gpuA); g.State != api.StateUnusable {
				t.Fatalf("GPU a %q at start", g.State)
			}

			// The operator unbinds the NIC by hand.
			start := time.Now()
			if err := k.WriteFile("bus/pci/devices/"+nicA+"/driver/unbind", []byte(nicA)); err != nil {
				t.Fatal(err)
			}
			ra.await(t, "GPU a free after the NIC was unbound", ra.state(t, gpuA))
			t.Logf("idle %s: NIC unbound -> GPU a free in %v", idle, time.Since(start))
			if d := driverOf(t, k, gpuA); d != idleDriverOf(idle) {
				t.Errorf("GPU a on %q once free, want the idle driver %q", d, idleDriverOf(idle))
			}
			if d := driverOf(t, k, nicA); d != "" {
				t.Errorf("the NIC moved to %q; gpuherd must never touch it", d)
			}

			// The NIC is bound again: a leaves the offer.
			if err := k.WriteFile("bus/pci/drivers/igb/bind", []byte(nicA)); err != nil {
				t.Fatal(err)
			}
			ra.await(t, "GPU a unusable after the NIC was bound", func() bool { return ra.gpu(t, gpuA).State == api.StateUnusable })
			if d := driverOf(t, k, nicA); d != "igb" {
				t.Errorf("NIC on %q", d)
			}

			// A device appears in free GPU b's group.
			start = time.Now()
			if err := k.Add(fakekernel.Function{Address: nicB, Vendor: 0x8086, Device: 0x1533, Class: 0x020000, IOMMUGroup: 15, Driver: "igb"}); err != nil {
				t.Fatal(err)
			}
			ra.await(t, "GPU b unusable after a hot-add", func() bool { return ra.gpu(t, gpuB).State == api.StateUnusable })
			t.Logf("idle %s: device hot-added -> GPU b out of the offer in %v", idle, time.Since(start))
			if free, unusable := l40sCounts(t, ra.Agent); free != 1 || unusable != 2 {
				t.Errorf("ledger: %d free, %d unusable; want 1 and 2", free, unusable)
			}
			if bd := ra.gpu(t, gpuB).Readiness.Blocking[0].BlockingDevice; bd == nil || bd.PCIAddress != nicB {
				t.Errorf("GPU b blocked by %+v, want %s", bd, nicB)
			}

			// The operator allow-lists it and reloads: gpuherd may now give
			// it to the VM with b, so b is ready again.
			allow := vfio.AllowList{{Vendor: vfio.VendorNVIDIA, AnyDevice: true}, {Vendor: 0x8086, Device: 0x1533}}
			ra.ReloadReadiness(context.Background(), allow, false)
			if g := ra.gpu(t, gpuB); g.State != api.StateFree {
				t.Fatalf("GPU b %q after allow-listing the device, want free", g.State)
			}
			// Once allowed, the device followed b to the idle driver where
			// that moves devices (vfio-pci, none); off the list again, it
			// blocks b only where it stayed on its host driver (nvidia).
			ra.ReloadReadiness(context.Background(), vfio.DefaultAllowList(), false)
			wantB := api.StateFree
			if idle == "nvidia" {
				wantB = api.StateUnusable
			}
			if g := ra.gpu(t, gpuB); g.State != wantB || driverOf(t, k, nicB) != map[string]string{"vfio-pci": vfio.DriverVFIO, "nvidia": "igb", "none": ""}[idle] {
				t.Fatalf("GPU b %q, device on %q after the allow list lost the device again", g.State, driverOf(t, k, nicB))
			}

			// The device is removed: b is offered again.
			if err := k.Remove(nicB); err != nil {
				t.Fatal(err)
			}
			ra.await(t, "GPU b free after the device was removed", ra.state(t, gpuB))
			if g := ra.gpu(t, gpuB); g.Driver != idleDriverOf(idle) {
				t.Errorf("GPU b on %q, want %q", g.Driver, idleDriverOf(idle))
			}
		})
	}
}

// TestRefusedClaimWritesNothing: a claim that would bind a GPU whose group
// changed behind the agent's back (no watch runs here) looks at every
// group first, refuses, and leaves every binding of the server exactly as
// it was: no sysfs write at all. The error names the GPU and the device
// and says other servers may still serve the request.
func TestRefusedClaimWritesNothing(t *testing.T) {
	for _, idle := range idleDrivers {
		t.Run(idle, func(t *testing.T) {
			k := readinessKernel(t)
			ra := newReadinessAgent(t, k, idle, false)
			if err := k.Add(fakekernel.Function{Address: nicB, Vendor: 0x8086, Device: 0x1533, Class: 0x020000, IOMMUGroup: 15, Driver: "igb"}); err != nil {
				t.Fatal(err)
			}
			drivers := func() map[string]string {
				out := map[string]string{}
				for _, addr := range []string{gpuA, audioA, nicA, gpuB, nicB, gpuC} {
					out[addr] = driverOf(t, k, addr)
				}
				return out
			}
			before, writes := drivers(), len(k.Writes())
			_, err := ra.Claim(context.Background(), "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}})
			ae := apiErr(t, err)
			if ae.Code != api.CodeNotAvailable || len(ae.Refusals) != 1 {
				t.Fatalf("claim: %v (refusals %q), want not available with the owner's refusal", err, ae.Refusals)
			}
			for _, want := range []string{gpuB, nicB, "8086:1533", "igb", "other servers may still serve the request", "no driver binding on this server was changed"} {
				if !strings.Contains(ae.Refusals[0], want) {
					t.Errorf("refusal %q does not say %q", ae.Refusals[0], want)
				}
			}
			if after := drivers(); !mapsEqual(before, after) {
				t.Errorf("drivers changed: %v -> %v", before, after)
			}
			if w := k.Writes()[writes:]; len(w) != 0 {
				t.Errorf("a refused claim wrote to sysfs: %+v", w)
			}
			if g := ra.gpu(t, gpuB); g.State != api.StateUnusable {
				t.Errorf("GPU b %q after the refusal, want unusable", g.State)
			}

			// The owner's own answer, for the last ready GPU gone bad too.
			const nicC = "0000:62:00.0"
			if err := k.Add(fakekernel.Function{Address: nicC, Vendor: 0x8086, Device: 0x1533, Class: 0x020000, IOMMUGroup: 16, Driver: "igb"}); err != nil {
				t.Fatal(err)
			}
			_, err = ra.Reserve(context.Background(), "vm-2", api.ReserveRequest{Items: []api.Item{{Model: "NVIDIA L40S", Count: 1}}})
			if msg := apiErr(t, err).Message; !strings.Contains(msg, gpuC) || !strings.Contains(msg, nicC) || !strings.Contains(msg, "other servers may still serve the request") {
				t.Errorf("owner's refusal %q: want GPU c, its NIC, and other servers", msg)
			}
			if w := k.Writes()[writes:]; len(w) != 0 {
				t.Errorf("a refused reservation wrote to sysfs: %+v", w)
			}

			// The device goes; a reload reads the groups again and c is served.
			if err := k.Remove(nicC); err != nil {
				t.Fatal(err)
			}
			ra.ReloadReadiness(context.Background(), vfio.DefaultAllowList(), false)
			c, err := ra.Claim(context.Background(), "vm-3", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}})
			if err != nil || len(c.GPUs) != 1 || c.GPUs[0].PCIAddress != gpuC || driverOf(t, k, gpuC) != vfio.DriverVFIO {
				t.Fatalf("claim of the one ready GPU: %+v, %v", c, err)
			}
			for _, w := range k.Writes()[writes:] {
				if !strings.Contains(w.Name, gpuC) && w.Data != gpuC {
					t.Errorf("write outside GPU c: %+v", w)
				}
			}
		})
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestPCIHandlersSeeEveryBatch: handlers registered with OnPCIChange get
// the kernel's events after readiness has taken them, and an empty batch
// on reload.
func TestPCIHandlersSeeEveryBatch(t *testing.T) {
	k := readinessKernel(t)
	cfg := testConfig(t, t.TempDir())
	a, err := New(context.Background(), cfg, quietLog(), WithSysfs(k, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	got := make(chan []vfio.PCIEvent, 16)
	a.host.OnPCIChange(func(_ context.Context, evs []vfio.PCIEvent) {
		if len(evs) > 0 && evs[0].Address == nicA {
			if st := a.gpuStateOf(gpuA); st != api.StateFree {
				t.Errorf("handler ran before readiness: GPU a %q", st)
			}
		}
		got <- slices.Clone(evs)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- a.Run(ctx, func() { close(ready) }) }()
	<-ready
	if err := k.WriteFile("bus/pci/devices/"+nicA+"/driver/unbind", []byte(nicA)); err != nil {
		t.Fatal(err)
	}
	var seen []vfio.PCIEvent
	for !slices.Contains(seen, vfio.PCIEvent{Action: vfio.UeventUnbind, Address: nicA}) {
		seen = append(seen, <-got...)
	}
	a.ReloadReadiness(ctx, vfio.DefaultAllowList(), false)
	for evs := range got {
		if len(evs) == 0 {
			break
		}
	}
	cancel()
	<-done
}

func (a *Agent) gpuStateOf(addr string) string {
	for _, s := range a.ledger.GPUStates(a.clk.Now()) {
		if s.GPU.Address == addr {
			return string(s.Status)
		}
	}
	return ""
}

// TestClusterHearsAGPUTurnUnusable: a device hot-added into a free GPU's
// group takes that GPU out of this server's offer at once, and the other
// servers' availability with the next gossip; unbinding it brings the GPU
// back everywhere, without restarting anything.
func TestClusterHearsAGPUTurnUnusable(t *testing.T) {
	tc := newTestCluster(t)
	s1 := tc.start("s1", "l40s-4")
	tc.start("s2", "l40s-4")
	const model = "NVIDIA L40S"
	tc.converge("8 L40S free", func(a *Agent) bool { return freeOf(a, model) == 8 })

	addr := s1.host.Addresses()[0]
	g, _ := s1.host.GPU(addr)
	const nic = "0000:f0:00.0" // the board's own sound card, on the host's driver
	start := time.Now()
	if err := s1.sim.Kernel.Add(fakekernel.Function{Address: nic, Vendor: 0x8086, Device: 0xa348, Class: vfio.ClassAudio, IOMMUGroup: g.IOMMUGroup, Driver: "snd_hda_intel"}); err != nil {
		t.Fatal(err)
	}
	took := tc.converge("7 L40S free, 1 unusable", func(a *Agent) bool {
		av, _ := a.Availability(context.Background())
		for _, m := range av.Models {
			if m.Model == model {
				return m.Free == 7 && m.Unusable == 1
			}
		}
		return false
	})
	t.Logf("device hot-added on s1 -> both servers see the GPU unusable in %v (since the add: %v)", took, time.Since(start))
	if err := s1.sim.Kernel.WriteFile("bus/pci/devices/"+nic+"/driver/unbind", []byte(nic)); err != nil {
		t.Fatal(err)
	}
	took = tc.converge("8 L40S free again", func(a *Agent) bool { return freeOf(a, model) == 8 })
	t.Logf("device unbound on s1 -> both servers see the GPU free in %v", took)
}
