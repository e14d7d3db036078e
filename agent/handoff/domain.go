package handoff

import (
	"errors"
	"fmt"
	"slices"

	"libvirt.org/go/libvirtxml"
)

// Guest is what the libvirt hook needs of a domain's XML.
type Guest struct {
	Name string
	UUID string
	// Metadata is gpuherd's element; HasMetadata says whether there was one.
	Metadata    Metadata
	HasMetadata bool
	// PCI lists the host PCI functions of the domain's PCI hostdevs
	// (<hostdev mode='subsystem' type='pci'>), sorted, whatever their
	// managed attribute.
	PCI []string
	// LibvirtManaged lists the functions of PCI whose hostdev lets libvirt
	// rebind the device (managed='yes', libvirt's default), sorted.
	LibvirtManaged []string
}

// ClaimID is the claim the domain runs on: the one its metadata names, or
// else the domain's name.
func (g Guest) ClaimID() string {
	if g.HasMetadata && g.Metadata.Claim != "" {
		return g.Metadata.Claim
	}
	return g.Name
}

// ParseDomain reads a domain's XML as libvirt hands it to a hook.
func ParseDomain(data []byte) (Guest, error) {
	var d libvirtxml.Domain
	if err := d.Unmarshal(string(data)); err != nil {
		return Guest{}, fmt.Errorf("domain XML: %w", err)
	}
	g := Guest{Name: d.Name, UUID: d.UUID}
	// The metadata is read from the whole document, not from libvirtxml's
	// inner XML of <metadata>: that text has lost the namespace
	// declarations made above it.
	m, ok, err := parseMetadata(d.Name, data)
	var dup *DuplicateMetadataError
	switch {
	case errors.As(err, &dup):
		return Guest{}, err
	case err != nil:
		return Guest{}, fmt.Errorf("domain %s: %w", d.Name, err)
	}
	g.Metadata, g.HasMetadata = m, ok
	if d.Devices != nil {
		for _, h := range d.Devices.Hostdevs {
			if h.SubsysPCI == nil || h.SubsysPCI.Source == nil {
				continue
			}
			addr, ok := formatPCI(h.SubsysPCI.Source.Address)
			if !ok {
				return Guest{}, fmt.Errorf("domain %s: a PCI hostdev without a full, valid source address (domain, bus, slot, function)", d.Name)
			}
			if !slices.Contains(g.PCI, addr) {
				g.PCI = append(g.PCI, addr)
			}
			if h.Managed != "no" && !slices.Contains(g.LibvirtManaged, addr) {
				g.LibvirtManaged = append(g.LibvirtManaged, addr)
			}
		}
	}
	slices.Sort(g.PCI)
	slices.Sort(g.LibvirtManaged)
	return g, nil
}
