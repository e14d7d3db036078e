package vfio

import (
	"errors"
	"strings"
	"testing"
)

func TestParseID(t *testing.T) {
	good := map[string]uint16{"0x10de\n": 0x10de, "0x10de": 0x10de, "0xffff\n": 0xffff, "0x0\n": 0}
	for in, want := range good {
		if got, err := parseID([]byte(in)); err != nil || got != want {
			t.Errorf("parseID(%q) = %#x, %v; want %#x", in, got, err, want)
		}
	}
	for _, in := range []string{"", "\n", "10de\n", "0x\n", "0x10000\n", "0x-1", "0x+1", "0x1_0", "0xg", "0x10de 0x10de", "-0x1", strings.Repeat("0", 300), "\xff\xfe"} {
		if got, err := parseID([]byte(in)); !errors.Is(err, ErrMalformed) {
			t.Errorf("parseID(%q) = %#x, %v; want ErrMalformed", in, got, err)
		}
	}
}

func TestParseClass(t *testing.T) {
	good := map[string]uint32{"0x030200\n": Class3D, "0x030000\n": ClassVGA, "0x060400\n": ClassBridge, "0x0\n": 0}
	for in, want := range good {
		if got, err := parseClass([]byte(in)); err != nil || got != want {
			t.Errorf("parseClass(%q) = %#x, %v; want %#x", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0x1000000\n", "030200\n", "0xzz0200", "0x03 0200"} {
		if _, err := parseClass([]byte(in)); !errors.Is(err, ErrMalformed) {
			t.Errorf("parseClass(%q): %v, want ErrMalformed", in, err)
		}
	}
}

func TestParseNUMANode(t *testing.T) {
	good := map[string]int{"-1\n": -1, "0\n": 0, "7\n": 7}
	for in, want := range good {
		if got, err := parseNUMANode([]byte(in)); err != nil || got != want {
			t.Errorf("parseNUMANode(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-2\n", "x\n", "1.5", "99999999999999999999999", "0x1"} {
		if _, err := parseNUMANode([]byte(in)); !errors.Is(err, ErrMalformed) {
			t.Errorf("parseNUMANode(%q): %v, want ErrMalformed", in, err)
		}
	}
}

func TestParseDriverOverride(t *testing.T) {
	good := map[string]string{
		"(null)\n": "", "\n": "", "": "", "vfio-pci\n": "vfio-pci", "none\n": "none",
		// Whatever else the kernel stored is reported, not trusted and not
		// fatal: it is never used as a path.
		"0000 0000\n": "0000 0000", "../x\n": "../x",
	}
	for in, want := range good {
		if got, err := parseDriverOverride([]byte(in)); err != nil || got != want {
			t.Errorf("parseDriverOverride(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := parseDriverOverride([]byte(strings.Repeat("a", 5000))); !errors.Is(err, ErrMalformed) {
		t.Errorf("parseDriverOverride of 5000 bytes: %v, want ErrMalformed", err)
	}
}

func TestParseLinks(t *testing.T) {
	drivers := map[string]string{
		"../../../bus/pci/drivers/nvidia":        "nvidia",
		"../../../../bus/pci/drivers/vfio-pci/":  "vfio-pci",
		"../../../bus/pci/drivers/snd_hda_intel": "snd_hda_intel",
	}
	for in, want := range drivers {
		if got, err := parseDriverLink(in); err != nil || got != want {
			t.Errorf("parseDriverLink(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "/", "..", "../../..", "../drivers/nv idia", strings.Repeat("x/", 3000)} {
		if _, err := parseDriverLink(in); !errors.Is(err, ErrMalformed) {
			t.Errorf("parseDriverLink(%q): %v, want ErrMalformed", in, err)
		}
	}
	if g, err := parseGroupLink("../../../kernel/iommu_groups/12"); err != nil || g != 12 {
		t.Errorf("parseGroupLink = %d, %v; want 12", g, err)
	}
	for _, in := range []string{"", "../../../kernel/iommu_groups/", "../iommu_groups/-1", "../iommu_groups/+1", "../iommu_groups/012", "../iommu_groups/1e3", "../iommu_groups/99999999999"} {
		if g, err := parseGroupLink(in); !errors.Is(err, ErrMalformed) {
			t.Errorf("parseGroupLink(%q) = %d, %v; want ErrMalformed", in, g, err)
		}
	}
}
