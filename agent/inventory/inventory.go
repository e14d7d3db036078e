package inventory

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/gpuherd/gpuherd/vfio"
)

// GPU is one NVIDIA GPU of this server as the inventory sees it. Address is
// its identity; everything else describes it.
type GPU struct {
	Address           string `json:"pci_address"` // sysfs PCI address, "0000:3b:00.0"
	Model             string `json:"model"`       // catalog name, or "vvvv:dddd" (UnknownModelName) when KnownModel is false
	VendorID          PCIID  `json:"vendor_id"`
	DeviceID          PCIID  `json:"device_id"`
	SubsystemVendorID PCIID  `json:"subsystem_vendor_id"`
	SubsystemDeviceID PCIID  `json:"subsystem_device_id"`
	KnownModel        bool   `json:"known_model"`
	MemoryBytes       uint64 `json:"memory_bytes"` // the model's marketed memory (catalog); NVML's total only for an uncatalogued GPU; 0 unknown
	// NVMLMemoryBytes is the total NVML reported when it last saw the card
	// (less than the marketed figure: 45 GiB on an L40S); 0 never seen.
	NVMLMemoryBytes uint64   `json:"nvml_memory_bytes,omitempty"`
	NUMANode        int      `json:"numa_node"`           // -1 unknown
	PCIeRoot        string   `json:"pcie_root,omitempty"` // root complex, "pci0000:3a"; "" unknown
	IOMMUGroup      int      `json:"iommu_group"`         // -1 none
	Driver          string   `json:"driver"`              // "" when unbound
	Companions      []string `json:"companions,omitempty"`
	UUID            string   `json:"uuid,omitempty"`
	Serial          string   `json:"serial,omitempty"`
	Healthy         bool     `json:"healthy"`
	Health          string   `json:"health,omitempty"` // why it is unhealthy
	// Distance to the other GPUs of this server by address, as NVML's
	// topology level (smaller is closer); only pairs NVML ever answered for.
	Distance map[string]int `json:"distance,omitempty"`
}

// Source is the PCI side of the inventory; vfio.PCI implements it.
type Source interface {
	// Devices lists every PCI function of the host.
	Devices() ([]vfio.Device, error)
	// Health returns an error, saying why, when the device at addr is not
	// usable: it vanished from the bus, or its config space reads all-ones.
	Health(addr string) error
}

// FactStore keeps NVML's facts by PCI address across restarts and across the
// time a card spends on vfio-pci, where NVML cannot see it. The ledger
// implements it; data is opaque to the store.
type FactStore interface {
	PutFacts(addr string, data []byte) error
	Facts() (map[string][]byte, error)
}

// Option configures an Inventory.
type Option func(*Inventory)

// WithNVML adds an NVML source for UUID, serial, exact memory, NUMA and
// topology. Without it the inventory is sysfs (and cached facts) only.
func WithNVML(n NVML) Option { return func(inv *Inventory) { inv.nvml = n } }

// WithFactStore caches NVML's facts so they outlive NVML's view of a card.
func WithFactStore(s FactStore) Option { return func(inv *Inventory) { inv.store = s } }

// WithCatalog replaces the built-in model catalog (typically with the
// built-in one merged with the operator's models).
func WithCatalog(c *Catalog) Option { return func(inv *Inventory) { inv.catalog = c } }

// WithGPUDevices makes devices with these exact vendor:device IDs count as
// GPUs besides NVIDIA's display-class functions, whatever their vendor and
// class. It exists for tests on emulated hardware (QEMU's edu or
// pci-testdev standing in for GPUs under a real kernel, tools/test/realkernel) and
// is empty on a real server. Such a device is offered under its PCI ID
// ("1b36:0005"); bridges and virtual functions never count, and a wildcard
// entry ("1b36:*") is ignored.
func WithGPUDevices(ids vfio.AllowList) Option {
	return func(inv *Inventory) {
		inv.extraGPUs = nil
		for _, e := range ids {
			if !e.AnyDevice {
				inv.extraGPUs = append(inv.extraGPUs, e)
			}
		}
	}
}

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(inv *Inventory) { inv.log = l } }

// Inventory finds this server's GPUs: sysfs first, NVML second.
type Inventory struct {
	src     Source
	nvml    NVML
	store   FactStore
	catalog *Catalog
	log     *slog.Logger
	// extraGPUs are vendor:device IDs counted as GPUs (tests only).
	extraGPUs vfio.AllowList
	// denied are PCI addresses never offered (deny_devices).
	denied map[string]bool

	// mu serialises Discover: it reads, merges and writes back the fact
	// cache, and keeps the log-once state below.
	mu        sync.Mutex
	nvmlState string            // last NVML outcome logged: "ok", "unavailable" or the error text
	health    map[string]string // last health reason logged per address ("" healthy)
	warned    map[string]bool   // one-time warnings already given, by key
}

// New returns an inventory over src.
func New(src Source, opts ...Option) *Inventory {
	inv := &Inventory{src: src, health: make(map[string]string), warned: make(map[string]bool)}
	for _, o := range opts {
		o(inv)
	}
	if inv.catalog == nil {
		inv.catalog = DefaultCatalog()
	}
	if inv.log == nil {
		inv.log = slog.New(slog.DiscardHandler)
	}
	inv.log = inv.log.With("component", "inventory")
	return inv
}

// Catalog returns the model catalog the inventory names GPUs with.
func (inv *Inventory) Catalog() *Catalog { return inv.catalog }

// Discover lists this server's GPUs, sorted by address. Only failing to list
// PCI devices at all is an error; NVML or the fact store failing, or one
// device misbehaving, is logged and shows on that device.
func (inv *Inventory) Discover() ([]GPU, error) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.src == nil {
		return nil, errors.New("inventory: no PCI source configured")
	}
	devs, err := inv.src.Devices()
	if err != nil {
		return nil, fmt.Errorf("inventory: list PCI devices: %w (is sysfs mounted and readable?)", err)
	}

	groups := make(map[int][]vfio.Device)
	var gpus []vfio.Device
	for _, d := range devs {
		if d.IOMMUGroup >= 0 {
			groups[d.IOMMUGroup] = append(groups[d.IOMMUGroup], d)
		}
		if inv.isGPU(d) && !inv.denied[d.Address] {
			gpus = append(gpus, d)
		}
	}
	slices.SortFunc(gpus, func(a, b vfio.Device) int { return strings.Compare(a.Address, b.Address) })
	isGPU := make(map[string]bool, len(gpus))
	for _, d := range gpus {
		isGPU[d.Address] = true
	}

	live := inv.snapshot()
	cached := inv.cachedFacts()
	for addr := range live {
		if !isGPU[addr] {
			inv.warnOnce("nvml-extra/"+addr, "NVML reports a GPU that sysfs does not list as one; its facts are ignored", "pci_address", addr)
		}
	}

	out := make([]GPU, 0, len(gpus))
	for _, d := range gpus {
		g := inv.describe(d, groups[d.IOMMUGroup])
		f, have := inv.facts(d.Address, live, cached)
		if have {
			applyFacts(&g, f, isGPU)
		}
		if !g.KnownModel {
			inv.warnOnce("unknown-model/"+d.Address, "GPU not in the model catalog; offered under its PCI ID. Add it to the catalog to give it a model name",
				"pci_address", d.Address, "model", g.Model, "nvml_name", f.Name)
		}
		inv.checkHealth(&g, d)
		out = append(out, g)
	}
	return out, nil
}

// isGPU reports whether d is offered as a GPU.
func (inv *Inventory) isGPU(d vfio.Device) bool {
	if d.IsGPU() {
		// The non-GPU list wins over the class code so that an NVSwitch
		// can never be offered, whatever its firmware reports.
		return !inv.catalog.IsNonGPU(d.Device)
	}
	if d.Vendor == vfio.VendorNVIDIA && inv.catalog.IsNonGPU(d.Device) {
		return false
	}
	return inv.extraGPUs.Allows(d.Vendor, d.Device) && !d.VirtualFunction && d.Class>>16 != 0x06
}

// describe is what sysfs and the catalog say about a GPU.
func (inv *Inventory) describe(d vfio.Device, group []vfio.Device) GPU {
	m, known := inv.catalog.ModelOf(d.Device)
	if d.Vendor != vfio.VendorNVIDIA {
		// A test stand-in (WithGPUDevices): the catalog is NVIDIA's.
		m, known = Model{Name: UnknownModelName(d.Vendor, d.Device)}, false
	}
	g := GPU{
		Address:           d.Address,
		Model:             m.Name,
		VendorID:          PCIID(d.Vendor),
		DeviceID:          PCIID(d.Device),
		SubsystemVendorID: PCIID(d.SubsystemVendor),
		SubsystemDeviceID: PCIID(d.SubsystemDevice),
		KnownModel:        known,
		MemoryBytes:       m.MemoryBytes,
		NUMANode:          d.NUMANode,
		IOMMUGroup:        d.IOMMUGroup,
		Driver:            d.Driver,
		PCIeRoot:          d.PCIeRoot,
	}
	if d.IOMMUGroup >= 0 {
		for _, o := range group {
			if isCompanion(o, d.Address) && !inv.catalog.IsNonGPU(o.Device) {
				g.Companions = append(g.Companions, o.Address)
			}
		}
		slices.Sort(g.Companions)
	}
	return g
}

// isCompanion reports whether o is one of a card's own extra functions
// (HD audio, USB-C, UCSI) that must follow it to vfio-pci. Bridges and
// NVSwitches are not: they stay with the host.
func isCompanion(o vfio.Device, gpuAddr string) bool {
	return o.Address != gpuAddr && o.Vendor == vfio.VendorNVIDIA && !o.VirtualFunction &&
		!o.IsGPU() && o.Class>>16 != 0x06
}

// applyFacts overlays NVML's facts on what sysfs said.
func applyFacts(g *GPU, f Facts, isGPU map[string]bool) {
	g.UUID = f.UUID
	g.Serial = f.Serial
	// The model's memory is what the platform sells (48 GB for an L40S)
	// whichever driver the card is on; NVML's usable figure has its own field.
	g.NVMLMemoryBytes = f.MemoryBytes
	if g.MemoryBytes == 0 {
		g.MemoryBytes = f.MemoryBytes
	}
	// sysfs is authoritative for NUMA; NVML fills in only when the kernel
	// does not know (numa_node -1).
	if g.NUMANode < 0 && f.NUMANode >= 0 {
		g.NUMANode = f.NUMANode
	}
	for peer, lvl := range f.Distance {
		// A cached distance may name a card that has since left the box.
		if isGPU[peer] && peer != g.Address {
			if g.Distance == nil {
				g.Distance = make(map[string]int)
			}
			g.Distance[peer] = lvl
		}
	}
}

// checkHealth asks the PCI source about the device and logs changes.
func (inv *Inventory) checkHealth(g *GPU, d vfio.Device) {
	reason := ""
	if err := inv.src.Health(d.Address); err != nil {
		reason = err.Error()
	} else if d.IOMMUGroup < 0 {
		// Without an IOMMU group vfio-pci cannot hand the card to a VM, so
		// offering it would only fail later, at VM start.
		reason = "no IOMMU group: enable the IOMMU (intel_iommu=on or amd_iommu=on on the kernel command line) and reboot"
	}
	g.Healthy, g.Health = reason == "", reason
	prev, seen := inv.health[d.Address]
	inv.health[d.Address] = reason
	switch {
	case reason != "" && (!seen || prev != reason):
		inv.log.Warn("GPU unhealthy; it will not be offered", "pci_address", d.Address, "model", g.Model, "reason", reason)
	case reason == "" && seen && prev != "":
		inv.log.Info("GPU healthy again", "pci_address", d.Address, "model", g.Model)
	}
}

// snapshot asks NVML, logging only changes in its availability: a host
// without the driver would otherwise log the same line every cycle.
func (inv *Inventory) snapshot() map[string]Facts {
	if inv.nvml == nil {
		return nil
	}
	facts, err := inv.nvml.Snapshot()
	state := "ok"
	switch {
	case errors.Is(err, ErrNVMLUnavailable):
		state = "unavailable"
	case err != nil:
		state = err.Error()
	}
	if state != inv.nvmlState {
		switch state {
		case "ok":
			inv.log.Info("NVML available: UUID, serial, memory and topology come from it for cards on the host driver", "gpus", len(facts))
		case "unavailable":
			inv.log.Info("NVML unavailable (normal on a passthrough host): inventory from sysfs and cached facts", "reason", err)
		default:
			inv.log.Warn("NVML failed: inventory from sysfs and cached facts", "error", err)
		}
		inv.nvmlState = state
	}
	if err != nil {
		return nil
	}
	return facts
}

// cachedFacts reads the fact cache. A store that fails, or an entry that
// does not decode, costs only the cached facts.
func (inv *Inventory) cachedFacts() map[string]Facts {
	if inv.store == nil {
		return nil
	}
	raw, err := inv.store.Facts()
	if err != nil {
		inv.log.Warn("cannot read cached GPU facts; going on without them", "error", err)
		return nil
	}
	out := make(map[string]Facts, len(raw))
	for addr, data := range raw {
		var f Facts
		if err := json.Unmarshal(data, &f); err != nil {
			inv.warnOnce("bad-cache/"+addr, "cached GPU facts do not decode; ignoring them until NVML sees the card again", "pci_address", addr, "error", err)
			continue
		}
		out[addr] = f
	}
	return out
}

// facts returns the facts to use for addr: NVML's when it sees the card now
// (merged with the cache and written back when they changed), else the
// cached ones.
func (inv *Inventory) facts(addr string, live, cached map[string]Facts) (Facts, bool) {
	old, haveOld := cached[addr]
	now, haveNow := live[addr]
	if !haveNow {
		return old, haveOld
	}
	merged := mergeFacts(now, old, haveOld)
	if inv.store != nil && (!haveOld || !sameFacts(merged, old)) {
		data, err := json.Marshal(merged)
		if err == nil {
			err = inv.store.PutFacts(addr, data)
		}
		if err != nil {
			inv.log.Warn("cannot cache GPU facts; they will be lost when the card moves to vfio-pci", "pci_address", addr, "error", err)
		}
	}
	return merged, true
}

// mergeFacts combines NVML's current facts about the card at an address
// with the cached ones. While it is the same card (same UUID), a fact NVML
// cannot give now keeps its cached value, and distances to peers NVML no
// longer sees (they moved to vfio-pci) are kept: topology does not change
// while the cards stay in their slots. A different UUID means the card was
// swapped, and nothing of the old one is kept.
func mergeFacts(now, old Facts, haveOld bool) Facts {
	out := cloneFacts(now)
	if !haveOld || (now.UUID != "" && old.UUID != "" && now.UUID != old.UUID) {
		return out
	}
	if out.UUID == "" {
		out.UUID = old.UUID
	}
	if out.Serial == "" {
		out.Serial = old.Serial
	}
	if out.Name == "" {
		out.Name = old.Name
	}
	if out.MemoryBytes == 0 {
		out.MemoryBytes = old.MemoryBytes
	}
	if out.NUMANode < 0 {
		out.NUMANode = old.NUMANode
	}
	if out.DriverVersion == "" {
		out.DriverVersion = old.DriverVersion
	}
	for peer, lvl := range old.Distance {
		if _, ok := out.Distance[peer]; !ok {
			if out.Distance == nil {
				out.Distance = make(map[string]int)
			}
			out.Distance[peer] = lvl
		}
	}
	return out
}

// sameFacts compares facts ignoring ObservedAt. The cache is written only
// when a fact changes, not on every discovery: the ledger fsyncs each write.
func sameFacts(a, b Facts) bool {
	return a.UUID == b.UUID && a.Serial == b.Serial && a.Name == b.Name &&
		a.MemoryBytes == b.MemoryBytes && a.NUMANode == b.NUMANode &&
		a.DriverVersion == b.DriverVersion && maps.Equal(a.Distance, b.Distance)
}

func (inv *Inventory) warnOnce(key, msg string, args ...any) {
	if inv.warned[key] {
		return
	}
	inv.warned[key] = true
	inv.log.Warn(msg, args...)
}
