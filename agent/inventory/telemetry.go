package inventory

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrXIDUnsupported means this NVML cannot deliver XID events: the driver
// refuses them on every GPU, or the library is a mock without event sets
// (`--simulate`). The caller logs it once and carries on without XIDs.
var ErrXIDUnsupported = errors.New("NVML XID events not supported")

const (
	// xidWaitTimeout bounds each wait for an event, and so how long WatchXID
	// takes to notice that its context ended: NVML's wait cannot be
	// interrupted from Go.
	xidWaitTimeout = time.Second
	// xidRescanInterval is how often WatchXID looks for GPUs that came to the
	// host driver (idle policy "nvidia") or left it, so that it listens to
	// the cards NVML sees now rather than those it saw at start.
	xidRescanInterval = 30 * time.Second
)

// Telemetry is what NVML measures on one GPU right now, in base units.
//
// Each reading has a Has flag rather than a sentinel: NVML may answer one
// call and not another (a board without a power sensor, an old driver), and
// a reading it did not give must stay absent rather than look like 0 W or
// 0 °C on a dashboard.
type Telemetry struct {
	TemperatureCelsius float64 // GPU core temperature
	PowerWatts         float64 // board power draw now
	EnergyJoules       float64 // energy since the driver was last loaded; only grows until then
	MemoryUsedBytes    uint64  // framebuffer in use
	MemoryTotalBytes   uint64  // framebuffer size as NVML reports it
	Utilization        float64 // share of the last sample period a kernel ran, 0..1

	HasTemperature bool
	HasPower       bool
	HasEnergy      bool
	HasMemory      bool // MemoryUsedBytes and MemoryTotalBytes come from one call
	HasUtilization bool
}

// Telemetry reads the current telemetry of the GPUs NVML sees now (those on
// the host driver), keyed by sysfs PCI address. A GPU on vfio-pci is absent:
// NVML cannot see it, and its last readings would be stale, not current.
//
// It returns an error wrapping ErrNVMLUnavailable when NVML cannot be used
// on this host, and an error when NVML cannot list its GPUs. A reading one
// GPU does not give is left out of that GPU's Telemetry and never fails the
// call. It makes about six NVML calls per GPU; a caller on a hot path (a
// metrics scrape) should bound how often it calls.
func (s *NVMLSource) Telemetry() (map[string]Telemetry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.init(); err != nil {
		return nil, err
	}
	count, ret := nvmlValue(func() (int, nvml.Return) { return s.lib.DeviceGetCount() })
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML telemetry: count GPUs: %s (is the nvidia driver healthy? check nvidia-smi and dmesg)", ret.Error())
	}
	out := make(map[string]Telemetry, count)
	for i := range count {
		dev, ret := nvmlValue(func() (nvml.Device, nvml.Return) { return s.lib.DeviceGetHandleByIndex(i) })
		if ret != nvml.SUCCESS || dev == nil {
			// Debug, not warn: this runs on every scrape, and a card that
			// left the driver between count and handle is a normal race.
			// Snapshot warns about GPUs NVML cannot open.
			s.log.Debug("NVML cannot open a GPU for telemetry", "index", i, "error", ret.Error())
			continue
		}
		addr, err := s.address(dev)
		if err != nil {
			s.log.Debug("NVML GPU has no usable PCI address; its telemetry is ignored", "index", i, "error", err)
			continue
		}
		if _, dup := out[addr]; dup {
			continue // Snapshot logs this; keeping the first matches it
		}
		out[addr] = s.readTelemetry(addr, dev)
	}
	return out, nil
}

// readTelemetry reads one GPU. Failures are logged at debug level only: they
// repeat on every scrape, and a lost GPU is reported by the health check.
func (s *NVMLSource) readTelemetry(addr string, dev nvml.Device) Telemetry {
	var t Telemetry
	failed := func(call string, ret nvml.Return) {
		s.log.Debug("NVML telemetry call failed; reading left out", "pci_address", addr, "call", call, "error", ret.Error())
	}
	if v, ret := nvmlValue(func() (uint32, nvml.Return) { return dev.GetTemperature(nvml.TEMPERATURE_GPU) }); ret == nvml.SUCCESS {
		t.TemperatureCelsius, t.HasTemperature = float64(v), true
	} else {
		failed("GetTemperature", ret)
	}
	if v, ret := nvmlValue(dev.GetPowerUsage); ret == nvml.SUCCESS {
		t.PowerWatts, t.HasPower = float64(v)/1e3, true // milliwatts
	} else {
		failed("GetPowerUsage", ret)
	}
	if v, ret := nvmlValue(dev.GetTotalEnergyConsumption); ret == nvml.SUCCESS {
		t.EnergyJoules, t.HasEnergy = float64(v)/1e3, true // millijoules
	} else {
		failed("GetTotalEnergyConsumption", ret)
	}
	if v, ret := nvmlValue(dev.GetMemoryInfo); ret == nvml.SUCCESS {
		t.MemoryUsedBytes, t.MemoryTotalBytes, t.HasMemory = v.Used, v.Total, true
	} else {
		failed("GetMemoryInfo", ret)
	}
	if v, ret := nvmlValue(dev.GetUtilizationRates); ret == nvml.SUCCESS {
		t.Utilization, t.HasUtilization = float64(v.Gpu)/100, true // percent
	} else {
		failed("GetUtilizationRates", ret)
	}
	return t
}

// WatchXID calls report with the sysfs PCI address and the XID number of
// every critical XID error NVML reports on a GPU of the host driver, until
// ctx ends; it then returns nil. report runs on WatchXID's goroutine and
// should be quick.
//
// It returns at once with an error wrapping ErrNVMLUnavailable when NVML
// cannot be used, or ErrXIDUnsupported when it cannot deliver events; both
// are normal on a passthrough host or in a simulation, to be logged once.
// It returns an error naming the call when NVML fails while watching.
//
// WatchXID holds its own NVML reference (Init and Shutdown are counted), so
// it neither depends on nor disturbs Snapshot, Telemetry and Shutdown.
func (s *NVMLSource) WatchXID(ctx context.Context, report func(addr string, xid uint64)) error {
	ret, err := callNVML(s.lib.Init)
	if err != nil {
		return fmt.Errorf("NVML init for XID events: %w", err)
	}
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("%w: %s", ErrNVMLUnavailable, ret.Error())
	default:
		return fmt.Errorf("NVML init for XID events: %s", ret.Error())
	}
	defer func() {
		if ret, err := callNVML(s.lib.Shutdown); err != nil || ret != nvml.SUCCESS {
			s.log.Warn("NVML shutdown after watching XID events failed", "return", ret.Error(), "error", err)
		}
	}()

	w := &xidWatch{s: s}
	defer w.free()
	lost := 0 // consecutive ERROR_GPU_IS_LOST answers
	for {
		if err := w.rescanIfDue(); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		data, ret := nvmlValue(func() (nvml.EventData, nvml.Return) {
			return w.set.Wait(uint32(xidWaitTimeout / time.Millisecond))
		})
		switch ret {
		case nvml.SUCCESS:
			lost = 0
			w.deliver(data, report)
		case nvml.ERROR_TIMEOUT:
			lost = 0
		case nvml.ERROR_GPU_IS_LOST:
			// A registered card fell off the bus. A new set, registered
			// only on the cards that still answer, lets the others be
			// watched; if the new set says the same at once, the watch
			// itself is broken.
			lost++
			if lost > 1 {
				return fmt.Errorf("NVML XID events: EventSetWait: %s after re-registering the GPUs (check nvidia-smi and dmesg)", ret.Error())
			}
			w.stale, w.scannedAt = true, time.Time{}
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
			return fmt.Errorf("%w: EventSetWait: %s", ErrXIDUnsupported, ret.Error())
		default:
			return fmt.Errorf("NVML XID events: EventSetWait: %s", ret.Error())
		}
	}
}

// xidWatch is the event set of one WatchXID call and the GPUs it covers.
type xidWatch struct {
	s         *NVMLSource
	set       nvml.EventSet
	seen      []string  // sorted addresses NVML showed at the last rebuild
	scannedAt time.Time // zero forces a rescan
	stale     bool      // the set must be rebuilt even if seen is unchanged
}

// rescanIfDue rebuilds the event set when the GPUs NVML sees have changed
// since the last look. A new set rather than adding to the old one: NVML
// has no call to unregister a device that left the host driver.
func (w *xidWatch) rescanIfDue() error {
	now := w.s.now()
	if w.set != nil && !w.scannedAt.IsZero() && now.Sub(w.scannedAt) < xidRescanInterval {
		return nil
	}
	w.scannedAt = now
	devs, err := w.visible()
	if err != nil {
		return err
	}
	addrs := slices.Sorted(maps.Keys(devs))
	if w.set != nil && !w.stale && slices.Equal(addrs, w.seen) {
		return nil
	}
	w.free()
	set, ret := nvmlValue(w.s.lib.EventSetCreate)
	switch {
	case ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND:
		return fmt.Errorf("%w: EventSetCreate: %s", ErrXIDUnsupported, ret.Error())
	case ret != nvml.SUCCESS || set == nil:
		return fmt.Errorf("NVML XID events: EventSetCreate: %s", ret.Error())
	}
	w.set = set
	registered := 0
	for _, addr := range addrs {
		ret, err := callNVML(func() nvml.Return { return devs[addr].RegisterEvents(nvml.EventTypeXidCriticalError, set) })
		if err != nil {
			ret = nvml.ERROR_NOT_SUPPORTED // a mock without RegisterEvents
		}
		if ret != nvml.SUCCESS {
			w.s.logCall(addr, "RegisterEvents(XidCriticalError)", ret)
			continue
		}
		registered++
	}
	if len(addrs) > 0 && registered == 0 {
		return fmt.Errorf("%w: RegisterEvents refused on all %d GPUs of the host driver", ErrXIDUnsupported, len(addrs))
	}
	w.seen, w.stale = addrs, false
	w.s.log.Debug("watching XID events", "gpus", registered, "visible", len(addrs))
	return nil
}

// visible returns the GPUs NVML sees now by sysfs address.
func (w *xidWatch) visible() (map[string]nvml.Device, error) {
	count, ret := nvmlValue(func() (int, nvml.Return) { return w.s.lib.DeviceGetCount() })
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML XID events: count GPUs: %s", ret.Error())
	}
	out := make(map[string]nvml.Device, count)
	for i := range count {
		dev, ret := nvmlValue(func() (nvml.Device, nvml.Return) { return w.s.lib.DeviceGetHandleByIndex(i) })
		if ret != nvml.SUCCESS || dev == nil {
			continue // left the driver since the count; the next rescan settles it
		}
		addr, err := w.s.address(dev)
		if err != nil {
			continue // Snapshot warns about it; no address, nothing to report against
		}
		if _, dup := out[addr]; !dup {
			out[addr] = dev
		}
	}
	return out, nil
}

// deliver hands one event to report, naming the GPU by its sysfs address.
func (w *xidWatch) deliver(data nvml.EventData, report func(addr string, xid uint64)) {
	if data.EventType != nvml.EventTypeXidCriticalError {
		return
	}
	if data.Device == nil {
		w.s.log.Warn("NVML reported an XID error without a GPU; it is not counted", "xid", data.EventData)
		return
	}
	addr, err := w.s.address(data.Device)
	if err != nil {
		w.s.log.Warn("NVML reported an XID error on a GPU without a usable PCI address; it is not counted", "xid", data.EventData, "error", err)
		return
	}
	report(addr, data.EventData)
}

// free releases the event set, if any.
func (w *xidWatch) free() {
	if w.set == nil {
		return
	}
	set := w.set
	w.set = nil
	if ret, err := callNVML(set.Free); err != nil || ret != nvml.SUCCESS {
		w.s.log.Debug("NVML EventSetFree failed", "return", ret.Error(), "error", err)
	}
}
