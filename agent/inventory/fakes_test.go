package inventory

import (
	"bytes"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpuherd/gpuherd/vfio"
)

// fakePCI is a Source over a fixed device list.
type fakePCI struct {
	mu     sync.Mutex
	devs   []vfio.Device
	health map[string]error // address -> what Health returns
	err    error            // what Devices returns
}

func (f *fakePCI) Devices() ([]vfio.Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	return append([]vfio.Device(nil), f.devs...), nil
}

func (f *fakePCI) Health(addr string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.health[addr]
}

// setDriver moves a device to another driver, as vfio's bind would.
func (f *fakePCI) setDriver(addr, driver string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.devs {
		if f.devs[i].Address == addr {
			f.devs[i].Driver = driver
			return
		}
	}
	panic("no device " + addr)
}

// mapStore is a FactStore over a map that counts writes.
type mapStore struct {
	mu     sync.Mutex
	data   map[string][]byte
	puts   int
	putErr error
}

func newMapStore() *mapStore { return &mapStore{data: make(map[string][]byte)} }

func (s *mapStore) PutFacts(addr string, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.putErr != nil {
		return s.putErr
	}
	s.puts++
	s.data[addr] = append([]byte(nil), data...)
	return nil
}

func (s *mapStore) Facts() (map[string][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.data), nil
}

func (s *mapStore) writes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.puts
}

// gpu, fn: sysfs devices for fixtures.
func gpu(addr string, device uint16, group, numa int, driver string) vfio.Device {
	return vfio.Device{Address: addr, Vendor: vfio.VendorNVIDIA, Device: device, SubsystemVendor: vfio.VendorNVIDIA,
		SubsystemDevice: 0x16c1, Class: vfio.Class3D, Driver: driver, IOMMUGroup: group, NUMANode: numa}
}

func fn(addr string, vendor, device uint16, class uint32, group int, driver string) vfio.Device {
	return vfio.Device{Address: addr, Vendor: vendor, Device: device, Class: class, Driver: driver, IOMMUGroup: group, NUMANode: -1}
}

// nvmlBusID writes addr the way NVML reports it: 8-digit domain, upper case.
func nvmlBusID(t testing.TB, addr string) string {
	t.Helper()
	var dom, bus, dev, f uint
	if _, err := fmt.Sscanf(addr, "%x:%x:%x.%x", &dom, &bus, &dev, &f); err != nil {
		t.Fatalf("bad fixture address %q: %v", addr, err)
	}
	return fmt.Sprintf("%08X:%02X:%02X.%X", dom, bus, dev, f)
}

func busIDArray(s string) [32]int8 {
	var a [32]int8
	for i := 0; i < len(s) && i < len(a)-1; i++ {
		a[i] = int8(s[i])
	}
	return a
}

// placeMockGPUs puts the mock server's devices at the given sysfs
// addresses, in order, with the bus IDs a real driver would report. The
// go-nvml server mock only fills PciDeviceId in GetPciInfo.
func placeMockGPUs(t testing.TB, s *server.Server, addrs []string) {
	t.Helper()
	if len(addrs) != len(s.Devices) {
		t.Fatalf("%d addresses for %d mock GPUs", len(addrs), len(s.Devices))
	}
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		busID := nvmlBusID(t, addrs[i])
		dev.PciBusID = busID
		devID := dev.Config.PciDeviceId
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			return nvml.PciInfo{BusId: busIDArray(busID), PciDeviceId: devID}, nvml.SUCCESS
		}
	}
}

// fakeClock returns a time that moves one second per call, so that facts
// observed twice always differ in ObservedAt.
func fakeClock() func() time.Time {
	var mu sync.Mutex
	t := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(time.Second)
		return t
	}
}

// logBuffer is a debug-level text logger whose output tests can read.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newLog() (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}
