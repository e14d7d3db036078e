package inventory

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpuherd/gpuherd/vfio"
)

// dgxAddrs are the GPU slots of a DGX H100, in NVML index order here.
var dgxAddrs = []string{
	"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
	"0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0",
}

func newDGX(t *testing.T) *server.Server {
	t.Helper()
	s := dgxh100.New()
	// Reverse NVML's order relative to the addresses, so that a facts-by-
	// index bug cannot pass.
	addrs := make([]string, len(dgxAddrs))
	for i, a := range dgxAddrs {
		addrs[len(addrs)-1-i] = a
	}
	placeMockGPUs(t, s, addrs)
	return s
}

func mockDev(s *server.Server, addr string) *server.Device {
	for _, d := range s.Devices {
		dev := d.(*server.Device)
		if got, _ := vfio.AddressFromNVMLBusID(dev.PciBusID); got == addr {
			return dev
		}
	}
	panic("no mock GPU at " + addr)
}

func TestSnapshotDGXH100(t *testing.T) {
	s := newDGX(t)
	src := NewNVML(s, nil)
	clock := fakeClock()
	src.now = clock

	facts, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(facts) != 8 {
		t.Fatalf("got facts for %d GPUs, want 8: %v", len(facts), facts)
	}
	for _, addr := range dgxAddrs {
		f, ok := facts[addr]
		if !ok {
			t.Fatalf("no facts at %s", addr)
		}
		dev := mockDev(s, addr)
		if f.UUID != dev.UUID || f.UUID == "" {
			t.Errorf("%s: UUID %q, want %q", addr, f.UUID, dev.UUID)
		}
		if f.MemoryBytes != 85899345920 {
			t.Errorf("%s: memory %d, want 85899345920", addr, f.MemoryBytes)
		}
		if f.Name != "NVIDIA H100 80GB HBM3" || f.DriverVersion != "550.54.15" {
			t.Errorf("%s: name %q driver %q", addr, f.Name, f.DriverVersion)
		}
		// The server mock sets no GetSerial, GetNumaNodeId or
		// GetTopologyCommonAncestor: those panic, and must read as unknown.
		if f.Serial != "" || f.NUMANode != -1 || f.Distance != nil {
			t.Errorf("%s: calls the mock lacks gave values: %+v", addr, f)
		}
		if f.ObservedAt.IsZero() {
			t.Errorf("%s: no ObservedAt", addr)
		}
	}
}

// setTopology gives every mock GPU serials, NUMA nodes and a two-socket
// topology: the first four addresses on socket 0, the rest on socket 1.
func setTopology(s *server.Server) {
	socket := func(d nvml.Device) int {
		id, _ := vfio.AddressFromNVMLBusID(d.(*server.Device).PciBusID)
		for i, a := range dgxAddrs {
			if a == id {
				return i / 4
			}
		}
		return -1
	}
	for _, d := range s.Devices {
		dev := d.(*server.Device)
		dev.GetSerialFunc = func() (string, nvml.Return) { return "  165422" + dev.UUID[4:10] + " ", nvml.SUCCESS }
		dev.GetNumaNodeIdFunc = func() (int, nvml.Return) { return socket(dev), nvml.SUCCESS }
		dev.GetTopologyCommonAncestorFunc = func(peer nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			if socket(dev) == socket(peer) {
				return nvml.TOPOLOGY_NODE, nvml.SUCCESS
			}
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
	}
}

func TestSnapshotOptionalFacts(t *testing.T) {
	s := newDGX(t)
	setTopology(s)
	facts, err := NewNVML(s, nil).Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	f := facts["0000:18:00.0"]
	if f.NUMANode != 0 || facts["0000:db:00.0"].NUMANode != 1 {
		t.Errorf("NUMA: %d, %d", f.NUMANode, facts["0000:db:00.0"].NUMANode)
	}
	if want := "165422" + mockDev(s, "0000:18:00.0").UUID[4:10]; f.Serial != want {
		t.Errorf("serial %q, want %q (trimmed)", f.Serial, want)
	}
	if len(f.Distance) != 7 || f.Distance["0000:2a:00.0"] != int(nvml.TOPOLOGY_NODE) || f.Distance["0000:db:00.0"] != int(nvml.TOPOLOGY_SYSTEM) {
		t.Errorf("distance from 18: %v", f.Distance)
	}
	if _, self := f.Distance["0000:18:00.0"]; self {
		t.Error("a GPU has a distance to itself")
	}
	if back := facts["0000:db:00.0"].Distance["0000:18:00.0"]; back != int(nvml.TOPOLOGY_SYSTEM) {
		t.Errorf("distance is not symmetric: %d", back)
	}
}

func TestSnapshotBadDevices(t *testing.T) {
	s := newDGX(t)
	log, logs := newLog()
	lost := mockDev(s, "0000:2a:00.0")
	lost.GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
	lost.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
	noBus := mockDev(s, "0000:3a:00.0")
	noBus.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{PciDeviceId: 0x233010de}, nvml.SUCCESS }
	badBus := mockDev(s, "0000:5d:00.0")
	badBus.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{BusId: busIDArray("garbage")}, nvml.SUCCESS }
	dup := mockDev(s, "0000:9a:00.0")
	dup.GetPciInfoFunc = mockDev(s, "0000:ab:00.0").GetPciInfoFunc
	legacy := mockDev(s, "0000:ba:00.0")
	legacy.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		var p nvml.PciInfo
		full := busIDArray("0000:BA:00.0")
		copy(p.BusIdLegacy[:], full[:])
		return p, nvml.SUCCESS
	}
	inner := s.DeviceGetHandleByIndexFunc
	s.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if d, _ := inner(i); d == nvml.Device(mockDev(s, "0000:db:00.0")) {
			return nil, nvml.ERROR_UNKNOWN
		}
		return inner(i)
	}

	facts, err := NewNVML(s, log).Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := facts["0000:2a:00.0"]; !ok || f.UUID != "" || f.MemoryBytes != 0 || f.Name == "" {
		t.Errorf("a lost GPU must keep what NVML could still say: %+v %v", f, ok)
	}
	for _, addr := range []string{"0000:3a:00.0", "0000:5d:00.0", "0000:db:00.0"} {
		if _, ok := facts[addr]; ok {
			t.Errorf("%s: facts for a GPU NVML could not place", addr)
		}
	}
	// NVML index order is reversed against addresses: ab comes before 9a,
	// so 9a is the second GPU claiming ab's bus ID and is dropped.
	if f := facts["0000:ab:00.0"]; f.UUID != mockDev(s, "0000:ab:00.0").UUID {
		t.Errorf("duplicate bus ID: the second GPU overwrote the first: %q", f.UUID)
	}
	if _, ok := facts["0000:9a:00.0"]; ok {
		t.Error("facts at 9a although NVML never reported its bus ID")
	}
	if f := facts["0000:ba:00.0"]; f.UUID != legacy.UUID {
		t.Errorf("legacy bus ID not used: %+v", f)
	}
	for _, want := range []string{"GetUUID", "ERROR_GPU_IS_LOST", "GetPciInfo returned no bus ID", `garbage`, "two GPUs at one PCI address", "cannot open a GPU"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
}

func TestNVMLInitAndShutdown(t *testing.T) {
	for _, tt := range []struct {
		ret         nvml.Return
		unavailable bool
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, true},
		{nvml.ERROR_DRIVER_NOT_LOADED, true},
		{nvml.ERROR_NO_PERMISSION, false},
		{nvml.ERROR_LIB_RM_VERSION_MISMATCH, false},
	} {
		t.Run(tt.ret.Error(), func(t *testing.T) {
			s := newDGX(t)
			s.InitFunc = func() nvml.Return { return tt.ret }
			src := NewNVML(s, nil)
			_, err := src.Snapshot()
			if err == nil || errors.Is(err, ErrNVMLUnavailable) != tt.unavailable {
				t.Fatalf("Snapshot: %v; want unavailable=%v", err, tt.unavailable)
			}
			if !strings.Contains(err.Error(), tt.ret.Error()) {
				t.Errorf("error %q does not say why", err)
			}
			// The driver gets loaded later: the next Snapshot tries again.
			s.InitFunc = func() nvml.Return { return nvml.SUCCESS }
			if facts, err := src.Snapshot(); err != nil || len(facts) != 8 {
				t.Fatalf("after the driver came: %d facts, %v", len(facts), err)
			}
			if err := src.Shutdown(); err != nil {
				t.Fatal(err)
			}
			if n := len(s.ShutdownCalls()); n != 1 {
				t.Errorf("Shutdown called %d times, want 1", n)
			}
		})
	}
}

func TestNVMLInitOnce(t *testing.T) {
	s := newDGX(t)
	src := NewNVML(s, nil)
	if err := src.Shutdown(); err != nil || len(s.ShutdownCalls()) != 0 {
		t.Fatalf("Shutdown before Init: %v, %d calls", err, len(s.ShutdownCalls()))
	}
	if len(s.InitCalls()) != 0 {
		t.Fatal("NewNVML touched the library")
	}
	for range 3 {
		if _, err := src.Snapshot(); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(s.InitCalls()); n != 1 {
		t.Errorf("Init called %d times, want 1", n)
	}
	s.ShutdownFunc = func() nvml.Return { return nvml.ERROR_UNINITIALIZED }
	if err := src.Shutdown(); err == nil || !strings.Contains(err.Error(), "ERROR_UNINITIALIZED") {
		t.Errorf("Shutdown error: %v", err)
	}
}

func TestNVMLPanickingInit(t *testing.T) {
	s := newDGX(t)
	s.InitFunc = nil // an unset mock func panics
	_, err := NewNVML(s, nil).Snapshot()
	if err == nil || errors.Is(err, ErrNVMLUnavailable) || !strings.Contains(err.Error(), "panicked") {
		t.Errorf("got %v", err)
	}
}

func TestNVMLCountFails(t *testing.T) {
	s := newDGX(t)
	s.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	if _, err := NewNVML(s, nil).Snapshot(); err == nil || !strings.Contains(err.Error(), "count GPUs") {
		t.Errorf("got %v", err)
	}
}

func TestSnapshotTopologyPartlyFails(t *testing.T) {
	s := newDGX(t)
	setTopology(s)
	lost := mockDev(s, "0000:db:00.0")
	lost.GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		return 0, nvml.ERROR_GPU_IS_LOST
	}
	facts, err := NewNVML(s, nil).Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// NVML index order is reversed, so db is index 0 and every pair with
	// it is asked on db's side: all of those fail, and no other pair does.
	if d := facts["0000:2a:00.0"].Distance; len(d) != 6 {
		t.Errorf("a lost GPU's errors stopped other pairs: %v", d)
	}
	if d := facts["0000:db:00.0"].Distance; d != nil {
		t.Errorf("lost GPU has distances: %v", d)
	}
}
