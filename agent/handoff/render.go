// Package handoff turns a claim into what a hypervisor needs to start a VM on
// its GPUs, and reads back what a hypervisor hands gpuherd: libvirt
// <hostdev> elements with gpuherd's metadata, a minimal libvirt domain, and
// QEMU's -device arguments; and, for the libvirt hook, the GPUs and the
// gpuherd metadata of a domain's XML.
//
// gpuherd owns the binding of a claimed GPU (its whole IOMMU group is on
// vfio-pci from the claim to the release), so every hostdev is
// managed='no': libvirt then never detaches or re-attaches the device, it
// only checks that it is on a stub driver and resets it.
package handoff

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/gpuherd/gpuherd/agent/api"
)

// DefaultGuestBus is the guest PCI bus of the first GPU. Each GPU gets a
// bus of its own (the next one for the next GPU), slot 0, so that its
// companion functions can share the slot as functions 1, 2, ...; on q35
// libvirt adds the pcie-root-port of each bus it finds named. Starting at
// 16 keeps clear of the buses libvirt numbers its own devices on (1, 2, ...)
// in a domain whose addresses are already assigned.
const DefaultGuestBus = 0x10

// Options tunes the rendering.
type Options struct {
	// ReleaseOnStop asks the libvirt hook to release the claim when the
	// domain stops (the platform's "stopping a VM frees its GPUs").
	ReleaseOnStop bool
	// GuestBus is the guest PCI bus of the first GPU; 0 means
	// DefaultGuestBus.
	GuestBus uint
}

func (o Options) guestBus() uint {
	if o.GuestBus == 0 {
		return DefaultGuestBus
	}
	return o.GuestBus
}

// Hostdevs returns one <hostdev> per PCI function of the claim: each GPU on
// guest bus GuestBus+i, slot 0, function 0, and its companion functions
// (the HD audio of the card) on functions 1, 2, ... of the same slot, with
// multifunction='on' on function 0 when there are any. The functions are
// in the claim's order (GPUs sorted by address).
func Hostdevs(c api.Claim, o Options) ([]libvirtxml.DomainHostdev, error) {
	if len(c.GPUs) == 0 {
		return nil, fmt.Errorf("claim %s holds no GPU", c.ID)
	}
	var out []libvirtxml.DomainHostdev
	for i, g := range c.GPUs {
		fns := append([]string{g.PCIAddress}, companions(g)...)
		if len(fns) > 8 {
			return nil, fmt.Errorf("GPU %s of claim %s has %d functions; one guest slot holds 8", g.PCIAddress, c.ID, len(fns))
		}
		bus := o.guestBus() + uint(i)
		if bus > 0xff {
			return nil, fmt.Errorf("claim %s: guest bus %#x of GPU %s is past 0xff; use a lower guest bus", c.ID, bus, g.PCIAddress)
		}
		for fn, addr := range fns {
			src, err := parsePCI(addr)
			if err != nil {
				return nil, fmt.Errorf("claim %s: %w", c.ID, err)
			}
			guest := &libvirtxml.DomainAddressPCI{Domain: uintp(0), Bus: uintp(bus), Slot: uintp(0), Function: uintp(uint(fn))}
			if fn == 0 && len(fns) > 1 {
				guest.MultiFunction = "on"
			}
			out = append(out, libvirtxml.DomainHostdev{
				Managed: "no",
				SubsysPCI: &libvirtxml.DomainHostdevSubsysPCI{
					Source: &libvirtxml.DomainHostdevSubsysPCISource{Address: src},
				},
				Address: &libvirtxml.DomainAddress{PCI: guest},
			})
		}
	}
	return out, nil
}

func companions(g api.ClaimGPU) []string {
	out := make([]string, 0, len(g.Companions))
	for _, f := range g.Companions {
		out = append(out, f.PCIAddress)
	}
	slices.Sort(out)
	return out
}

// Libvirt writes what a domain needs to run on the claim: its gpuherd
// metadata element inside a <metadata> element, then one <hostdev> per
// function, for the domain's <devices>. Each element is complete on its
// own: a domain that has a <metadata> already takes the inner element, and
// each <hostdev> can go to `virsh attach-device --config` as a file.
func Libvirt(c api.Claim, o Options) ([]byte, error) {
	devs, err := Hostdevs(c, o)
	if err != nil {
		return nil, err
	}
	meta, err := MetadataOf(c, o).marshal()
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString("<metadata>\n  ")
	b.Write(meta)
	b.WriteString("\n</metadata>\n")
	for _, d := range devs {
		s, err := d.Marshal()
		if err != nil {
			return nil, fmt.Errorf("claim %s: hostdev: %w", c.ID, err)
		}
		b.WriteString(s)
		b.WriteString("\n")
	}
	return b.Bytes(), nil
}

// Domain returns a minimal libvirt domain named after the claim that holds
// its GPUs and metadata: a KVM q35 guest with 16 GiB and 8 vCPUs per GPU
// for the caller to adjust, and no disk. It validates against libvirt's schema
// and is what `virsh define` or `virsh attach-device --config` (per
// hostdev) start from.
func Domain(c api.Claim, o Options) (*libvirtxml.Domain, error) {
	devs, err := Hostdevs(c, o)
	if err != nil {
		return nil, err
	}
	meta, err := MetadataOf(c, o).marshal()
	if err != nil {
		return nil, err
	}
	return &libvirtxml.Domain{
		Type:     "kvm",
		Name:     c.ID,
		Metadata: &libvirtxml.DomainMetadata{XML: string(meta)},
		Memory:   &libvirtxml.DomainMemory{Value: 16, Unit: "GiB"},
		VCPU:     &libvirtxml.DomainVCPU{Value: uint(8 * len(c.GPUs))},
		OS: &libvirtxml.DomainOS{
			Type: &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "q35", Type: "hvm"},
		},
		Features: &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}},
		CPU:      &libvirtxml.DomainCPU{Mode: "host-passthrough"},
		Devices:  &libvirtxml.DomainDeviceList{Hostdevs: devs},
	}, nil
}

// DomainXML is Domain, marshalled with a trailing newline.
func DomainXML(c api.Claim, o Options) ([]byte, error) {
	d, err := Domain(c, o)
	if err != nil {
		return nil, err
	}
	s, err := d.Marshal()
	if err != nil {
		return nil, fmt.Errorf("claim %s: domain: %w", c.ID, err)
	}
	return []byte(s + "\n"), nil
}

// QEMUArgs returns QEMU's arguments for the claim's functions: one
// "-device vfio-pci,host=ADDR,..." pair per function, each GPU on the PCIe
// root port "gpuherd-rpN" (added as "-device pcie-root-port") with its
// companions on the same slot.
func QEMUArgs(c api.Claim) ([]string, error) {
	if len(c.GPUs) == 0 {
		return nil, fmt.Errorf("claim %s holds no GPU", c.ID)
	}
	var args []string
	for i, g := range c.GPUs {
		port := "gpuherd-rp" + strconv.Itoa(i)
		args = append(args, "-device", fmt.Sprintf("pcie-root-port,id=%s,chassis=%d,slot=%d", port, 0x10+i, i))
		fns := append([]string{g.PCIAddress}, companions(g)...)
		for fn, addr := range fns {
			if _, err := parsePCI(addr); err != nil {
				return nil, fmt.Errorf("claim %s: %w", c.ID, err)
			}
			dev := fmt.Sprintf("vfio-pci,host=%s,bus=%s,addr=0x0.0x%x", addr, port, fn)
			if fn == 0 && len(fns) > 1 {
				dev += ",multifunction=on"
			}
			args = append(args, "-device", dev)
		}
	}
	return args, nil
}

// QEMU writes QEMUArgs as one shell-quoted line per device.
func QEMU(c api.Claim) ([]byte, error) {
	args, err := QEMUArgs(c)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	for i := 0; i+1 < len(args); i += 2 {
		b.WriteString(args[i] + " " + args[i+1])
		if i+2 < len(args) {
			b.WriteString(" \\")
		}
		b.WriteString("\n")
	}
	return []byte(b.String()), nil
}

// parsePCI reads "dddd:bb:ss.f" into libvirt's address.
func parsePCI(addr string) (*libvirtxml.DomainAddressPCI, error) {
	var d, b, s, f uint
	if len(addr) != 12 {
		return nil, fmt.Errorf("PCI address %q: want dddd:bb:ss.f", addr)
	}
	if _, err := fmt.Sscanf(addr, "%04x:%02x:%02x.%1x", &d, &b, &s, &f); err != nil || s > 0x1f || f > 7 {
		return nil, fmt.Errorf("PCI address %q: want dddd:bb:ss.f", addr)
	}
	return &libvirtxml.DomainAddressPCI{Domain: uintp(d), Bus: uintp(b), Slot: uintp(s), Function: uintp(f)}, nil
}

// formatPCI writes libvirt's address as sysfs names the device.
func formatPCI(a *libvirtxml.DomainAddressPCI) (string, bool) {
	if a == nil || a.Domain == nil || a.Bus == nil || a.Slot == nil || a.Function == nil ||
		*a.Domain > 0xffff || *a.Bus > 0xff || *a.Slot > 0x1f || *a.Function > 7 {
		return "", false
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", *a.Domain, *a.Bus, *a.Slot, *a.Function), true
}

func uintp(v uint) *uint { return &v }
