package sim

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// Limits of the layout: two sockets, and the buses the address plan has room for.
const (
	numaNodes        = 2
	maxGPUsPerEntry  = 64
	maxGPUsPerNode   = 32
	maxNVSwitches    = 8
	firstIOMMUGroup  = 16 // real servers give the low numbers to root ports and bridges
	driverNone       = "none"
	driverAudio      = "snd_hda_intel"
	maxNameLength    = 63
	nvswitchFirstBus = 0x05
)

// gpuBuses are the first buses of the GPU slots on each NUMA node, those of a
// DGX H100; slot i sits on gpuBuses[node][i%4] + i/4.
var gpuBuses = [numaNodes][4]int{{0x18, 0x2a, 0x3a, 0x5d}, {0x9a, 0xab, 0xba, 0xdb}}

// slotsPerNode is how many slots the bus plan holds per node before two slots
// would share a bus; a few are spare for buses that extra devices occupy.
const slotsPerNode = 4 * 9

var (
	addressRE    = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
	nameRE       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	driverNameRE = regexp.MustCompile(`^[a-z0-9_][a-z0-9_.-]*$`)
)

// fileProfile is the YAML form of a profile; see the package documentation.
type fileProfile struct {
	Name         string      `yaml:"name"`
	Description  string      `yaml:"description"`
	HostDrivers  []string    `yaml:"host_drivers"`
	NVML         bool        `yaml:"nvml"`
	GPUs         []fileGPU   `yaml:"gpus"`
	NVSwitches   int         `yaml:"nvswitches"`
	ExtraDevices []fileExtra `yaml:"extra_devices"`
}

type fileGPU struct {
	Device    string `yaml:"device"`
	Model     string `yaml:"model"`
	Count     *int   `yaml:"count"`
	NUMANode  *int   `yaml:"numa_node"`
	Audio     bool   `yaml:"audio"`
	MemoryMiB uint64 `yaml:"memory_mib"`
	Name      string `yaml:"name"`
	Driver    string `yaml:"driver"`
	Address   string `yaml:"address"`
}

type fileExtra struct {
	Address      string `yaml:"address"`
	Vendor       string `yaml:"vendor"`
	Device       string `yaml:"device"`
	Class        string `yaml:"class"`
	Driver       string `yaml:"driver"`
	NUMANode     *int   `yaml:"numa_node"`
	IOMMUGroupOf string `yaml:"iommu_group_of"`
}

// Profile is a simulated server, validated and laid out: every PCI function
// has its address, IOMMU group, NUMA node and boot driver.
type Profile struct {
	Name        string // the profile's name: the state dir and the GPU UUIDs are tied to it
	Description string // one line for people
	Source      string // "builtin" or the file it was read from

	nvml   bool
	gpus   []GPU
	models map[string]gpuModel // by GPU address
	kernel fakekernel.Config
}

// GPU is one simulated card as the profile lays it out.
type GPU struct {
	Address    string // PCI address in sysfs form, 0000:3b:00.0
	Device     uint16 // PCI device ID (vendor 10de)
	Name       string // what NVML calls it
	MemoryMiB  uint64 // what NVML reports as total memory
	NUMANode   int
	Slot       int    // rank by address among the GPUs of its NUMA node; Slot/2 is its PCIe switch
	IOMMUGroup int    // shared with its companion functions and any iommu_group_of device
	Audio      string // address of its HD audio function; "" without one
	Driver     string // driver at boot; "" for none
	UUID       string // deterministic: derived from the profile name and the address
	Serial     string // deterministic, like UUID
}

// gpuModel is what NVML says about one GPU of the profile.
type gpuModel struct {
	nvml      gpus.Config
	idleWatts uint32
}

// HasNVML reports whether NVML answers on the simulated server.
func (p *Profile) HasNVML() bool { return p.nvml }

// GPUs returns the profile's cards in address order.
func (p *Profile) GPUs() []GPU { return slices.Clone(p.gpus) }

// KernelConfig returns the simulated machine at boot, for fakekernel.New or
// fakekernel.Open.
func (p *Profile) KernelConfig() fakekernel.Config {
	return fakekernel.Config{
		Drivers: slices.Clone(p.kernel.Drivers),
		Devices: slices.Clone(p.kernel.Devices),
	}
}

// Parse reads a profile in the YAML format described in the package
// documentation; source names it in errors.
func Parse(data []byte, source string) (*Profile, error) {
	var f fileProfile
	if err := decodeStrict(data, &f); err != nil {
		return nil, fmt.Errorf("profile %s: %w", source, err)
	}
	p, problems := f.layout()
	if len(problems) > 0 {
		return nil, fmt.Errorf("profile %s: %s", source, strings.Join(problems, "; "))
	}
	p.Source = source
	return p, nil
}

// placed is one PCI function while the layout is being built.
type placed struct {
	dev     fakekernel.Function
	origin  string // key path of the entry that made it, for error messages
	groupOf string // address of the function whose IOMMU group it joins; "" for its own
}

// layout validates f and lays out the machine, or reports every problem it
// found, each prefixed by its key path.
func (f *fileProfile) layout() (*Profile, []string) {
	var problems []string
	bad := func(path, format string, args ...any) {
		problems = append(problems, path+": "+fmt.Sprintf(format, args...))
	}

	switch {
	case f.Name == "":
		bad("name", "required")
	case len(f.Name) > maxNameLength || !nameRE.MatchString(f.Name):
		bad("name", "%q must be at most %d letters, digits, '.', '_' or '-'", f.Name, maxNameLength)
	}

	loaded := map[string]bool{vfio.DriverVFIO: true}
	var drivers []string
	for i, d := range f.HostDrivers {
		path := fmt.Sprintf("host_drivers[%d]", i)
		switch {
		case !driverNameRE.MatchString(d):
			bad(path, "%q is not a driver name", d)
		case d == vfio.DriverVFIO:
			// Always loaded; listing it is harmless.
		case loaded[d]:
			bad(path, "%q is listed twice", d)
		default:
			loaded[d] = true
			drivers = append(drivers, d)
		}
	}
	hasNVIDIA := loaded[vfio.DriverNVIDIA]
	if f.NVML && !hasNVIDIA {
		bad("nvml", "true needs nvidia in host_drivers: NVML answers only through the nvidia driver")
	}
	if f.NVSwitches < 0 || f.NVSwitches > maxNVSwitches {
		bad("nvswitches", "must be between 0 and %d", maxNVSwitches)
	}

	// checkDriver resolves a driver key: "" is the default, "none" no driver.
	checkDriver := func(path, d, def string) string {
		switch d {
		case "":
			return def
		case driverNone:
			return ""
		}
		if !loaded[d] {
			bad(path, "%q is not loaded; add it to host_drivers", d)
		}
		return d
	}
	defaultGPUDriver := ""
	if hasNVIDIA {
		defaultGPUDriver = vfio.DriverNVIDIA
	}

	// Expand the gpus entries into single cards.
	type card struct {
		origin  string
		m       model
		name    string
		memory  uint64
		numa    int // -1: spread automatically
		address string
		audio   bool
		driver  string
	}
	var cards []card
	for i, g := range f.GPUs {
		path := fmt.Sprintf("gpus[%d]", i)
		var m model
		switch {
		case g.Device != "" && g.Model != "":
			bad(path, "set device or model, not both")
			continue
		case g.Device != "":
			id, err := parseHex(g.Device, 4)
			if err != nil {
				bad(path+".device", "%q is not a PCI device ID (4 hex digits, e.g. \"26b9\")", g.Device)
				continue
			}
			var ok bool
			if m, ok = modelByDevice(uint16(id)); !ok {
				m = unknownModel(uint16(id))
			}
		case g.Model != "":
			var ok bool
			if m, ok = modelByName(g.Model); !ok {
				bad(path+".model", "unknown model %q; known: %s (or give its PCI device ID as device)", g.Model, strings.Join(modelNames(), ", "))
				continue
			}
		default:
			bad(path, "device or model is required")
			continue
		}
		count := 1
		if g.Count != nil {
			count = *g.Count
		}
		if count < 1 || count > maxGPUsPerEntry {
			bad(path+".count", "must be between 1 and %d", maxGPUsPerEntry)
			continue
		}
		numa := -1
		if g.NUMANode != nil {
			numa = *g.NUMANode
			if numa < 0 || numa >= numaNodes {
				bad(path+".numa_node", "must be 0 or 1")
				continue
			}
		}
		if g.Address != "" {
			switch {
			case count != 1:
				bad(path+".address", "only allowed with count 1")
				continue
			case !addressRE.MatchString(g.Address) || !strings.HasSuffix(g.Address, ".0"):
				bad(path+".address", "%q must be a function 0 address like 0000:3b:00.0 (lower case)", g.Address)
				continue
			}
			if numa < 0 {
				numa = nodeOfAddress(g.Address)
			}
		}
		memory := m.nvml.MemoryMB
		if g.MemoryMiB != 0 {
			memory = g.MemoryMiB
		}
		if memory == 0 && f.NVML {
			bad(path+".memory_mib", "required: the simulation does not know device %04x", m.device)
		}
		name := m.nvml.Name
		if g.Name != "" {
			name = g.Name
		}
		driver := checkDriver(path+".driver", g.Driver, defaultGPUDriver)
		for n := range count {
			c := card{origin: path, m: m, name: name, memory: memory, numa: numa, address: g.Address, audio: g.Audio, driver: driver}
			if count > 1 {
				c.origin = fmt.Sprintf("%s (card %d)", path, n+1)
			}
			cards = append(cards, c)
		}
	}

	// Spread the cards without a NUMA node: the first half on node 0.
	var spread int
	for _, c := range cards {
		if c.numa < 0 {
			spread++
		}
	}
	perNode := [numaNodes]int{}
	k := 0
	for i := range cards {
		if cards[i].numa < 0 {
			cards[i].numa = 0
			if k >= (spread+1)/2 {
				cards[i].numa = 1
			}
			k++
		}
		if cards[i].address == "" {
			perNode[cards[i].numa]++
		}
	}
	for node, n := range perNode {
		if n > maxGPUsPerNode {
			bad("gpus", "%d GPUs on NUMA node %d; at most %d fit", n, node, maxGPUsPerNode)
		}
	}

	// Extra devices are placed first so that the GPU slots step around their buses.
	var all []*placed
	usedBus := map[string]bool{}
	for _, c := range cards {
		if c.address != "" {
			usedBus[c.address[:7]] = true
		}
	}
	for i, e := range f.ExtraDevices {
		path := fmt.Sprintf("extra_devices[%d]", i)
		ok := true
		if !addressRE.MatchString(e.Address) {
			bad(path+".address", "%q must be a PCI address like 0000:5e:00.0 (lower case)", e.Address)
			ok = false
		}
		vendor, err := parseHex(e.Vendor, 4)
		if err != nil {
			bad(path+".vendor", "%q is not a PCI vendor ID (4 hex digits, e.g. \"144d\")", e.Vendor)
			ok = false
		}
		device, err := parseHex(e.Device, 4)
		if err != nil {
			bad(path+".device", "%q is not a PCI device ID (4 hex digits, e.g. \"a808\")", e.Device)
			ok = false
		}
		class, err := parseHex(e.Class, 6)
		if err != nil {
			bad(path+".class", "%q is not a PCI class (6 hex digits, e.g. \"010802\")", e.Class)
			ok = false
		}
		driver := checkDriver(path+".driver", e.Driver, "")
		if !ok {
			continue
		}
		numa := nodeOfAddress(e.Address)
		if e.NUMANode != nil {
			numa = *e.NUMANode
			if numa < 0 || numa >= numaNodes {
				bad(path+".numa_node", "must be 0 or 1")
			}
		}
		usedBus[e.Address[:7]] = true
		all = append(all, &placed{
			origin:  path,
			groupOf: e.IOMMUGroupOf,
			dev: fakekernel.Function{
				Address: e.Address, Vendor: uint16(vendor), Device: uint16(device),
				SubsystemVendor: uint16(vendor), Class: uint32(class), NUMANode: numa, Driver: driver,
			},
		})
	}

	nExtras := len(all)
	for n := range f.NVSwitches {
		addr := fmt.Sprintf("0000:%02x:00.0", nvswitchFirstBus+n)
		usedBus[addr[:7]] = true
		all = append(all, &placed{
			origin: fmt.Sprintf("nvswitches (switch %d)", n+1),
			dev: fakekernel.Function{
				Address: addr, Vendor: vfio.VendorNVIDIA, Device: deviceNVSwitch,
				SubsystemVendor: vfio.VendorNVIDIA, Class: vfio.ClassNVSwitch, NUMANode: 0, Driver: defaultGPUDriver,
			},
		})
	}

	nextSlot := [numaNodes]int{}
	var gpuList []GPU
	gpuModels := map[string]gpuModel{}
	for _, c := range cards {
		addr := c.address
		if addr == "" {
			for addr == "" && nextSlot[c.numa] < slotsPerNode {
				i := nextSlot[c.numa]
				nextSlot[c.numa]++
				candidate := fmt.Sprintf("0000:%02x:00.0", gpuBuses[c.numa][i%4]+i/4)
				if !usedBus[candidate[:7]] {
					addr = candidate
				}
			}
			if addr == "" {
				bad(c.origin, "no free PCI bus left on NUMA node %d", c.numa)
				continue
			}
			usedBus[addr[:7]] = true
		}
		g := GPU{
			Address: addr, Device: c.m.device, Name: c.name, MemoryMiB: c.memory,
			NUMANode: c.numa, Driver: c.driver,
		}
		gm := gpuModel{nvml: c.m.nvml, idleWatts: c.m.idleWatts}
		gm.nvml.Name = c.name
		gm.nvml.MemoryMB = c.memory
		gpuModels[addr] = gm
		all = append(all, &placed{origin: c.origin, dev: fakekernel.Function{
			Address: addr, Vendor: vfio.VendorNVIDIA, Device: c.m.device,
			SubsystemVendor: vfio.VendorNVIDIA, Class: c.m.class, NUMANode: c.numa, Driver: c.driver,
		}})
		if c.audio {
			g.Audio = addr[:len(addr)-1] + "1"
			audioDriver := ""
			switch {
			case c.driver == vfio.DriverVFIO:
				audioDriver = vfio.DriverVFIO // as vfio-pci.ids= captures both functions
			case loaded[driverAudio]:
				audioDriver = driverAudio
			}
			audioID := c.m.audio
			if audioID == 0 {
				audioID = defaultAudioDevice
			}
			all = append(all, &placed{origin: c.origin + " audio", groupOf: addr, dev: fakekernel.Function{
				Address: g.Audio, Vendor: vfio.VendorNVIDIA, Device: audioID,
				SubsystemVendor: vfio.VendorNVIDIA, Class: vfio.ClassAudio, NUMANode: c.numa, Driver: audioDriver,
			}})
		}
		gpuList = append(gpuList, g)
	}

	// Every address once; a clash is blamed on the extra device, whose
	// address the author wrote, rather than on a generated one.
	byAddr := map[string]*placed{}
	for _, d := range append(slices.Clone(all[nExtras:]), all[:nExtras]...) {
		if prev, dup := byAddr[d.dev.Address]; dup {
			bad(addrPath(d), "%s is already taken by %s", d.dev.Address, prev.origin)
			continue
		}
		byAddr[d.dev.Address] = d
	}

	// IOMMU groups: one per owner, numbered in address order.
	slices.SortFunc(all, func(a, b *placed) int { return strings.Compare(a.dev.Address, b.dev.Address) })
	group := map[string]int{}
	for _, d := range all {
		if d.groupOf == "" {
			group[d.dev.Address] = firstIOMMUGroup + len(group)
		}
	}
	for _, d := range all {
		if d.groupOf == "" {
			d.dev.IOMMUGroup = group[d.dev.Address]
			continue
		}
		n, ok := group[d.groupOf]
		switch {
		case ok:
			d.dev.IOMMUGroup = n
		case byAddr[d.groupOf] != nil:
			bad(d.origin+".iommu_group_of", "%s itself joins another device's group; name that device instead", d.groupOf)
		default:
			bad(d.origin+".iommu_group_of", "no device at %q in this profile", d.groupOf)
		}
	}
	if len(problems) > 0 {
		return nil, problems
	}

	p := &Profile{Name: f.Name, Description: f.Description, nvml: f.NVML, models: gpuModels}
	p.kernel.Drivers = drivers
	for _, d := range all {
		p.kernel.Devices = append(p.kernel.Devices, d.dev)
	}
	slices.SortFunc(gpuList, func(a, b GPU) int { return strings.Compare(a.Address, b.Address) })
	rank := [numaNodes]int{}
	for i := range gpuList {
		g := &gpuList[i]
		g.IOMMUGroup = group[g.Address]
		g.Slot = rank[g.NUMANode]
		rank[g.NUMANode]++
		g.UUID, g.Serial = identity(f.Name, g.Address)
	}
	p.gpus = gpuList
	return p, nil
}

// addrPath is the key path of the address of d, for duplicate errors.
func addrPath(d *placed) string {
	if strings.HasPrefix(d.origin, "extra_devices[") || strings.HasPrefix(d.origin, "gpus[") && !strings.Contains(d.origin, " ") {
		return d.origin + ".address"
	}
	return d.origin
}

// nodeOfAddress guesses the NUMA node from the bus, as the address plan puts
// node 1 on buses 0x80 and up.
func nodeOfAddress(addr string) int {
	bus, err := strconv.ParseUint(addr[5:7], 16, 8)
	if err != nil || bus < 0x80 {
		return 0
	}
	return 1
}

// parseHex parses an ID of at most digits hex digits, with or without 0x.
func parseHex(s string, digits int) (uint64, error) {
	t := strings.TrimPrefix(strings.ToLower(s), "0x")
	if t == "" || len(t) > digits {
		return 0, fmt.Errorf("%q: want at most %d hex digits", s, digits)
	}
	return strconv.ParseUint(t, 16, 32)
}

// identity derives a GPU's UUID and serial number from the profile name and
// its address, so that they are stable across restarts of the simulation.
func identity(profile, address string) (uuid, serial string) {
	sum := sha256.Sum256([]byte("gpuherd-sim\x00" + profile + "\x00" + address))
	uuid = fmt.Sprintf("GPU-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
	serial = fmt.Sprintf("1%012d", binary.BigEndian.Uint64(sum[16:24])%1_000_000_000_000)
	return uuid, serial
}
