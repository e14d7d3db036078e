package handoff

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The files of testdata/metadata are one domain written in every shape a
// person or an XML library may give it (same-*.xml), shapes that hold no
// gpuherd metadata (not-*.xml), and shapes with two gpuherd claim elements
// (dup-*.xml). same-elementtree.xml is same-prefix-on-element.xml written
// back by Python's xml.etree.ElementTree, which declares the namespace on
// <domain> as ns0; same-libvirt-dumpxml.xml is what libvirt 9.0 gave
// back for it (`virsh -c test:///default "define same-elementtree.xml;
// dumpxml guest-1"`): the declaration moved to <metadata>, out of the inner
// XML of <metadata>, which is all that an unmarshalled
// libvirtxml.DomainMetadata keeps. .ci/libvirt.sh makes the same round
// trip through a real libvirtd and its hook.
var metadataGuest = Guest{
	Name:        "guest-1",
	UUID:        "0d7c5b52-7a1e-4d4b-9a55-3c1f0e6b2a11",
	Metadata:    Metadata{Claim: "vm-a", Server: "gpu-17", ReleaseOnStop: true},
	HasMetadata: true,
	PCI:         []string{"0000:18:00.0", "0000:18:00.1"},
}

func metadataFiles(t *testing.T, pattern string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "metadata", pattern))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata/metadata/%s: %v", pattern, err)
	}
	return files
}

func TestMetadataEquivalentShapes(t *testing.T) {
	files := metadataFiles(t, "same-*.xml")
	for _, want := range []string{"same-elementtree.xml", "same-default-namespace.xml", "same-prefix-on-domain.xml", "same-prefix-on-metadata.xml"} {
		if !slicesContainsBase(files, want) {
			t.Errorf("testdata/metadata/%s is missing", want)
		}
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			g := parseFile(t, file)
			if !reflect.DeepEqual(g, metadataGuest) {
				t.Fatalf("ParseDomain = %+v\nwant %+v", g, metadataGuest)
			}
		})
	}
}

func TestMetadataOfOthersIsNotGpuherds(t *testing.T) {
	want := metadataGuest
	want.Metadata, want.HasMetadata = Metadata{}, false
	for _, file := range metadataFiles(t, "not-*.xml") {
		t.Run(filepath.Base(file), func(t *testing.T) {
			g := parseFile(t, file)
			if !reflect.DeepEqual(g, want) {
				t.Fatalf("ParseDomain = %+v\nwant %+v (no gpuherd metadata: the claim is the name)", g, want)
			}
			if g.ClaimID() != "guest-1" {
				t.Fatalf("ClaimID = %q, want the domain's name", g.ClaimID())
			}
		})
	}
}

func TestMetadataTwoClaimElementsRefused(t *testing.T) {
	for _, file := range metadataFiles(t, "dup-*.xml") {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			g, err := ParseDomain(data)
			var dup *DuplicateMetadataError
			if !errors.As(err, &dup) {
				t.Fatalf("ParseDomain = %+v, %v; want a DuplicateMetadataError", g, err)
			}
			msg := err.Error()
			for _, want := range []string{"domain guest-1 has 2 gpuherd claim elements", `id "vm-a", "vm-b"`, "virsh edit guest-1"} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q lacks %q", msg, want)
				}
			}
		})
	}
}

// Attributes of gpuherd's element are in no namespace: a declaration that
// happens to be called xmlns:id, or an attribute of another namespace,
// does not name the claim.
func TestMetadataAttributesInNoNamespace(t *testing.T) {
	doc := `<domain type='kvm'><name>vm-9</name><metadata>` +
		`<claim xmlns="` + Namespace + `" xmlns:id="urn:x" xmlns:o="urn:o" o:server="evil" id="vm-1" server="s"/>` +
		`</metadata></domain>`
	g, err := ParseDomain([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if g.Metadata != (Metadata{Claim: "vm-1", Server: "s"}) {
		t.Fatalf("metadata %+v, want claim vm-1 on s", g.Metadata)
	}
}

func parseFile(t *testing.T, file string) Guest {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	g, err := ParseDomain(data)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func slicesContainsBase(files []string, base string) bool {
	for _, f := range files {
		if filepath.Base(f) == base {
			return true
		}
	}
	return false
}
