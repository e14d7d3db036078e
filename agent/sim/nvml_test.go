package sim

import (
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuherd/gpuherd/vfio"
)

// driverFS is the smallest vfio.FS NVML needs: the driver link of each device.
type driverFS struct {
	mu      sync.Mutex
	drivers map[string]string // address → driver; "" unbound
}

func newDriverFS(p *Profile) *driverFS {
	f := &driverFS{drivers: map[string]string{}}
	for _, d := range p.KernelConfig().Devices {
		f.drivers[d.Address] = d.Driver
	}
	return f
}

func (f *driverFS) bind(addr, driver string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drivers[addr] = driver
}

func (f *driverFS) Readlink(name string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	addr, ok := strings.CutPrefix(name, "bus/pci/devices/")
	addr, ok2 := strings.CutSuffix(addr, "/driver")
	if d := f.drivers[addr]; ok && ok2 && d != "" {
		return "../../../bus/pci/drivers/" + d, nil
	}
	return "", &fs.PathError{Op: "readlink", Path: name, Err: fs.ErrNotExist}
}

func (f *driverFS) ReadFile(name string) ([]byte, error) {
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
}
func (f *driverFS) WriteFile(name string, _ []byte) error {
	return &fs.PathError{Op: "write", Path: name, Err: fs.ErrPermission}
}
func (f *driverFS) ReadDir(name string) ([]string, error) {
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
}
func (f *driverFS) Exists(string) bool { return false }

var _ vfio.FS = (*driverFS)(nil)

func startNVML(t *testing.T, profile string) (*Profile, *driverFS, nvml.Interface) {
	t.Helper()
	p, err := Builtin(profile)
	if err != nil {
		t.Fatal(err)
	}
	kfs := newDriverFS(p)
	lib := p.NVML(kfs)
	if r := lib.Init(); r != nvml.SUCCESS {
		t.Fatalf("Init: %v", r)
	}
	t.Cleanup(func() {
		if r := lib.Shutdown(); r != nvml.SUCCESS {
			t.Errorf("Shutdown: %v", r)
		}
	})
	return p, kfs, lib
}

// must returns v, or panics (failing the test) when the NVML call failed:
// Go passes a call's two results on only when they are the sole arguments.
func must[T any](v T, r nvml.Return) T {
	if r != nvml.SUCCESS {
		panic(fmt.Sprintf("NVML call failed: %v", r))
	}
	return v
}

func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

func TestNVMLNeedsInit(t *testing.T) {
	p, _ := Builtin("a100-pcie-4")
	lib := p.NVML(newDriverFS(p))
	if _, r := lib.DeviceGetCount(); r != nvml.ERROR_UNINITIALIZED {
		t.Errorf("DeviceGetCount before Init: %v", r)
	}
	if r := lib.Shutdown(); r != nvml.ERROR_UNINITIALIZED {
		t.Errorf("Shutdown before Init: %v", r)
	}
	lib.Init()
	lib.Init()
	lib.Shutdown()
	if n, r := lib.DeviceGetCount(); r != nvml.SUCCESS || n != 4 {
		t.Errorf("after Init, Init, Shutdown: %d, %v; want 4 cards (NVML counts its Inits)", n, r)
	}
	if v, r := lib.SystemGetDriverVersion(); r != nvml.SUCCESS || v == "" {
		t.Errorf("SystemGetDriverVersion: %q, %v", v, r)
	}
}

func TestNVMLBusIDsRoundTrip(t *testing.T) {
	p, _, lib := startNVML(t, "dgx-h100")
	gpus := p.GPUs()
	if n := must(lib.DeviceGetCount()); n != len(gpus) {
		t.Fatalf("DeviceGetCount = %d, want %d", n, len(gpus))
	}
	for i, g := range gpus {
		d := must(lib.DeviceGetHandleByIndex(i))
		info := must(d.GetPciInfo())
		_, bus, _, _ := splitAddress(g.Address)
		busID := cString(info.BusId[:])
		if want := "00000000:" + strings.ToUpper(g.Address[5:]); busID != want {
			t.Errorf("index %d: BusId %q, want %q", i, busID, want)
		}
		if legacy := cString(info.BusIdLegacy[:]); legacy != strings.ToUpper(g.Address) {
			t.Errorf("index %d: BusIdLegacy %q, want %q", i, legacy, strings.ToUpper(g.Address))
		}
		if addr, ok := sysfsAddress(busID); !ok || addr != g.Address {
			t.Errorf("index %d: %q goes back to %q, want %q", i, busID, addr, g.Address)
		}
		if info.PciDeviceId != 0x233010de || info.Bus != uint32(bus) {
			t.Errorf("index %d: PciDeviceId %#x bus %#x", i, info.PciDeviceId, info.Bus)
		}
		for _, form := range []string{busID, strings.ToLower(busID), g.Address, g.Address[5:]} {
			h, r := lib.DeviceGetHandleByPciBusId(form)
			if r != nvml.SUCCESS || h != d {
				t.Errorf("DeviceGetHandleByPciBusId(%q): %v, %v; want index %d", form, h, r, i)
			}
		}
		if idx := must(d.GetIndex()); idx != i {
			t.Errorf("GetIndex = %d, want %d", idx, i)
		}
		if numa := must(d.GetNumaNodeId()); numa != g.NUMANode {
			t.Errorf("GetNumaNodeId = %d, want %d", numa, g.NUMANode)
		}
		if name := must(d.GetName()); name != "NVIDIA H100 80GB HBM3" {
			t.Errorf("GetName = %q", name)
		}
	}
	if _, r := lib.DeviceGetHandleByPciBusId("not a bus id"); r != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("malformed bus ID: %v, want ERROR_INVALID_ARGUMENT", r)
	}
	if _, r := lib.DeviceGetHandleByPciBusId("0000:01:00.0"); r != nvml.ERROR_NOT_FOUND {
		t.Errorf("bus ID of no card: %v, want ERROR_NOT_FOUND", r)
	}
}

func TestNVMLIdentityIsDeterministic(t *testing.T) {
	p, _, a := startNVML(t, "mixed")
	_, _, b := startNVML(t, "mixed")
	for i, g := range p.GPUs() {
		da, db := must(a.DeviceGetHandleByIndex(i)), must(b.DeviceGetHandleByIndex(i))
		ua, ub := must(da.GetUUID()), must(db.GetUUID())
		if ua != ub || ua != g.UUID {
			t.Errorf("%s: UUIDs %q and %q, want %q in both", g.Address, ua, ub, g.UUID)
		}
		if s := must(a.DeviceGetSerial(da)); s != g.Serial {
			t.Errorf("%s: serial %q, want %q", g.Address, s, g.Serial)
		}
		if h := must(a.DeviceGetHandleByUUID(ua)); h != da {
			t.Errorf("%s: DeviceGetHandleByUUID finds another card", g.Address)
		}
		if h := must(a.DeviceGetHandleBySerial(g.Serial)); h != da {
			t.Errorf("%s: DeviceGetHandleBySerial finds another card", g.Address)
		}
		ta, tb := must(da.GetTemperature(nvml.TEMPERATURE_GPU)), must(db.GetTemperature(nvml.TEMPERATURE_GPU))
		pa, pb := must(da.GetPowerUsage()), must(db.GetPowerUsage())
		if ta != tb || pa != pb {
			t.Errorf("%s: telemetry differs between two simulations: %d/%d °C, %d/%d mW", g.Address, ta, tb, pa, pb)
		}
		if name := must(da.GetName()); name != g.Name {
			t.Errorf("%s: GetName %q, want %q", g.Address, name, g.Name)
		}
		if info := must(da.GetPciInfo()); info.PciDeviceId != uint32(g.Device)<<16|0x10de {
			t.Errorf("%s: PciDeviceId %#x", g.Address, info.PciDeviceId)
		}
	}
}

func TestNVMLLosesCardsOffTheNVIDIADriver(t *testing.T) {
	p, kfs, lib := startNVML(t, "dgx-h100")
	gpus := p.GPUs()
	moved := gpus[3]
	before := must(lib.DeviceGetHandleByPciBusId(moved.Address))
	fifth := must(lib.DeviceGetHandleByIndex(4))

	kfs.bind(moved.Address, vfio.DriverVFIO)
	if n := must(lib.DeviceGetCount()); n != 7 {
		t.Errorf("DeviceGetCount with a card on vfio-pci = %d, want 7", n)
	}
	if _, r := lib.DeviceGetHandleByPciBusId(moved.Address); r != nvml.ERROR_NOT_FOUND {
		t.Errorf("handle of a card on vfio-pci: %v, want ERROR_NOT_FOUND", r)
	}
	if _, r := lib.DeviceGetHandleByUUID(moved.UUID); r != nvml.ERROR_NOT_FOUND {
		t.Errorf("handle by UUID of a card on vfio-pci: %v, want ERROR_NOT_FOUND", r)
	}
	if _, r := before.GetTemperature(nvml.TEMPERATURE_GPU); r != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("old handle after the unbind: %v, want ERROR_GPU_IS_LOST", r)
	}
	for i := range 7 {
		d := must(lib.DeviceGetHandleByIndex(i))
		if uuid := must(d.GetUUID()); uuid == moved.UUID {
			t.Errorf("index %d is the card on vfio-pci", i)
		}
	}
	if h := must(lib.DeviceGetHandleByIndex(3)); h != fifth {
		t.Error("the indices did not close up behind the card that left")
	}
	if idx := must(fifth.GetIndex()); idx != 3 {
		t.Errorf("GetIndex of the card after it = %d, want 3", idx)
	}
	if _, r := lib.DeviceGetHandleByIndex(7); r != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("index 7 of 7: %v", r)
	}

	kfs.bind(moved.Address, "")
	if n := must(lib.DeviceGetCount()); n != 7 {
		t.Errorf("DeviceGetCount with an unbound card = %d, want 7", n)
	}
	kfs.bind(moved.Address, vfio.DriverNVIDIA)
	if h := must(lib.DeviceGetHandleByPciBusId(moved.Address)); h != before {
		t.Error("back on nvidia, the card has a new handle")
	}
	if n := must(lib.DeviceGetCount()); n != 8 {
		t.Errorf("DeviceGetCount back on nvidia = %d, want 8", n)
	}
}

func TestNVMLTopology(t *testing.T) {
	p, _, lib := startNVML(t, "dgx-h100")
	handle := func(addr string) nvml.Device { return must(lib.DeviceGetHandleByPciBusId(addr)) }
	gpus := p.GPUs()
	tests := []struct {
		a, b string
		want nvml.GpuTopologyLevel
	}{
		{gpus[0].Address, gpus[0].Address, nvml.TOPOLOGY_INTERNAL},
		{"0000:18:00.0", "0000:2a:00.0", nvml.TOPOLOGY_MULTIPLE}, // slots 0 and 1
		{"0000:3a:00.0", "0000:5d:00.0", nvml.TOPOLOGY_MULTIPLE}, // slots 2 and 3
		{"0000:2a:00.0", "0000:3a:00.0", nvml.TOPOLOGY_NODE},
		{"0000:18:00.0", "0000:9a:00.0", nvml.TOPOLOGY_SYSTEM},
		{"0000:ba:00.0", "0000:db:00.0", nvml.TOPOLOGY_MULTIPLE},
	}
	for _, tt := range tests {
		got := must(lib.DeviceGetTopologyCommonAncestor(handle(tt.a), handle(tt.b)))
		back := must(handle(tt.b).GetTopologyCommonAncestor(handle(tt.a)))
		if got != tt.want || back != tt.want {
			t.Errorf("%s ↔ %s: %v and %v, want %v", tt.a, tt.b, got, back, tt.want)
		}
	}
}

func TestNVMLTelemetry(t *testing.T) {
	p, _, lib := startNVML(t, "rtx6000pro-2")
	for i, g := range p.GPUs() {
		d := must(lib.DeviceGetHandleByIndex(i))
		if c := must(lib.DeviceGetTemperature(d, nvml.TEMPERATURE_GPU)); c < 20 || c > 60 {
			t.Errorf("%s: %d °C", g.Address, c)
		}
		if mw := must(lib.DeviceGetPowerUsage(d)); mw < 10_000 || mw > 150_000 {
			t.Errorf("%s: %d mW for an idle card", g.Address, mw)
		}
		e1 := must(lib.DeviceGetTotalEnergyConsumption(d))
		e2 := must(d.GetTotalEnergyConsumption())
		if e2 <= e1 {
			t.Errorf("%s: energy counter %d then %d, want it rising", g.Address, e1, e2)
		}
		if u := must(lib.DeviceGetUtilizationRates(d)); u != (nvml.Utilization{}) {
			t.Errorf("%s: utilisation %+v of an idle card", g.Address, u)
		}
		m := must(lib.DeviceGetMemoryInfo(d))
		if m.Total != g.MemoryMiB<<20 || m.Used+m.Free != m.Total {
			t.Errorf("%s: memory %+v, want %d MiB in total", g.Address, m, g.MemoryMiB)
		}
		if minor := must(lib.DeviceGetMinorNumber(d)); minor != i {
			t.Errorf("%s: minor %d, want %d", g.Address, minor, i)
		}
		if idx := must(lib.DeviceGetIndex(d)); idx != i {
			t.Errorf("%s: index %d, want %d", g.Address, idx, i)
		}
		if name := must(lib.DeviceGetName(d)); name != "NVIDIA RTX PRO 6000 Blackwell Server Edition" {
			t.Errorf("%s: name %q", g.Address, name)
		}
		if _, r := d.GetTemperature(nvml.TEMPERATURE_COUNT); r != nvml.ERROR_INVALID_ARGUMENT {
			t.Errorf("%s: unknown sensor: %v", g.Address, r)
		}
	}
}

// TestNVMLConcurrentRebinds runs NVML calls while cards change driver, for
// the race detector.
func TestNVMLConcurrentRebinds(t *testing.T) {
	p, kfs, lib := startNVML(t, "dgx-h100")
	var wg sync.WaitGroup
	for _, g := range p.GPUs() {
		wg.Go(func() {
			for i := range 50 {
				if i%2 == 0 {
					kfs.bind(g.Address, vfio.DriverVFIO)
				} else {
					kfs.bind(g.Address, vfio.DriverNVIDIA)
				}
			}
		})
		wg.Go(func() {
			for range 50 {
				n, r := lib.DeviceGetCount()
				if r != nvml.SUCCESS || n < 0 || n > 8 {
					t.Errorf("DeviceGetCount: %d, %v", n, r)
				}
				if d, r := lib.DeviceGetHandleByIndex(0); r == nvml.SUCCESS {
					d.GetTotalEnergyConsumption()
				}
			}
		})
	}
	wg.Wait()
}
