package inventory

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// simHost boots a built-in simulated server and returns its kernel, its
// cards and an NVMLSource over its simulated NVML.
func simHost(t *testing.T, profile string) (*fakekernel.Kernel, []sim.GPU, *NVMLSource) {
	t.Helper()
	p, err := sim.Builtin(profile)
	if err != nil {
		t.Fatal(err)
	}
	k, err := fakekernel.New(p.KernelConfig())
	if err != nil {
		t.Fatal(err)
	}
	nv := NewNVML(p.NVML(k), nil)
	t.Cleanup(func() {
		if err := nv.Shutdown(); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return k, p.GPUs(), nv
}

func TestTelemetrySimulated(t *testing.T) {
	_, gpus, nv := simHost(t, "dgx-h100")
	first, err := nv.Telemetry()
	if err != nil {
		t.Fatal(err)
	}
	second, err := nv.Telemetry()
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != len(gpus) {
		t.Fatalf("telemetry for %d GPUs, want the %d on nvidia", len(first), len(gpus))
	}
	for _, g := range gpus {
		tm, ok := first[g.Address]
		if !ok {
			t.Errorf("%s: no telemetry", g.Address)
			continue
		}
		if !tm.HasTemperature || !tm.HasPower || !tm.HasEnergy || !tm.HasMemory || !tm.HasUtilization {
			t.Errorf("%s: missing readings %+v; the simulation answers all of them", g.Address, tm)
		}
		// The simulation's ranges, in base units: a scaling slip (mW as W,
		// percent as ratio, MiB as bytes) lands far outside them.
		if tm.TemperatureCelsius < 20 || tm.TemperatureCelsius > 45 {
			t.Errorf("%s: temperature %v °C", g.Address, tm.TemperatureCelsius)
		}
		if tm.PowerWatts < 50 || tm.PowerWatts > 100 {
			t.Errorf("%s: power %v W, want an idle H100's 72-81 W", g.Address, tm.PowerWatts)
		}
		if want := g.MemoryMiB << 20; tm.MemoryTotalBytes != want || tm.MemoryUsedBytes != 1<<20 {
			t.Errorf("%s: memory %d/%d bytes, want %d/%d", g.Address, tm.MemoryUsedBytes, tm.MemoryTotalBytes, 1<<20, want)
		}
		if tm.Utilization != 0 {
			t.Errorf("%s: utilisation %v, want 0", g.Address, tm.Utilization)
		}
		// The simulated counter advances by one second at the card's power
		// per reading, so joules must grow by exactly the watts.
		delta := second[g.Address].EnergyJoules - tm.EnergyJoules
		if math.Abs(delta-tm.PowerWatts) > 1e-6 {
			t.Errorf("%s: energy grew %v J between readings, want %v (one second at %v W)", g.Address, delta, tm.PowerWatts, tm.PowerWatts)
		}
	}
}

func TestTelemetryOnlyHostDriverGPUs(t *testing.T) {
	k, gpus, nv := simHost(t, "dgx-h100")
	gone := gpus[3].Address
	binder := vfio.NewBinder(vfio.New(k))
	if _, err := binder.Bind(context.Background(), gone); err != nil {
		t.Fatalf("bind %s: %v", gone, err)
	}
	got, err := nv.Telemetry()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got[gone]; ok {
		t.Errorf("%s is on vfio-pci but has telemetry", gone)
	}
	if len(got) != len(gpus)-1 {
		t.Errorf("telemetry for %d GPUs, want %d", len(got), len(gpus)-1)
	}
}

func TestTelemetryUnansweredReadingsAbsent(t *testing.T) {
	// go-nvml's server mock answers memory but not temperature, power,
	// energy or utilisation: those must be absent, not zero.
	s := newDGX(t)
	nv := NewNVML(s, nil)
	got, err := nv.Telemetry()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(dgxAddrs) {
		t.Fatalf("telemetry for %d GPUs, want %d", len(got), len(dgxAddrs))
	}
	for addr, tm := range got {
		want := Telemetry{MemoryTotalBytes: tm.MemoryTotalBytes, MemoryUsedBytes: tm.MemoryUsedBytes, HasMemory: true}
		if tm != want || tm.MemoryTotalBytes == 0 {
			t.Errorf("%s: %+v, want memory only", addr, tm)
		}
	}
}

func TestTelemetryUnits(t *testing.T) {
	// NVML's units: °C, milliwatts, millijoules, bytes, percent.
	s := newDGX(t)
	d := mockDev(s, "0000:5d:00.0")
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 61, nvml.SUCCESS }
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 312_500, nvml.SUCCESS }
	d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) { return 123_456_789, nvml.SUCCESS }
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 80 << 30, Used: 3 << 30}, nvml.SUCCESS }
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 37, Memory: 12}, nvml.SUCCESS }
	got, err := NewNVML(s, nil).Telemetry()
	if err != nil {
		t.Fatal(err)
	}
	want := Telemetry{
		TemperatureCelsius: 61, PowerWatts: 312.5, EnergyJoules: 123456.789,
		MemoryUsedBytes: 3 << 30, MemoryTotalBytes: 80 << 30, Utilization: 0.37,
		HasTemperature: true, HasPower: true, HasEnergy: true, HasMemory: true, HasUtilization: true,
	}
	if g := got["0000:5d:00.0"]; g != want {
		t.Errorf("got  %+v\nwant %+v", g, want)
	}
}

func TestTelemetryNVMLUnavailable(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	_, err := NewNVML(lib, nil).Telemetry()
	if !errors.Is(err, ErrNVMLUnavailable) {
		t.Errorf("err = %v, want ErrNVMLUnavailable", err)
	}
}

func TestTelemetryCountFails(t *testing.T) {
	s := newDGX(t)
	s.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	_, err := NewNVML(s, nil).Telemetry()
	if err == nil || errors.Is(err, ErrNVMLUnavailable) {
		t.Errorf("err = %v, want a count failure", err)
	}
}

// xidHost is go-nvml's DGX H100 mock with event sets: each Wait takes its
// answer from waits, or times out once the test's context ends, so the
// watcher's progress is driven step by step without sleeping.
type xidHost struct {
	*server.Server
	waits chan xidWait
	regs  chan string // addresses registered for XID events, in order

	mu    sync.Mutex
	inits int
	now   time.Time
}

type xidWait struct {
	data nvml.EventData
	ret  nvml.Return
}

func newXIDHost(t *testing.T, ctx context.Context) *xidHost {
	t.Helper()
	h := &xidHost{
		Server: newDGX(t),
		waits:  make(chan xidWait),
		regs:   make(chan string, 64),
		now:    time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	h.InitFunc = func() nvml.Return { h.mu.Lock(); h.inits++; h.mu.Unlock(); return nvml.SUCCESS }
	h.ShutdownFunc = func() nvml.Return { h.mu.Lock(); h.inits--; h.mu.Unlock(); return nvml.SUCCESS }
	h.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
				select {
				case w := <-h.waits:
					return w.data, w.ret
				case <-ctx.Done():
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	for _, addr := range dgxAddrs {
		d := mockDev(h.Server, addr)
		d.RegisterEventsFunc = func(types uint64, _ nvml.EventSet) nvml.Return {
			if types != nvml.EventTypeXidCriticalError {
				t.Errorf("%s registered for events %#x, want XidCriticalError only", addr, types)
			}
			h.regs <- addr
			return nvml.SUCCESS
		}
	}
	return h
}

func (h *xidHost) clock() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.now
}

func (h *xidHost) advance(d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.now = h.now.Add(d)
}

// registered drains the registrations of one event-set build of n GPUs.
func (h *xidHost) registered(t *testing.T, n int) []string {
	t.Helper()
	var got []string
	for range n {
		got = append(got, <-h.regs)
	}
	slices.Sort(got)
	return got
}

type xidEvent struct {
	addr string
	xid  uint64
}

// startWatch runs WatchXID until the test ends and returns its events and
// its result.
func startWatch(t *testing.T, ctx context.Context, nv *NVMLSource) (<-chan xidEvent, <-chan error) {
	t.Helper()
	events := make(chan xidEvent, 16)
	done := make(chan error, 1)
	go func() {
		done <- nv.WatchXID(ctx, func(addr string, xid uint64) { events <- xidEvent{addr, xid} })
	}()
	return events, done
}

func TestWatchXIDReportsAndStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := newXIDHost(t, ctx)
	nv := NewNVML(h, nil)
	nv.now = h.clock
	events, done := startWatch(t, ctx, nv)

	if got := h.registered(t, len(dgxAddrs)); !slices.Equal(got, dgxAddrs) {
		t.Fatalf("registered %v, want every GPU", got)
	}
	target := mockDev(h.Server, "0000:9a:00.0")
	h.waits <- xidWait{ret: nvml.ERROR_TIMEOUT}
	h.waits <- xidWait{data: nvml.EventData{Device: target, EventType: nvml.EventTypeXidCriticalError, EventData: 79}, ret: nvml.SUCCESS}
	// Another event type on the same set is not an XID.
	h.waits <- xidWait{data: nvml.EventData{Device: target, EventType: nvml.EventTypeSingleBitEccError, EventData: 1}, ret: nvml.SUCCESS}
	h.waits <- xidWait{data: nvml.EventData{Device: target, EventType: nvml.EventTypeXidCriticalError, EventData: 48}, ret: nvml.SUCCESS}
	for _, want := range []xidEvent{{"0000:9a:00.0", 79}, {"0000:9a:00.0", 48}} {
		if got := <-events; got != want {
			t.Errorf("event %+v, want %+v", got, want)
		}
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("WatchXID after cancel: %v, want nil", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inits != 0 {
		t.Errorf("NVML Init minus Shutdown = %d after WatchXID returned, want 0", h.inits)
	}
}

func TestWatchXIDFollowsHostDriver(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := newXIDHost(t, ctx)
	late := "0000:ab:00.0"
	lateDev := mockDev(h.Server, late)
	dropFromNVML(h.Server, late)
	nv := NewNVML(h, nil)
	nv.now = h.clock
	events, done := startWatch(t, ctx, nv)

	want := slices.DeleteFunc(slices.Clone(dgxAddrs), func(a string) bool { return a == late })
	if got := h.registered(t, len(want)); !slices.Equal(got, want) {
		t.Fatalf("registered %v, want %v", got, want)
	}
	// The card comes back to the host driver. The change reaches the
	// watcher through the channel send below, which orders it before the
	// watcher's next rescan.
	h.Devices = append(h.Devices, lateDev)
	h.advance(xidRescanInterval)
	h.waits <- xidWait{ret: nvml.ERROR_TIMEOUT}
	if got := h.registered(t, len(dgxAddrs)); !slices.Equal(got, dgxAddrs) {
		t.Fatalf("after rescan registered %v, want every GPU", got)
	}
	h.waits <- xidWait{data: nvml.EventData{Device: lateDev, EventType: nvml.EventTypeXidCriticalError, EventData: 94}, ret: nvml.SUCCESS}
	if got := <-events; got != (xidEvent{late, 94}) {
		t.Errorf("event %+v, want XID 94 on %s", got, late)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("WatchXID: %v", err)
	}
}

func TestWatchXIDGPULostTwice(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := newXIDHost(t, ctx)
	nv := NewNVML(h, nil)
	nv.now = h.clock
	_, done := startWatch(t, ctx, nv)
	h.registered(t, len(dgxAddrs))

	// One lost GPU makes the watcher look again; the same answer straight
	// after means it cannot watch at all.
	h.waits <- xidWait{ret: nvml.ERROR_GPU_IS_LOST}
	h.waits <- xidWait{ret: nvml.ERROR_GPU_IS_LOST}
	err := <-done
	if err == nil || errors.Is(err, ErrXIDUnsupported) {
		t.Errorf("err = %v, want a watch failure", err)
	}
}

func TestWatchXIDUnsupported(t *testing.T) {
	tests := []struct {
		name string
		nv   func(t *testing.T) *NVMLSource
		want error
	}{
		{"simulation has no event sets", func(t *testing.T) *NVMLSource {
			_, _, nv := simHost(t, "dgx-h100")
			return nv
		}, ErrXIDUnsupported},
		{"driver refuses every GPU", func(t *testing.T) *NVMLSource {
			h := newXIDHost(t, context.Background())
			for _, d := range h.Devices {
				d.(*server.Device).RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
			}
			return NewNVML(h, nil)
		}, ErrXIDUnsupported},
		{"no libnvidia-ml", func(t *testing.T) *NVMLSource {
			return NewNVML(&mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}, nil)
		}, ErrNVMLUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			called := false
			err := tt.nv(t).WatchXID(context.Background(), func(string, uint64) { called = true })
			if !errors.Is(err, tt.want) {
				t.Errorf("err = %v, want %v", err, tt.want)
			}
			if called {
				t.Error("report called")
			}
		})
	}
}
