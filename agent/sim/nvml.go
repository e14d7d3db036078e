package sim

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpuherd/gpuherd/vfio"
)

// What the simulated driver says it is.
const (
	simDriverVersion     = "570.172.08"
	simNVMLVersion       = "12.570.172.08"
	simCUDADriverVersion = 12080
)

// simNVML answers for the cards of a profile the way NVML does on a real host:
// a card is there only while the nvidia driver holds it, which is read from
// the kernel on every call.
//
// It is built on go-nvml's moq mocks and the model data of mock/gpus rather
// than on mock/server, whose random UUIDs would be replaced anyway and whose
// google/uuid dependency this module does not carry.
type simNVML struct {
	mock.Interface
	fs      vfio.FS
	devices []*simDevice // every card of the profile, in address order

	mu    sync.Mutex
	inits int // Init minus Shutdown; NVML counts them too
}

// simDevice is one card's handle.
type simDevice struct {
	mock.Device
	gpu    GPU
	energy atomic.Uint64 // millijoules reported so far
}

// NVML returns a simulated NVML for the profile's cards, which reads through
// fs which driver holds each card; nil when the profile has nvml: false.
//
// Device calls before Init fail with ERROR_UNINITIALIZED, and calls on the
// handle of a card that has left the nvidia driver with ERROR_GPU_IS_LOST, as
// on a real host. Telemetry is deterministic: temperature, power and memory
// use are fixed per card, utilisation is zero (the host runs nothing on its
// GPUs), and the energy counter advances by one second at the card's power on
// each reading. GetTopologyCommonAncestor says TOPOLOGY_INTERNAL for the card
// itself, TOPOLOGY_MULTIPLE for the other card behind the same PCIe switch
// (slots 2k and 2k+1 of a NUMA node), TOPOLOGY_NODE for the same NUMA node and
// TOPOLOGY_SYSTEM across nodes.
func (p *Profile) NVML(fs vfio.FS) nvml.Interface {
	if !p.nvml {
		return nil
	}
	s := &simNVML{fs: fs}
	for minor, g := range p.gpus {
		d := &simDevice{gpu: g}
		d.energy.Store(telemetrySeed(p.Name, g.Address) % 500_000_000) // as if up for days
		s.setDeviceFuncs(d, p.models[g.Address], minor, telemetrySeed(p.Name, g.Address))
		s.devices = append(s.devices, d)
	}
	s.setLibraryFuncs()
	return s
}

// visible returns the cards the nvidia driver holds now, in the order NVML
// indexes them (PCI address order).
func (s *simNVML) visible() []*simDevice {
	var out []*simDevice
	for _, d := range s.devices {
		if s.onNVIDIA(d) {
			out = append(out, d)
		}
	}
	return out
}

func (s *simNVML) onNVIDIA(d *simDevice) bool {
	link, err := s.fs.Readlink("bus/pci/devices/" + d.gpu.Address + "/driver")
	return err == nil && path.Base(link) == vfio.DriverNVIDIA
}

func (s *simNVML) initialized() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inits > 0
}

func (s *simNVML) setLibraryFuncs() {
	s.InitFunc = func() nvml.Return {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.inits++
		return nvml.SUCCESS
	}
	s.InitWithFlagsFunc = func(uint32) nvml.Return { return s.Init() }
	s.ShutdownFunc = func() nvml.Return {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.inits == 0 {
			return nvml.ERROR_UNINITIALIZED
		}
		s.inits--
		return nvml.SUCCESS
	}
	s.ErrorStringFunc = func(r nvml.Return) string { return r.Error() }
	s.ExtensionsFunc = func() nvml.ExtendedInterface {
		return &mock.ExtendedInterface{LookupSymbolFunc: func(string) error { return nil }}
	}
	s.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return simDriverVersion, nvml.SUCCESS }
	s.SystemGetNVMLVersionFunc = func() (string, nvml.Return) { return simNVMLVersion, nvml.SUCCESS }
	s.SystemGetCudaDriverVersionFunc = func() (int, nvml.Return) { return simCUDADriverVersion, nvml.SUCCESS }

	s.DeviceGetCountFunc = func() (int, nvml.Return) {
		if !s.initialized() {
			return 0, nvml.ERROR_UNINITIALIZED
		}
		return len(s.visible()), nvml.SUCCESS
	}
	s.DeviceGetHandleByIndexFunc = func(index int) (nvml.Device, nvml.Return) {
		if !s.initialized() {
			return nil, nvml.ERROR_UNINITIALIZED
		}
		v := s.visible()
		if index < 0 || index >= len(v) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return v[index], nvml.SUCCESS
	}
	lookup := func(match func(*simDevice) bool) (nvml.Device, nvml.Return) {
		if !s.initialized() {
			return nil, nvml.ERROR_UNINITIALIZED
		}
		for _, d := range s.visible() {
			if match(d) {
				return d, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	s.DeviceGetHandleByPciBusIdFunc = func(busID string) (nvml.Device, nvml.Return) {
		addr, ok := sysfsAddress(busID)
		if !ok {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return lookup(func(d *simDevice) bool { return d.gpu.Address == addr })
	}
	s.DeviceGetHandleByUUIDFunc = func(uuid string) (nvml.Device, nvml.Return) {
		return lookup(func(d *simDevice) bool { return d.gpu.UUID == uuid })
	}
	s.DeviceGetHandleBySerialFunc = func(serial string) (nvml.Device, nvml.Return) {
		return lookup(func(d *simDevice) bool { return d.gpu.Serial == serial })
	}

	// The library's DeviceGetX(d) forms, which the real one also offers.
	s.DeviceGetNameFunc = func(d nvml.Device) (string, nvml.Return) { return d.GetName() }
	s.DeviceGetUUIDFunc = func(d nvml.Device) (string, nvml.Return) { return d.GetUUID() }
	s.DeviceGetSerialFunc = func(d nvml.Device) (string, nvml.Return) { return d.GetSerial() }
	s.DeviceGetIndexFunc = func(d nvml.Device) (int, nvml.Return) { return d.GetIndex() }
	s.DeviceGetMinorNumberFunc = func(d nvml.Device) (int, nvml.Return) { return d.GetMinorNumber() }
	s.DeviceGetPciInfoFunc = func(d nvml.Device) (nvml.PciInfo, nvml.Return) { return d.GetPciInfo() }
	s.DeviceGetMemoryInfoFunc = func(d nvml.Device) (nvml.Memory, nvml.Return) { return d.GetMemoryInfo() }
	s.DeviceGetNumaNodeIdFunc = func(d nvml.Device) (int, nvml.Return) { return d.GetNumaNodeId() }
	s.DeviceGetArchitectureFunc = func(d nvml.Device) (nvml.DeviceArchitecture, nvml.Return) { return d.GetArchitecture() }
	s.DeviceGetBrandFunc = func(d nvml.Device) (nvml.BrandType, nvml.Return) { return d.GetBrand() }
	s.DeviceGetCudaComputeCapabilityFunc = func(d nvml.Device) (int, int, nvml.Return) { return d.GetCudaComputeCapability() }
	s.DeviceGetMigModeFunc = func(d nvml.Device) (int, int, nvml.Return) { return d.GetMigMode() }
	s.DeviceGetTemperatureFunc = func(d nvml.Device, t nvml.TemperatureSensors) (uint32, nvml.Return) {
		return d.GetTemperature(t)
	}
	s.DeviceGetPowerUsageFunc = func(d nvml.Device) (uint32, nvml.Return) { return d.GetPowerUsage() }
	s.DeviceGetTotalEnergyConsumptionFunc = func(d nvml.Device) (uint64, nvml.Return) {
		return d.GetTotalEnergyConsumption()
	}
	s.DeviceGetUtilizationRatesFunc = func(d nvml.Device) (nvml.Utilization, nvml.Return) {
		return d.GetUtilizationRates()
	}
	s.DeviceGetTopologyCommonAncestorFunc = func(a, b nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		return a.GetTopologyCommonAncestor(b)
	}
}

// setDeviceFuncs sets every call the agent makes on a card. minor is the
// card's place among all cards, as the nvidia driver numbers /dev/nvidiaN.
func (s *simNVML) setDeviceFuncs(d *simDevice, m gpuModel, minor int, seed uint64) {
	g := d.gpu
	cfg := m.nvml
	busID, legacy := nvmlBusID(g.Address)
	domain, bus, dev, _ := splitAddress(g.Address)
	memory := nvml.Memory{Total: g.MemoryMiB << 20, Used: 1 << 20} // nvidia-smi's "1MiB / …" of an idle card
	memory.Free = memory.Total - memory.Used
	temperature := 28 + uint32(seed%12)              // °C: an idle card in a cool room
	power := m.idleWatts*1000 + uint32(seed>>8%9000) // mW

	// A handle outlives its card's time on the nvidia driver; its calls then
	// fail as they do on a real host after an unbind.
	lost := func() bool { return !s.onNVIDIA(d) }
	ok := func() nvml.Return {
		if lost() {
			return nvml.ERROR_GPU_IS_LOST
		}
		return nvml.SUCCESS
	}

	d.GetNameFunc = func() (string, nvml.Return) { return cfg.Name, ok() }
	d.GetUUIDFunc = func() (string, nvml.Return) { return g.UUID, ok() }
	d.GetSerialFunc = func() (string, nvml.Return) { return g.Serial, ok() }
	d.GetMinorNumberFunc = func() (int, nvml.Return) { return minor, ok() }
	d.GetIndexFunc = func() (int, nvml.Return) {
		if lost() {
			return 0, nvml.ERROR_GPU_IS_LOST
		}
		return slices.Index(s.visible(), d), nvml.SUCCESS
	}
	d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return g.NUMANode, ok() }
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return cfg.Architecture, ok() }
	d.GetBrandFunc = func() (nvml.BrandType, nvml.Return) { return cfg.Brand, ok() }
	d.GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) { return cfg.CudaMajor, cfg.CudaMinor, ok() }
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		if len(cfg.MIGProfiles.GpuInstanceProfiles) == 0 {
			return 0, 0, nvml.ERROR_NOT_SUPPORTED
		}
		return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, ok()
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return memory, ok() }
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		info := nvml.PciInfo{
			Domain:         domain,
			Bus:            bus,
			Device:         dev,
			PciDeviceId:    cfg.PciDeviceId,
			PciSubSystemId: vfio.VendorNVIDIA, // subsystem device 0, as in sysfs
		}
		copyCString(info.BusId[:], busID)
		copyCString(info.BusIdLegacy[:], legacy)
		return info, ok()
	}
	d.GetTemperatureFunc = func(sensor nvml.TemperatureSensors) (uint32, nvml.Return) {
		if sensor != nvml.TEMPERATURE_GPU {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		return temperature, ok()
	}
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return power, ok() }
	d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) {
		if lost() {
			return 0, nvml.ERROR_GPU_IS_LOST
		}
		return d.energy.Add(uint64(power)), nvml.SUCCESS // mW × 1 s = mJ
	}
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, ok() }
	d.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		o, isSim := other.(*simDevice)
		if !isSim || !slices.Contains(s.devices, o) {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		if r := ok(); r != nvml.SUCCESS {
			return 0, r
		}
		switch {
		case o == d:
			return nvml.TOPOLOGY_INTERNAL, nvml.SUCCESS
		case o.gpu.NUMANode != g.NUMANode:
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		case o.gpu.Slot/2 == g.Slot/2:
			return nvml.TOPOLOGY_MULTIPLE, nvml.SUCCESS
		default:
			return nvml.TOPOLOGY_NODE, nvml.SUCCESS
		}
	}
}

// telemetrySeed is a stable per-card number from which the telemetry values
// are drawn.
func telemetrySeed(profile, address string) uint64 {
	sum := sha256.Sum256([]byte("gpuherd-sim-telemetry\x00" + profile + "\x00" + address))
	return binary.BigEndian.Uint64(sum[:8])
}

// nvmlBusID turns a sysfs address (0000:3b:00.0) into NVML's bus ID
// (00000000:3B:00.0) and its legacy form (0000:3B:00.0).
func nvmlBusID(addr string) (busID, legacy string) {
	domain, bus, dev, fn := splitAddress(addr)
	return fmt.Sprintf("%08X:%02X:%02X.%X", domain, bus, dev, fn),
		fmt.Sprintf("%04X:%02X:%02X.%X", domain, bus, dev, fn)
}

// sysfsAddress turns any bus ID NVML accepts (domain of 4 or 8 hex digits,
// either case, or bus:device.function alone) into the sysfs address.
func sysfsAddress(busID string) (string, bool) {
	parts := strings.Split(busID, ":")
	if len(parts) == 2 {
		parts = append([]string{"0"}, parts...)
	}
	if len(parts) != 3 {
		return "", false
	}
	devFn := strings.Split(parts[2], ".")
	if len(devFn) != 2 {
		return "", false
	}
	domain, err1 := strconv.ParseUint(parts[0], 16, 16)
	bus, err2 := strconv.ParseUint(parts[1], 16, 8)
	dev, err3 := strconv.ParseUint(devFn[0], 16, 5)
	fn, err4 := strconv.ParseUint(devFn[1], 16, 3)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || len(parts[0]) > 8 {
		return "", false
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", domain, bus, dev, fn), true
}

// splitAddress splits a validated sysfs address into its numbers.
func splitAddress(addr string) (domain, bus, dev, fn uint32) {
	var d, b, v, f uint64
	d, _ = strconv.ParseUint(addr[0:4], 16, 16)
	b, _ = strconv.ParseUint(addr[5:7], 16, 8)
	v, _ = strconv.ParseUint(addr[8:10], 16, 8)
	f, _ = strconv.ParseUint(addr[11:12], 16, 8)
	return uint32(d), uint32(b), uint32(v), uint32(f)
}

// copyCString writes s into a C char array, leaving the NUL terminator.
func copyCString(dst []int8, s string) {
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = int8(s[i])
	}
}
