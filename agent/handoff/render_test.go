package handoff

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// l40sClaim is two L40S with their audio functions (the simulated l40s-4).
func l40sClaim() api.Claim {
	return api.Claim{ID: "vm-a", Node: "gpu-17", State: api.StateClaimed, GPUs: []api.ClaimGPU{
		{PCIAddress: "0000:18:00.0", Model: "NVIDIA L40S", IOMMUGroup: 16, VFIODevice: "/dev/vfio/16",
			Companions: []api.PCIFunction{{PCIAddress: "0000:18:00.1"}}},
		{PCIAddress: "0000:2a:00.0", Model: "NVIDIA L40S", IOMMUGroup: 17, VFIODevice: "/dev/vfio/17",
			Companions: []api.PCIFunction{{PCIAddress: "0000:2a:00.1"}}},
	}}
}

// h100Claim is one SXM H100, which has no companion function.
func h100Claim() api.Claim {
	return api.Claim{ID: "node-7.pool-1", Node: "gpu-3", State: api.StateClaimed, GPUs: []api.ClaimGPU{
		{PCIAddress: "0000:9a:00.0", Model: "NVIDIA H100 80GB", IOMMUGroup: 40, VFIODevice: "/dev/vfio/40"},
	}}
}

type golden struct {
	file   string
	render func() ([]byte, error)
	domain bool // a whole domain: validated with libvirt's tools
}

func goldens() []golden {
	return []golden{
		{"l40s.libvirt.xml", func() ([]byte, error) { return Libvirt(l40sClaim(), Options{ReleaseOnStop: true}) }, false},
		{"l40s.domain.xml", func() ([]byte, error) { return DomainXML(l40sClaim(), Options{ReleaseOnStop: true}) }, true},
		{"l40s.qemu.txt", func() ([]byte, error) { return QEMU(l40sClaim()) }, false},
		{"h100.libvirt.xml", func() ([]byte, error) { return Libvirt(h100Claim(), Options{GuestBus: 0x20}) }, false},
		{"h100.domain.xml", func() ([]byte, error) { return DomainXML(h100Claim(), Options{GuestBus: 0x20}) }, true},
		{"h100.qemu.txt", func() ([]byte, error) { return QEMU(h100Claim()) }, false},
	}
}

func TestGolden(t *testing.T) {
	for _, g := range goldens() {
		t.Run(g.file, func(t *testing.T) {
			got, err := g.render()
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", g.file)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to write it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s differs (run with -update if the change is meant):\n got:\n%s\nwant:\n%s", path, got, want)
			}
		})
	}
}

// TestRoundTrip reads a rendered domain back as the hook does.
func TestRoundTrip(t *testing.T) {
	for _, o := range []Options{{ReleaseOnStop: true}, {}} {
		out, err := DomainXML(l40sClaim(), o)
		if err != nil {
			t.Fatal(err)
		}
		g, err := ParseDomain(out)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"0000:18:00.0", "0000:18:00.1", "0000:2a:00.0", "0000:2a:00.1"}
		if !g.HasMetadata || g.Metadata != (Metadata{Claim: "vm-a", Server: "gpu-17", ReleaseOnStop: o.ReleaseOnStop}) ||
			strings.Join(g.PCI, " ") != strings.Join(want, " ") || g.ClaimID() != "vm-a" || len(g.LibvirtManaged) != 0 {
			t.Fatalf("parsed %+v, want metadata vm-a on gpu-17 (release-on-stop %v) and PCI %v", g, o.ReleaseOnStop, want)
		}
	}
}

func TestParseDomain(t *testing.T) {
	tests := []struct {
		name, xml string
		want      Guest
		wantErr   string
	}{
		{"no metadata: the claim is the name", `<domain type='kvm'><name>vm-9</name><uuid>u</uuid></domain>`,
			Guest{Name: "vm-9", UUID: "u"}, ""},
		{"other namespaces are not gpuherd's",
			`<domain type='kvm'><name>vm-9</name><metadata><x:claim xmlns:x="urn:other" id="vm-1"/></metadata></domain>`,
			Guest{Name: "vm-9"}, ""},
		{"any prefix, gpuherd's namespace",
			`<domain type='kvm'><name>vm-9</name><metadata><g:claim xmlns:g="` + Namespace + `" id="vm-1" server="s"/></metadata></domain>`,
			Guest{Name: "vm-9", HasMetadata: true, Metadata: Metadata{Claim: "vm-1", Server: "s"}}, ""},
		{"bad release-on-stop",
			`<domain type='kvm'><name>vm-9</name><metadata><g:claim xmlns:g="` + Namespace + `" id="vm-1" release-on-stop="maybe"/></metadata></domain>`,
			Guest{}, `release-on-stop="maybe"`},
		{"USB hostdevs are not PCI",
			`<domain type='kvm'><name>v</name><devices><hostdev mode='subsystem' type='usb'><source><vendor id='0x1234'/><product id='0x5678'/></source></hostdev></devices></domain>`,
			Guest{Name: "v"}, ""},
		{"PCI hostdev without a full address",
			`<domain type='kvm'><name>v</name><devices><hostdev mode='subsystem' type='pci'><source><address bus='0x41' slot='0' function='0'/></source></hostdev></devices></domain>`,
			Guest{}, "without a full, valid source address"},
		{"not XML", `<domain`, Guest{}, "domain XML"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := ParseDomain([]byte(tt.xml))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseDomain = %+v, %v; want an error with %q", g, err, tt.wantErr)
				}
				return
			}
			if err != nil || g.Name != tt.want.Name || g.UUID != tt.want.UUID || g.HasMetadata != tt.want.HasMetadata || g.Metadata != tt.want.Metadata || len(g.PCI) != 0 {
				t.Fatalf("ParseDomain = %+v, %v; want %+v", g, err, tt.want)
			}
		})
	}
}

func TestRenderRefuses(t *testing.T) {
	if _, err := Libvirt(api.Claim{ID: "empty"}, Options{}); err == nil {
		t.Error("a claim without GPUs rendered")
	}
	if _, err := Libvirt(l40sClaim(), Options{GuestBus: 0xff}); err == nil || !strings.Contains(err.Error(), "past 0xff") {
		t.Errorf("a second GPU past bus 0xff: %v", err)
	}
	bad := h100Claim()
	bad.GPUs[0].PCIAddress = "0000:9a:00"
	if _, err := QEMU(bad); err == nil {
		t.Error("a malformed PCI address rendered")
	}
}

// requireTool finds a tool; without it the test is skipped, unless
// GPUHERD_LIBVIRT_TESTS is set (CI installs the tools and sets it), where a
// missing tool fails the test.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("GPUHERD_LIBVIRT_TESTS") != "" {
		t.Fatalf("%s not found, and GPUHERD_LIBVIRT_TESTS is set: install libvirt-clients and libxml2-utils", name)
	}
	t.Skipf("%s not found (Debian: libvirt-clients, libxml2-utils); set GPUHERD_LIBVIRT_TESTS to make this a failure", name)
	return ""
}

// TestGoldenDomainsValidate checks the golden domains against libvirt's own
// schema and parser: virt-xml-validate, and virsh's in-process test driver
// (no daemon, no hooks), which defines the domain with --validate.
func TestGoldenDomainsValidate(t *testing.T) {
	validate := requireTool(t, "virt-xml-validate")
	virsh := requireTool(t, "virsh")
	for _, g := range goldens() {
		if !g.domain {
			continue
		}
		path := filepath.Join("testdata", g.file)
		if out, err := exec.Command(validate, path, "domain").CombinedOutput(); err != nil {
			t.Errorf("virt-xml-validate %s: %v\n%s", path, err, out)
		}
		if out, err := exec.Command(virsh, "-c", "test:///default", "define", path, "--validate").CombinedOutput(); err != nil {
			t.Errorf("virsh define --validate %s: %v\n%s", path, err, out)
		}
	}
	// Each hostdev of the fragment, wrapped in a domain, validates too (the
	// fragment itself is a list of elements, not a document).
	frag, err := Libvirt(l40sClaim(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	doc := strings.Replace(string(frag), "<metadata>", "<name>wrapped</name>\n<memory>65536</memory>\n<os><type arch='x86_64' machine='q35'>hvm</type></os>\n<metadata>", 1)
	doc = strings.Replace(doc, "</metadata>\n", "</metadata>\n<devices>\n", 1)
	doc = "<domain type='kvm'>\n" + doc + "</devices>\n</domain>\n"
	path := filepath.Join(dir, "wrapped.xml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(validate, path, "domain").CombinedOutput(); err != nil {
		t.Errorf("virt-xml-validate of -o libvirt wrapped in a domain: %v\n%s\n%s", err, out, doc)
	}
}
