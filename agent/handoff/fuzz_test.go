package handoff

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuherd/gpuherd/vfio"
)

// FuzzParseDomain feeds the hook's parser what libvirt might hand it: it
// must never panic, and every PCI address it returns must be one the agent
// and sysfs accept.
func FuzzParseDomain(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("..", "..", "cmd", "gpuherd", "testdata", "libvirt-hook", "*.xml"))
	// Every shape of gpuherd's metadata (metadata_test.go).
	shapes, _ := filepath.Glob(filepath.Join("testdata", "metadata", "*.xml"))
	files = append(files, shapes...)
	for _, file := range files {
		if data, err := os.ReadFile(file); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(`<domain><name>x</name><devices><hostdev mode='subsystem' type='pci'><source><address domain='0x10000' bus='0x100' slot='0x20' function='0x8'/></source></hostdev></devices></domain>`))
	f.Add([]byte(`<domain><metadata><g:claim xmlns:g="` + Namespace + `" id="a"><g:claim id="b"/></g:claim></metadata></domain>`))
	f.Add([]byte(`<domain xmlns:ns0="` + Namespace + `"><name>x</name><metadata><ns0:claim id="a"/><claim xmlns="` + Namespace + `" id="b"/></metadata></domain>`))
	f.Add([]byte(`<domain><name>x</name><metadata xmlns:g="` + Namespace + `"><g:claim xmlns:g="urn:other" id="a"/><g:claim id="b" xmlns:id="urn:x"/></metadata></domain>`))
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := ParseDomain(data)
		if err != nil {
			return
		}
		if !g.HasMetadata && g.Metadata != (Metadata{}) {
			t.Fatalf("ParseDomain returned metadata %+v without HasMetadata", g.Metadata)
		}
		for _, addr := range g.PCI {
			if err := vfio.ValidateAddress(addr); err != nil {
				t.Fatalf("ParseDomain returned PCI address %q: %v", addr, err)
			}
		}
		for _, addr := range g.LibvirtManaged {
			if err := vfio.ValidateAddress(addr); err != nil {
				t.Fatalf("ParseDomain returned managed address %q: %v", addr, err)
			}
		}
	})
}
