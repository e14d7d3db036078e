package sim

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

func TestBuiltinsLayOut(t *testing.T) {
	tests := []struct {
		name       string
		gpus       int
		onNVIDIA   int // GPUs bound to nvidia at boot
		audio      int
		nvswitches int
		nvml       bool
	}{
		{name: "a100-pcie-4", gpus: 4, onNVIDIA: 4, nvml: true},
		{name: "dgx-h100", gpus: 8, onNVIDIA: 8, nvswitches: 4, nvml: true},
		{name: "l40s-4", gpus: 4, onNVIDIA: 0, audio: 4},
		{name: "mixed", gpus: 6, onNVIDIA: 6, audio: 4, nvml: true},
		{name: "rtx6000pro-2", gpus: 2, onNVIDIA: 2, audio: 2, nvml: true},
	}
	var names []string
	for _, tt := range tests {
		names = append(names, tt.name)
		t.Run(tt.name, func(t *testing.T) {
			p, err := Builtin(tt.name)
			if err != nil {
				t.Fatal(err)
			}
			if p.HasNVML() != tt.nvml {
				t.Errorf("HasNVML() = %v, want %v", p.HasNVML(), tt.nvml)
			}
			cfg := p.KernelConfig()
			byAddr := map[string]fakekernel.Function{}
			groups := map[int][]fakekernel.Function{}
			for _, d := range cfg.Devices {
				if _, dup := byAddr[d.Address]; dup {
					t.Errorf("address %s twice", d.Address)
				}
				if !addressRE.MatchString(d.Address) {
					t.Errorf("address %q is not a PCI address", d.Address)
				}
				byAddr[d.Address] = d
				groups[d.IOMMUGroup] = append(groups[d.IOMMUGroup], d)
			}
			var gpus, onNVIDIA, audio, nvswitches int
			for _, d := range cfg.Devices {
				dev := vfio.Device{Vendor: d.Vendor, Class: d.Class}
				switch {
				case dev.IsGPU():
					gpus++
					if d.Driver == vfio.DriverNVIDIA {
						onNVIDIA++
					}
				case d.Class == vfio.ClassAudio:
					audio++
				case d.Class == vfio.ClassNVSwitch:
					nvswitches++
					if d.Device != deviceNVSwitch {
						t.Errorf("NVSwitch %s is 10de:%04x", d.Address, d.Device)
					}
					if len(groups[d.IOMMUGroup]) != 1 {
						t.Errorf("NVSwitch %s shares IOMMU group %d", d.Address, d.IOMMUGroup)
					}
				}
			}
			if gpus != tt.gpus || onNVIDIA != tt.onNVIDIA || audio != tt.audio || nvswitches != tt.nvswitches {
				t.Errorf("GPUs %d (on nvidia %d), audio %d, NVSwitches %d; want %d (%d), %d, %d",
					gpus, onNVIDIA, audio, nvswitches, tt.gpus, tt.onNVIDIA, tt.audio, tt.nvswitches)
			}
			if got := len(p.GPUs()); got != tt.gpus {
				t.Errorf("GPUs() has %d, want %d", got, tt.gpus)
			}
			for _, g := range p.GPUs() {
				d := byAddr[g.Address]
				if d.IOMMUGroup != g.IOMMUGroup || d.Device != g.Device || d.NUMANode != g.NUMANode {
					t.Errorf("GPU %+v disagrees with its kernel device %+v", g, d)
				}
				if g.Audio != "" {
					a, ok := byAddr[g.Audio]
					if !ok || a.IOMMUGroup != g.IOMMUGroup || a.Class != vfio.ClassAudio {
						t.Errorf("audio %s of %s: %+v, want class audio in group %d", g.Audio, g.Address, a, g.IOMMUGroup)
					}
				}
				for _, m := range groups[g.IOMMUGroup] {
					if m.Address != g.Address && m.Address != g.Audio && m.Vendor == vfio.VendorNVIDIA {
						t.Errorf("group %d of %s holds another NVIDIA function %s", g.IOMMUGroup, g.Address, m.Address)
					}
				}
				if g.MemoryMiB == 0 || g.Name == "" {
					t.Errorf("GPU %s lacks NVML name or memory: %+v", g.Address, g)
				}
			}
			for _, drv := range cfg.Drivers {
				if drv == vfio.DriverVFIO {
					t.Errorf("vfio-pci listed among host drivers; the kernel always has it")
				}
			}
		})
	}
	if got := Names(); !slices.Equal(got, names) {
		t.Errorf("Names() = %v, want %v", got, names)
	}
}

func TestDGXH100(t *testing.T) {
	p, err := Builtin("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	perNode := map[int][]string{}
	for _, g := range p.GPUs() {
		if g.Device != 0x2330 || g.Name != "NVIDIA H100 80GB HBM3" || g.MemoryMiB != 81920 {
			t.Errorf("GPU %s: %04x %q %d MiB, want go-nvml's H100 SXM5 80GB", g.Address, g.Device, g.Name, g.MemoryMiB)
		}
		if g.Driver != vfio.DriverNVIDIA {
			t.Errorf("GPU %s boots on %q, want nvidia", g.Address, g.Driver)
		}
		perNode[g.NUMANode] = append(perNode[g.NUMANode], g.Address)
	}
	want := map[int][]string{
		0: {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"},
		1: {"0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"},
	}
	for node, addrs := range want {
		if !slices.Equal(perNode[node], addrs) {
			t.Errorf("NUMA node %d: %v, want %v", node, perNode[node], addrs)
		}
	}
	for _, d := range p.KernelConfig().Devices {
		if d.Class == vfio.ClassNVSwitch && d.Driver != vfio.DriverNVIDIA {
			t.Errorf("NVSwitch %s boots on %q, want nvidia", d.Address, d.Driver)
		}
	}
}

func TestL40SPassthroughHost(t *testing.T) {
	p, err := Builtin("l40s-4")
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(p.KernelConfig().Drivers, vfio.DriverNVIDIA) {
		t.Error("nvidia is loaded on a passthrough-only host")
	}
	for _, d := range p.KernelConfig().Devices {
		want := ""
		if d.Class == vfio.ClassAudio {
			want = driverAudio
		}
		if d.Driver != want {
			t.Errorf("%s (class %06x) boots on %q, want %q", d.Address, d.Class, d.Driver, want)
		}
	}
	if p.NVML(nil) != nil {
		t.Error("NVML answers on a host without the nvidia driver")
	}
}

func TestMixedRefusableGPU(t *testing.T) {
	p, err := Builtin("mixed")
	if err != nil {
		t.Fatal(err)
	}
	var nvme fakekernel.Function
	for _, d := range p.KernelConfig().Devices {
		if d.Vendor == 0x144d {
			nvme = d
		}
	}
	if nvme.Driver != "nvme" {
		t.Fatalf("the NVMe drive boots on %q, want nvme", nvme.Driver)
	}
	var sharing []GPU
	for _, g := range p.GPUs() {
		if g.IOMMUGroup == nvme.IOMMUGroup {
			sharing = append(sharing, g)
		}
	}
	if len(sharing) != 1 || sharing[0].Device != 0x26b9 {
		t.Fatalf("GPUs in the NVMe's group %d: %+v, want one L40S", nvme.IOMMUGroup, sharing)
	}
}

func TestExampleProfile(t *testing.T) {
	p, err := Load("testdata/example-profile.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "my-server" || p.Source != "testdata/example-profile.yaml" {
		t.Errorf("name %q source %q", p.Name, p.Source)
	}
	got := map[string]GPU{}
	for _, g := range p.GPUs() {
		got[g.Address] = g
	}
	l40s, h100 := got["0000:18:00.0"], got["0000:9a:00.0"]
	if l40s.Device != 0x26b9 || l40s.Audio != "0000:18:00.1" || h100.Name != "NVIDIA H100 PCIe" || len(got) != 3 {
		t.Errorf("GPUs: %+v", got)
	}
	// The NVMe took bus 19, so the second L40S steps on to the next slot.
	if _, ok := got["0000:2a:00.0"]; !ok {
		t.Errorf("second L40S not at 0000:2a:00.0: %+v", got)
	}
	for _, d := range p.KernelConfig().Devices {
		if d.Address == "0000:19:00.0" && d.IOMMUGroup != l40s.IOMMUGroup {
			t.Errorf("NVMe in group %d, want the L40S's %d", d.IOMMUGroup, l40s.IOMMUGroup)
		}
	}
}

func TestLoad(t *testing.T) {
	if _, err := Load("dgx-h100"); err != nil {
		t.Errorf("built-in by name: %v", err)
	}
	_, err := Load("dgx-h200")
	if err == nil || !strings.Contains(err.Error(), `"dgx-h200"`) || !strings.Contains(err.Error(), strings.Join(Names(), ", ")) {
		t.Errorf("unknown built-in: %v, want the name and the list of built-ins", err)
	}
	path := filepath.Join(t.TempDir(), "x.yml")
	if err := os.WriteFile(path, []byte("name: x\ngpus: [{device: \"2330\"}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil || len(p.GPUs()) != 1 {
		t.Errorf("file: %v", err)
	}
	if _, err := Load("missing.yaml"); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing file: %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want string // in the error
	}{
		{"empty", "", "empty"},
		{"unknown key", "name: x\ngpus:\n  - device: \"2330\"\n    colour: green\n", "gpus[0].colour: unknown key (line 4)"},
		{"unknown top key", "name: x\nnvlink: true\n", "nvlink: unknown key"},
		{"wrong type", "name: x\ngpus: [{device: \"2330\", count: two}]\n", `gpus[0].count: must be an integer, not "two"`},
		{"not a list", "name: x\ngpus: {device: \"2330\"}\n", "gpus: must be a list"},
		{"bad hex", "name: x\ngpus: [{device: \"zz\"}]\n", `gpus[0].device: "zz" is not a PCI device ID`},
		{"too many hex digits", "name: x\ngpus: [{device: \"12345\"}]\n", `gpus[0].device: "12345" is not a PCI device ID`},
		{"bad class", "name: x\nextra_devices: [{address: 0000:01:00.0, vendor: \"8086\", device: \"1\", class: \"0108zz\"}]\n", "extra_devices[0].class:"},
		{"count 0", "name: x\ngpus: [{device: \"2330\"}, {device: \"2330\", count: 0}]\n", "gpus[1].count: must be between 1 and 64"},
		{"count 65", "name: x\ngpus: [{device: \"2330\", count: 65}]\n", "gpus[0].count: must be between 1 and 64"},
		{"too many on a node", "name: x\ngpus: [{device: \"2330\", count: 33, numa_node: 1}]\n", "gpus: 33 GPUs on NUMA node 1"},
		{"numa", "name: x\ngpus: [{device: \"2330\", numa_node: 2}]\n", "gpus[0].numa_node: must be 0 or 1"},
		{"device and model", "name: x\ngpus: [{device: \"2330\", model: NVIDIA L40S}]\n", "gpus[0]: set device or model, not both"},
		{"neither", "name: x\ngpus: [{count: 2}]\n", "gpus[0]: device or model is required"},
		{"unknown model", "name: x\ngpus: [{model: NVIDIA T4}]\n", `gpus[0].model: unknown model "NVIDIA T4"`},
		{"unknown card needs memory", "name: x\nhost_drivers: [nvidia]\nnvml: true\ngpus: [{device: \"abcd\"}]\n", "gpus[0].memory_mib: required"},
		{"driver not loaded", "name: x\ngpus: [{device: \"2330\", driver: nvidia}]\n", `gpus[0].driver: "nvidia" is not loaded`},
		{"nvml without nvidia", "name: x\nnvml: true\n", "nvml: true needs nvidia in host_drivers"},
		{"name missing", "gpus: [{device: \"2330\"}]\n", "name: required"},
		{"name with a slash", "name: a/b\n", `name: "a/b" must be`},
		{"driver twice", "name: x\nhost_drivers: [nvidia, nvidia]\n", `host_drivers[1]: "nvidia" is listed twice`},
		{"nvswitches", "name: x\nnvswitches: 9\n", "nvswitches: must be between 0 and 8"},
		{"address with count", "name: x\ngpus: [{device: \"2330\", count: 2, address: 0000:3b:00.0}]\n", "gpus[0].address: only allowed with count 1"},
		{"bad address", "name: x\nextra_devices: [{address: 0000:3B:00.0, vendor: \"8086\", device: \"1\", class: \"010802\"}]\n", `extra_devices[0].address: "0000:3B:00.0" must be`},
		{"duplicate address", "name: x\ngpus: [{device: \"2330\", address: 0000:3b:00.0, audio: true}]\nextra_devices:\n  - {address: 0000:3b:00.1, vendor: \"8086\", device: \"1\", class: \"010802\"}\n", "extra_devices[0].address: 0000:3b:00.1 is already taken by gpus[0] audio"},
		{"duplicate extra", "name: x\nextra_devices:\n  - {address: 0000:01:00.0, vendor: \"8086\", device: \"1\", class: \"010802\"}\n  - {address: 0000:01:00.0, vendor: \"8086\", device: \"1\", class: \"010802\"}\n", "extra_devices[1].address: 0000:01:00.0 is already taken by extra_devices[0]"},
		{"iommu_group_of unknown", "name: x\ngpus: [{device: \"2330\"}]\nextra_devices:\n  - {address: 0000:5e:00.0, vendor: \"144d\", device: \"a808\", class: \"010802\", iommu_group_of: \"0000:5d:00.0\"}\n", `extra_devices[0].iommu_group_of: no device at "0000:5d:00.0"`},
		{"two documents", "name: x\n---\nname: y\n", "more than one YAML document"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml), "test.yaml")
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "profile test.yaml: ") {
				t.Errorf("error %q, want it to start with the source and contain %q", err, tt.want)
			}
		})
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	_, err := Parse([]byte("name: x\ngpus: [{device: \"zz\"}, {device: \"2330\", count: 0}]\nnvswitches: -1\n"), "t")
	for _, want := range []string{"gpus[0].device", "gpus[1].count", "nvswitches"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %s", err, want)
		}
	}
}

func TestIdentityIsStable(t *testing.T) {
	a, _ := Builtin("a100-pcie-4")
	b, _ := Builtin("a100-pcie-4")
	c, _ := Builtin("dgx-h100")
	seen := map[string]bool{}
	for i, g := range a.GPUs() {
		if g.UUID != b.GPUs()[i].UUID || g.Serial != b.GPUs()[i].Serial {
			t.Errorf("%s: UUID or serial differs between two loads", g.Address)
		}
		if !strings.HasPrefix(g.UUID, "GPU-") || len(g.UUID) != 40 || len(g.Serial) != 13 {
			t.Errorf("%s: UUID %q serial %q are not shaped like NVML's", g.Address, g.UUID, g.Serial)
		}
		seen[g.UUID] = true
	}
	for _, g := range c.GPUs() {
		if seen[g.UUID] {
			t.Errorf("%s: UUID %s shared by two profiles", g.Address, g.UUID)
		}
	}
}
