package inventory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuherd/gpuherd/vfio"
)

// ErrNVMLUnavailable means libnvidia-ml or the nvidia kernel driver is not
// there. On a passthrough host that is normal: the inventory then comes from
// sysfs alone, plus whatever NVML told us earlier.
var ErrNVMLUnavailable = errors.New("NVML unavailable")

// Facts is what NVML tells us about one GPU, beyond what sysfs shows.
type Facts struct {
	UUID        string `json:"uuid,omitempty"`
	Serial      string `json:"serial,omitempty"`
	Name        string `json:"name,omitempty"`         // NVML's product name, e.g. "NVIDIA H100 80GB HBM3"
	MemoryBytes uint64 `json:"memory_bytes,omitempty"` // total framebuffer; 0 unknown
	NUMANode    int    `json:"numa_node"`              // -1 unknown
	// Distance maps a peer GPU's sysfs address to the nvml.GpuTopologyLevel
	// of their common ancestor (0 same board ... 50 across CPU sockets),
	// so smaller is closer. Only pairs NVML answered for are present.
	Distance      map[string]int `json:"distance,omitempty"`
	DriverVersion string         `json:"driver_version,omitempty"`
	ObservedAt    time.Time      `json:"observed_at"`
}

// NVML is where facts about GPUs come from when the host driver sees them.
type NVML interface {
	// Snapshot returns facts keyed by sysfs PCI address ("0000:3b:00.0").
	// It returns an error wrapping ErrNVMLUnavailable when NVML cannot be
	// used on this host at all.
	Snapshot() (map[string]Facts, error)
}

// NVMLSource is the NVML implementation over go-nvml.
type NVMLSource struct {
	lib nvml.Interface
	log *slog.Logger
	now func() time.Time

	mu     sync.Mutex
	inited bool
}

// NewNVML returns an NVML source over lib: nvml.New() on a real host, a
// go-nvml mock in tests. It does not touch the library until the first
// Snapshot, so building the agent's wiring never blocks on the driver.
func NewNVML(lib nvml.Interface, log *slog.Logger) *NVMLSource {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &NVMLSource{lib: lib, log: log.With("component", "nvml"), now: time.Now}
}

// init initialises NVML once. A failed Init is tried again on the next
// Snapshot: with the idle-driver policy "nvidia" the driver may be loaded
// after the agent starts. Retrying is cheap: when libnvidia-ml is present
// go-nvml keeps it loaded after a failed nvmlInit (only its reference count
// grows), and when it is absent the attempt is one failed dlopen.
// Callers hold s.mu.
func (s *NVMLSource) init() error {
	if s.inited {
		return nil
	}
	ret, err := callNVML(func() nvml.Return { return s.lib.Init() })
	if err != nil {
		return fmt.Errorf("NVML init: %w", err)
	}
	switch ret {
	case nvml.SUCCESS:
		s.inited = true
		return nil
	case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
		// No libnvidia-ml, or no nvidia.ko (every card on vfio-pci): both
		// normal on a passthrough host.
		return fmt.Errorf("%w: %s", ErrNVMLUnavailable, ret.Error())
	case nvml.ERROR_NO_PERMISSION:
		// The driver is there but the agent may not use it: a
		// misconfiguration worth a warning, not the normal no-driver case.
		return fmt.Errorf("NVML init: %s (the agent cannot open /dev/nvidiactl: run it as root, and without systemd's PrivateDevices=yes)", ret.Error())
	default:
		return fmt.Errorf("NVML init failed: %s (check the nvidia driver and libnvidia-ml versions match, e.g. with nvidia-smi)", ret.Error())
	}
}

// Shutdown releases NVML if Snapshot initialised it.
func (s *NVMLSource) Shutdown() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.inited {
		return nil
	}
	s.inited = false
	ret, err := callNVML(func() nvml.Return { return s.lib.Shutdown() })
	if err != nil {
		return fmt.Errorf("NVML shutdown: %w", err)
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("NVML shutdown: %s", ret.Error())
	}
	return nil
}

// Snapshot implements NVML. A device NVML cannot describe is logged and left
// out; it never fails the whole snapshot.
func (s *NVMLSource) Snapshot() (map[string]Facts, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.init(); err != nil {
		return nil, err
	}
	now := s.now()

	driver, ret := nvmlValue(func() (string, nvml.Return) { return s.lib.SystemGetDriverVersion() })
	if ret != nvml.SUCCESS {
		s.logCall("", "SystemGetDriverVersion", ret)
		driver = ""
	}
	count, ret := nvmlValue(func() (int, nvml.Return) { return s.lib.DeviceGetCount() })
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML: count GPUs: %s (is the nvidia driver healthy? check nvidia-smi and dmesg)", ret.Error())
	}

	type found struct {
		addr string
		dev  nvml.Device
	}
	var devs []found
	out := make(map[string]Facts, count)
	for i := range count {
		dev, ret := nvmlValue(func() (nvml.Device, nvml.Return) { return s.lib.DeviceGetHandleByIndex(i) })
		if ret != nvml.SUCCESS || dev == nil {
			s.log.Warn("NVML cannot open a GPU; it is left to sysfs", "index", i, "error", ret.Error())
			continue
		}
		addr, err := s.address(dev)
		if err != nil {
			s.log.Warn("NVML GPU has no usable PCI address; its facts are ignored", "index", i, "error", err)
			continue
		}
		if _, dup := out[addr]; dup {
			s.log.Warn("NVML reports two GPUs at one PCI address; keeping the first", "pci_address", addr, "index", i)
			continue
		}
		out[addr] = s.facts(addr, dev, driver, now)
		devs = append(devs, found{addr, dev})
	}

	// Topology is a property of pairs; NVML answers only between devices it
	// can see, so distances to cards already on vfio-pci come from the cache.
	// A driver that does not support it for one pair supports it for none,
	// so the first NOT_SUPPORTED ends the pairwise walk (n² calls, n² logs).
	unsupported := false
	for i := 0; i < len(devs) && !unsupported; i++ {
		for j := i + 1; j < len(devs) && !unsupported; j++ {
			a, b := devs[i], devs[j]
			lvl, ret := nvmlValue(func() (nvml.GpuTopologyLevel, nvml.Return) {
				return a.dev.GetTopologyCommonAncestor(b.dev)
			})
			if ret != nvml.SUCCESS {
				s.logCall(a.addr, "GetTopologyCommonAncestor", ret)
				unsupported = ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND
				continue
			}
			for _, p := range [][2]string{{a.addr, b.addr}, {b.addr, a.addr}} {
				f := out[p[0]]
				if f.Distance == nil {
					f.Distance = make(map[string]int)
				}
				f.Distance[p[1]] = int(lvl)
				out[p[0]] = f
			}
		}
	}
	return out, nil
}

// address returns the sysfs address of an NVML device.
func (s *NVMLSource) address(dev nvml.Device) (string, error) {
	pci, ret := nvmlValue(dev.GetPciInfo)
	if ret != nvml.SUCCESS {
		return "", fmt.Errorf("GetPciInfo: %s", ret.Error())
	}
	for _, raw := range [][]int8{pci.BusId[:], pci.BusIdLegacy[:]} {
		if id := cString(raw); id != "" {
			return vfio.AddressFromNVMLBusID(id)
		}
	}
	// Domain/Bus/Device are not used as a fallback: a driver (or mock) that
	// leaves the bus ID empty leaves them zero too, and guessing
	// 0000:00:00.0 would pin one card's facts on another address.
	return "", errors.New("GetPciInfo returned no bus ID")
}

// facts reads one device. Every call is optional: what NVML cannot say
// stays unknown.
func (s *NVMLSource) facts(addr string, dev nvml.Device, driver string, now time.Time) Facts {
	f := Facts{NUMANode: -1, DriverVersion: driver, ObservedAt: now}
	if v, ret := nvmlValue(dev.GetUUID); ret == nvml.SUCCESS {
		f.UUID = v
	} else {
		s.logCall(addr, "GetUUID", ret)
	}
	if v, ret := nvmlValue(dev.GetSerial); ret == nvml.SUCCESS {
		f.Serial = strings.TrimSpace(v)
	} else {
		s.logCall(addr, "GetSerial", ret)
	}
	if v, ret := nvmlValue(dev.GetName); ret == nvml.SUCCESS {
		f.Name = v
	} else {
		s.logCall(addr, "GetName", ret)
	}
	if v, ret := nvmlValue(dev.GetMemoryInfo); ret == nvml.SUCCESS {
		f.MemoryBytes = v.Total
	} else {
		s.logCall(addr, "GetMemoryInfo", ret)
	}
	if v, ret := nvmlValue(dev.GetNumaNodeId); ret == nvml.SUCCESS && v >= 0 {
		f.NUMANode = v
	} else if ret != nvml.SUCCESS {
		s.logCall(addr, "GetNumaNodeId", ret)
	}
	return f
}

// logCall logs a failed optional call: quietly when the driver simply does
// not offer it, as a warning otherwise (a lost GPU, a driver error).
func (s *NVMLSource) logCall(addr, call string, ret nvml.Return) {
	level := slog.LevelWarn
	if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND {
		level = slog.LevelDebug
	}
	s.log.Log(context.Background(), level, "NVML call failed; field left unknown", "pci_address", addr, "call", call, "error", ret.Error())
}

// nvmlValue runs one NVML call, turning a panic into ERROR_NOT_SUPPORTED.
//
// Why recover at all: go-nvml's mocks (which `--simulate` and the tests run
// on) panic on any call whose Func is not set, and the server mocks set only
// a subset (no GetSerial, GetNumaNodeId or GetTopologyCommonAncestor). A
// missing call means "this source cannot tell us", which for optional facts
// is exactly NOT_SUPPORTED; crashing the agent for it would be wrong. The
// real library does not panic: against an older libnvidia-ml that lacks a
// symbol it returns ERROR_FUNCTION_NOT_FOUND, which is handled the same way.
func nvmlValue[T any](call func() (T, nvml.Return)) (v T, ret nvml.Return) {
	defer func() {
		if recover() != nil {
			var zero T
			v, ret = zero, nvml.ERROR_NOT_SUPPORTED
		}
	}()
	return call()
}

// callNVML runs a call that returns only a status, turning a panic into an
// error: for Init and Shutdown "not supported" would be a lie.
func callNVML(call func() nvml.Return) (ret nvml.Return, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("NVML library panicked: %v", r)
		}
	}()
	return call(), nil
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

// cloneFacts returns f with its own Distance map.
func cloneFacts(f Facts) Facts {
	f.Distance = maps.Clone(f.Distance)
	return f
}
