package inventory

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpuherd/gpuherd/vfio"
)

// mixedHost is a server with a bit of everything the inventory must sort
// out. GPU addresses are listed out of order on purpose.
func mixedHost() *fakePCI {
	return &fakePCI{devs: []vfio.Device{
		gpu("0000:3b:00.0", 0x26b9, 20, 0, "nvidia"), // L40S with its audio function
		fn("0000:3b:00.1", 0x10de, 0x22ba, vfio.ClassAudio, 20, "snd_hda_intel"),
		fn("0000:3a:00.0", 0x10de, 0x1aff, vfio.ClassBridge, 20, "pcieport"), // NVIDIA bridge: not a companion
		gpu("0000:1b:00.0", 0x2bb5, 10, 1, "vfio-pci"),                       // RTX 6000 Pro with audio, USB-C and UCSI
		fn("0000:1b:00.3", 0x10de, 0x1ad9, vfio.ClassSerialBus, 10, "vfio-pci"),
		fn("0000:1b:00.1", 0x10de, 0x22e8, vfio.ClassAudio, 10, "vfio-pci"),
		fn("0000:1b:00.2", 0x10de, 0x1ad8, vfio.ClassUSB, 10, "vfio-pci"),
		gpu("0000:af:00.0", 0x1db4, 30, 1, ""), // Tesla V100: not in the catalog
		fn("0000:05:00.0", 0x10de, 0x22a3, vfio.ClassNVSwitch, 40, "nvidia-nvswitch"),
		fn("0000:06:00.0", 0x10de, 0x1af1, vfio.Class3D, 41, ""), // NVSwitch with an odd class code
		{Address: "0000:3b:00.4", Vendor: 0x10de, Device: 0x26b9, Class: vfio.Class3D, IOMMUGroup: 21, NUMANode: 0, VirtualFunction: true},
		fn("0000:00:02.0", 0x8086, 0x56c0, vfio.ClassVGA, 1, "i915"),  // not NVIDIA
		fn("0000:3b:00.2", 0x15b3, 0x101d, 0x020000, 20, "mlx5_core"), // not NVIDIA, in the L40S's group
	}}
}

func addrs(gs []GPU) []string {
	out := make([]string, len(gs))
	for i, g := range gs {
		out[i] = g.Address
	}
	return out
}

func byAddr(t *testing.T, gs []GPU, addr string) GPU {
	t.Helper()
	for _, g := range gs {
		if g.Address == addr {
			return g
		}
	}
	t.Fatalf("no GPU %s in %v", addr, addrs(gs))
	return GPU{}
}

func TestDiscoverSysfsOnly(t *testing.T) {
	inv := New(mixedHost())
	gs, err := inv.Discover()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := addrs(gs), []string{"0000:1b:00.0", "0000:3b:00.0", "0000:af:00.0"}; !slices.Equal(got, want) {
		t.Fatalf("GPUs %v, want %v (sorted; no VF, NVSwitch, companion or foreign device)", got, want)
	}
	rtx := byAddr(t, gs, "0000:1b:00.0")
	want := GPU{
		Address: "0000:1b:00.0", Model: "NVIDIA RTX 6000 Pro", VendorID: 0x10de, DeviceID: 0x2bb5,
		SubsystemVendorID: 0x10de, SubsystemDeviceID: 0x16c1, KnownModel: true, MemoryBytes: 96 * gib,
		NUMANode: 1, IOMMUGroup: 10, Driver: "vfio-pci",
		Companions: []string{"0000:1b:00.1", "0000:1b:00.2", "0000:1b:00.3"}, Healthy: true,
	}
	if fmt.Sprint(rtx) != fmt.Sprint(want) {
		t.Errorf("RTX 6000 Pro:\n got %+v\nwant %+v", rtx, want)
	}
	l40s := byAddr(t, gs, "0000:3b:00.0")
	if l40s.Model != "NVIDIA L40S" || !slices.Equal(l40s.Companions, []string{"0000:3b:00.1"}) || l40s.MemoryBytes != 48*gib {
		t.Errorf("L40S: %+v", l40s)
	}
	t4 := byAddr(t, gs, "0000:af:00.0")
	if t4.Model != "10de:1db4" || t4.KnownModel || t4.MemoryBytes != 0 || !t4.Healthy || t4.Companions != nil {
		t.Errorf("unknown GPU: %+v", t4)
	}
	if inv.Catalog() == nil || len(inv.Catalog().Names()) == 0 {
		t.Error("no catalog")
	}
}

func TestGPUJSON(t *testing.T) {
	g := GPU{Address: "0000:3b:00.0", Model: "NVIDIA L40S", VendorID: 0x10de, DeviceID: 0x26b9, NUMANode: -1, IOMMUGroup: 3, Healthy: true}
	b, err := json.Marshal(g)
	if err != nil {
		t.Fatal(err)
	}
	// pci_address as everywhere else; PCI IDs as the hex people read.
	const want = `{"pci_address":"0000:3b:00.0","model":"NVIDIA L40S","vendor_id":"10de","device_id":"26b9","subsystem_vendor_id":"0000","subsystem_device_id":"0000","known_model":false,"memory_bytes":0,"numa_node":-1,"iommu_group":3,"driver":"","healthy":true}`
	if string(b) != want {
		t.Errorf("JSON:\n got %s\nwant %s", b, want)
	}
}

func TestDiscoverOperatorCatalog(t *testing.T) {
	extra, err := NewCatalog(Model{Name: "NVIDIA V100", DeviceIDs: []uint16{0x1db4}, MemoryBytes: 16 * gib})
	if err != nil {
		t.Fatal(err)
	}
	cat, err := DefaultCatalog().Merge(extra)
	if err != nil {
		t.Fatal(err)
	}
	gs, err := New(mixedHost(), WithCatalog(cat)).Discover()
	if err != nil {
		t.Fatal(err)
	}
	if t4 := byAddr(t, gs, "0000:af:00.0"); t4.Model != "NVIDIA V100" || !t4.KnownModel || t4.MemoryBytes != 16*gib {
		t.Errorf("T4 with the operator's catalog: %+v", t4)
	}
}

func TestDiscoverHealth(t *testing.T) {
	src := mixedHost()
	src.health = map[string]error{
		"0000:3b:00.0": fmt.Errorf("vfio: 0000:3b:00.0: health: %w", errors.New("device vanished from the PCI bus")),
		"0000:1b:00.0": errors.New("vfio: 0000:1b:00.0: health: config space reads all-ones (the card fell off the bus)"),
	}
	log, logs := newLog()
	inv := New(src, WithLogger(log))
	gs, err := inv.Discover()
	if err != nil {
		t.Fatal(err)
	}
	if g := byAddr(t, gs, "0000:3b:00.0"); g.Healthy || !strings.Contains(g.Health, "vanished") {
		t.Errorf("vanished GPU: healthy=%v %q", g.Healthy, g.Health)
	}
	if g := byAddr(t, gs, "0000:1b:00.0"); g.Healthy || !strings.Contains(g.Health, "all-ones") {
		t.Errorf("all-ones GPU: healthy=%v %q", g.Healthy, g.Health)
	}
	if g := byAddr(t, gs, "0000:af:00.0"); !g.Healthy || g.Health != "" {
		t.Errorf("healthy GPU: %v %q", g.Healthy, g.Health)
	}
	if n := strings.Count(logs.String(), "GPU unhealthy"); n != 2 {
		t.Errorf("logged %d unhealthy GPUs, want 2:\n%s", n, logs)
	}

	// Unchanged health is not logged again; recovery is logged once.
	src.health = map[string]error{"0000:1b:00.0": src.health["0000:1b:00.0"]}
	if _, err := inv.Discover(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "GPU unhealthy"); n != 2 {
		t.Errorf("unchanged health logged again (%d lines):\n%s", n, logs)
	}
	if n := strings.Count(logs.String(), "GPU healthy again"); n != 1 {
		t.Errorf("recovery logged %d times:\n%s", n, logs)
	}
}

func TestDiscoverNoIOMMUGroup(t *testing.T) {
	src := &fakePCI{devs: []vfio.Device{gpu("0000:3b:00.0", 0x26b9, -1, 0, "nvidia"),
		fn("0000:3b:00.1", 0x10de, 0x22ba, vfio.ClassAudio, -1, "")}}
	gs, err := New(src).Discover()
	if err != nil {
		t.Fatal(err)
	}
	if len(gs) != 1 || gs[0].Healthy || !strings.Contains(gs[0].Health, "IOMMU") || gs[0].Companions != nil {
		t.Errorf("GPU without IOMMU group: %+v", gs)
	}
}

func TestDiscoverSourceFails(t *testing.T) {
	_, err := New(&fakePCI{err: errors.New("read bus/pci/devices: permission denied")}).Discover()
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("got %v", err)
	}
	if _, err := New(nil).Discover(); err == nil {
		t.Error("nil source: no error")
	}
}

// dgxHost is the sysfs side of a DGX H100: 8 GPUs (one IOMMU group each)
// and 4 NVSwitches.
func dgxHost() *fakePCI {
	src := &fakePCI{}
	for i, a := range dgxAddrs {
		src.devs = append(src.devs, gpu(a, 0x2330, 100+i, -1, "nvidia"))
	}
	for i := range 4 {
		src.devs = append(src.devs, fn(fmt.Sprintf("0000:%02x:00.0", 5+i), 0x10de, 0x22a3, vfio.ClassNVSwitch, 200+i, "nvidia-nvswitch"))
	}
	return src
}

func TestDiscoverWithNVML(t *testing.T) {
	s := newDGX(t)
	setTopology(s)
	store := newMapStore()
	inv := New(dgxHost(), WithNVML(NewNVML(s, nil)), WithFactStore(store))
	gs, err := inv.Discover()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(addrs(gs), dgxAddrs) {
		t.Fatalf("GPUs %v, want %v", addrs(gs), dgxAddrs)
	}
	for _, g := range gs {
		dev := mockDev(s, g.Address)
		if g.UUID != dev.UUID || g.Model != "NVIDIA H100 80GB" || g.MemoryBytes != 85899345920 || !g.Healthy {
			t.Errorf("%s: %+v; want UUID %s", g.Address, g, dev.UUID)
		}
		if g.Serial == "" || len(g.Distance) != 7 {
			t.Errorf("%s: serial %q distance %v", g.Address, g.Serial, g.Distance)
		}
		// sysfs said -1, so NVML's NUMA node fills in.
		if want := slices.Index(dgxAddrs, g.Address) / 4; g.NUMANode != want {
			t.Errorf("%s: NUMA %d, want %d", g.Address, g.NUMANode, want)
		}
	}
	if store.writes() != 8 {
		t.Errorf("%d fact writes, want 8", store.writes())
	}
}

// The model's marketed memory stays whatever NVML says (an H100 80GB is
// sold as 80 GB, NVML reports a bit less); NVML's figure has its own field.
func TestDiscoverMarketedMemoryNVMLApart(t *testing.T) {
	s := newDGX(t)
	mockDev(s, "0000:18:00.0").MemoryInfo.Total = 81559 << 20 // what a real card reports, a bit under nominal
	gs, err := New(dgxHost(), WithNVML(NewNVML(s, nil))).Discover()
	if err != nil {
		t.Fatal(err)
	}
	if g := byAddr(t, gs, "0000:18:00.0"); g.MemoryBytes != 80<<30 || g.NVMLMemoryBytes != 81559<<20 {
		t.Errorf("memory %d, NVML %d; want the model's %d and NVML's %d", g.MemoryBytes, g.NVMLMemoryBytes, 80<<30, 81559<<20)
	}
	// sysfs NUMA wins over NVML's when the kernel knows it.
	src := dgxHost()
	src.devs[0].NUMANode = 3
	setTopology(s)
	gs, err = New(src, WithNVML(NewNVML(s, nil))).Discover()
	if err != nil {
		t.Fatal(err)
	}
	if g := byAddr(t, gs, "0000:18:00.0"); g.NUMANode != 3 {
		t.Errorf("NUMA %d, want sysfs's 3", g.NUMANode)
	}
}

// dropFromNVML makes NVML stop seeing the card at addr, as binding it to
// vfio-pci does.
func dropFromNVML(s *server.Server, addr string) {
	gone := mockDev(s, addr)
	s.Devices = slices.DeleteFunc(s.Devices, func(d nvml.Device) bool { return d == nvml.Device(gone) })
}

func TestFactsSurviveVFIO(t *testing.T) {
	s := newDGX(t)
	setTopology(s)
	src := dgxHost()
	store := newMapStore()
	nv := NewNVML(s, nil)
	nv.now = fakeClock()
	inv := New(src, WithNVML(nv), WithFactStore(store))

	first, err := inv.Discover()
	if err != nil {
		t.Fatal(err)
	}
	const moved = "0000:3a:00.0"
	before := byAddr(t, first, moved)

	// The card goes to a VM: vfio-pci owns it and NVML no longer sees it.
	src.setDriver(moved, "vfio-pci")
	dropFromNVML(s, moved)
	writes := store.writes()

	second, err := inv.Discover()
	if err != nil {
		t.Fatal(err)
	}
	after := byAddr(t, second, moved)
	if after.UUID != before.UUID || after.UUID == "" || after.Serial != before.Serial || after.MemoryBytes != 85899345920 {
		t.Errorf("facts lost when the card moved to vfio-pci:\nbefore %+v\n after %+v", before, after)
	}
	if after.Driver != "vfio-pci" || after.NUMANode != 0 || len(after.Distance) != 7 {
		t.Errorf("after the move: %+v", after)
	}
	// A peer NVML still sees keeps its distance to the moved card from
	// the cache, since NVML can no longer measure it.
	if peer := byAddr(t, second, "0000:18:00.0"); peer.Distance[moved] != int(nvml.TOPOLOGY_NODE) || len(peer.Distance) != 7 {
		t.Errorf("peer lost its distance to %s: %v", moved, peer.Distance)
	}
	// Nothing changed but the observation time: no cache writes.
	if store.writes() != writes {
		t.Errorf("%d cache writes for unchanged facts", store.writes()-writes)
	}

	// A restarted agent, with no NVML at all, still knows the card.
	third, err := New(src, WithFactStore(store)).Discover()
	if err != nil {
		t.Fatal(err)
	}
	if g := byAddr(t, third, moved); g.UUID != before.UUID {
		t.Errorf("after restart: UUID %q, want %q", g.UUID, before.UUID)
	}
}

func TestFactsCardSwapped(t *testing.T) {
	s := newDGX(t)
	setTopology(s)
	store := newMapStore()
	inv := New(dgxHost(), WithNVML(NewNVML(s, nil)), WithFactStore(store))
	if _, err := inv.Discover(); err != nil {
		t.Fatal(err)
	}
	// A new card in the same slot: new UUID, and this one has no serial.
	dev := mockDev(s, "0000:18:00.0")
	dev.UUID = "GPU-00000000-0000-0000-0000-000000000001"
	dev.GetSerialFunc = func() (string, nvml.Return) { return "", nvml.ERROR_NOT_SUPPORTED }
	gs, err := inv.Discover()
	if err != nil {
		t.Fatal(err)
	}
	if g := byAddr(t, gs, "0000:18:00.0"); g.UUID != dev.UUID || g.Serial != "" {
		t.Errorf("swapped card kept the old card's facts: %+v", g)
	}
	var cached Facts
	if err := json.Unmarshal(store.data["0000:18:00.0"], &cached); err != nil || cached.UUID != dev.UUID {
		t.Errorf("cache not updated for the new card: %+v %v", cached, err)
	}
}

func TestDiscoverNVMLUnavailable(t *testing.T) {
	s := newDGX(t)
	s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	log, logs := newLog()
	inv := New(dgxHost(), WithNVML(NewNVML(s, nil)), WithFactStore(newMapStore()), WithLogger(log))
	for range 2 {
		gs, err := inv.Discover()
		if err != nil {
			t.Fatal(err)
		}
		if len(gs) != 8 {
			t.Fatalf("%d GPUs, want 8", len(gs))
		}
		for _, g := range gs {
			if g.Model != "NVIDIA H100 80GB" || g.MemoryBytes != 80*gib || g.UUID != "" || !g.Healthy || g.NUMANode != -1 {
				t.Errorf("sysfs-only GPU: %+v", g)
			}
		}
	}
	out := logs.String()
	if n := strings.Count(out, `msg="NVML unavailable`); n != 1 {
		t.Errorf("NVML unavailable logged %d times, want once:\n%s", n, out)
	}
	if !strings.Contains(out, "level=INFO") || strings.Contains(out, "level=WARN") || strings.Contains(out, "level=ERROR") {
		t.Errorf("a host without NVML is normal, not a warning:\n%s", out)
	}
}

func TestDiscoverNVMLFailsAndStoreFails(t *testing.T) {
	s := newDGX(t)
	s.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	store := newMapStore()
	store.data["0000:18:00.0"] = []byte(`{"uuid":"GPU-cached","numa_node":0}`)
	store.data["0000:2a:00.0"] = []byte(`not json`)
	log, logs := newLog()
	inv := New(dgxHost(), WithNVML(NewNVML(s, nil)), WithFactStore(store), WithLogger(log))
	gs, err := inv.Discover()
	if err != nil {
		t.Fatal(err)
	}
	if g := byAddr(t, gs, "0000:18:00.0"); g.UUID != "GPU-cached" || g.NUMANode != 0 {
		t.Errorf("cached facts not used: %+v", g)
	}
	if g := byAddr(t, gs, "0000:2a:00.0"); g.UUID != "" || !g.Healthy {
		t.Errorf("a bad cache entry must cost only its facts: %+v", g)
	}
	for _, want := range []string{"NVML failed", "count GPUs", "do not decode"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}

	// NVML back, but the store refuses writes: discovery still works.
	s.DeviceGetCountFunc = func() (int, nvml.Return) { return len(s.Devices), nvml.SUCCESS }
	store.putErr = errors.New("ledger closed")
	gs, err = inv.Discover()
	if err != nil {
		t.Fatal(err)
	}
	if g := byAddr(t, gs, "0000:2a:00.0"); g.UUID != mockDev(s, "0000:2a:00.0").UUID {
		t.Errorf("live facts not used when the store fails: %+v", g)
	}
	if !strings.Contains(logs.String(), "cannot cache GPU facts") || !strings.Contains(logs.String(), "NVML available") {
		t.Errorf("log:\n%s", logs)
	}
}

func TestDiscoverNVMLExtraAndUnknownLogged(t *testing.T) {
	s := newDGX(t)
	src := dgxHost()
	src.devs = slices.DeleteFunc(src.devs, func(d vfio.Device) bool { return d.Address == "0000:db:00.0" })
	src.devs = append(src.devs, gpu("0000:e1:00.0", 0x1db4, 300, 1, ""))
	log, logs := newLog()
	inv := New(src, WithNVML(NewNVML(s, nil)), WithLogger(log))
	for range 2 {
		gs, err := inv.Discover()
		if err != nil {
			t.Fatal(err)
		}
		if len(gs) != 8 {
			t.Fatalf("%d GPUs: %v", len(gs), addrs(gs))
		}
	}
	if n := strings.Count(logs.String(), "sysfs does not list"); n != 1 {
		t.Errorf("NVML-only GPU logged %d times:\n%s", n, logs)
	}
	if n := strings.Count(logs.String(), "not in the model catalog"); n != 1 {
		t.Errorf("unknown model logged %d times:\n%s", n, logs)
	}
}

func TestDiscoverConcurrent(t *testing.T) {
	s := newDGX(t)
	setTopology(s)
	inv := New(dgxHost(), WithNVML(NewNVML(s, nil)), WithFactStore(newMapStore()))
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			gs, err := inv.Discover()
			if err == nil && len(gs) != 8 {
				err = fmt.Errorf("%d GPUs", len(gs))
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func TestMergeFacts(t *testing.T) {
	old := Facts{UUID: "GPU-a", Serial: "1654", Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 * gib, NUMANode: 1,
		DriverVersion: "550.54.15", Distance: map[string]int{"0000:2a:00.0": 40, "0000:3a:00.0": 40}}
	// Same card, NVML less talkative today and one peer gone from its view.
	now := Facts{UUID: "GPU-a", NUMANode: -1, Distance: map[string]int{"0000:2a:00.0": 20}}
	got := mergeFacts(now, old, true)
	want := Facts{UUID: "GPU-a", Serial: "1654", Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 * gib, NUMANode: 1,
		DriverVersion: "550.54.15", Distance: map[string]int{"0000:2a:00.0": 20, "0000:3a:00.0": 40}}
	if !sameFacts(got, want) {
		t.Errorf("same card:\n got %+v\nwant %+v", got, want)
	}
	if now.Distance["0000:3a:00.0"] != 0 {
		t.Error("mergeFacts changed its argument's map")
	}
	// NVML could not read the UUID today: still taken as the same card.
	if got := mergeFacts(Facts{NUMANode: -1}, old, true); got.UUID != "GPU-a" || got.Serial != "1654" {
		t.Errorf("no UUID now: %+v", got)
	}
	// Another card in the slot: nothing of the old one survives.
	swapped := Facts{UUID: "GPU-b", NUMANode: -1}
	if got := mergeFacts(swapped, old, true); !sameFacts(got, swapped) {
		t.Errorf("swapped card: %+v", got)
	}
	if got := mergeFacts(now, Facts{}, false); !sameFacts(got, now) {
		t.Errorf("no cache: %+v", got)
	}
}
