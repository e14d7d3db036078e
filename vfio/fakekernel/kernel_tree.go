package fakekernel

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpuherd/gpuherd/vfio"
)

// The simulated tree has the layout of the real one: device directories
// live under devices/pci<domain>:00/, and bus/pci/devices, the drivers'
// directories and the IOMMU groups hold relative symlinks to them, with the
// link texts the kernel uses. The model is computed from the device state
// on each lookup, so it can never disagree with it.

type nodeKind int

const (
	kindDir nodeKind = iota
	kindFile
	kindLink
	kindCharDev
)

type node struct {
	kind     nodeKind
	children []string // kindDir
	list     lister   // kindDir, when listing it costs: called only by entries
	k        *Kernel  // with list
	at       []string // with list
	link     string   // kindLink: the link text
	content  []byte   // kindFile, when readable
	readable bool
	writable bool
}

// lister computes the entries of the directory at parts p (as the tree
// function that built its node was given them) from k's state. Listers
// capture nothing (what they need comes as k and p), so that building a
// node allocates nothing: resolve builds one for every prefix of every
// path.
type lister func(k *Kernel, p []string) []string

func dirNode(children ...string) node { return node{kind: kindDir, children: children} }

// listedDir is a directory whose entries are computed only when listed:
// resolve walks every prefix of every path and needs only their kinds.
func listedDir(k *Kernel, p []string, list lister) node {
	return node{kind: kindDir, list: list, k: k, at: p}
}

// entries lists a directory node.
func (n node) entries() []string {
	if n.list != nil {
		return n.list(n.k, n.at)
	}
	return n.children
}

// The fixed directories on every path's way, built once.
var (
	rootDir   = dirNode("bus", "class", "devices", "kernel", "module")
	busDir    = dirNode("pci")
	busPCIDir = dirNode("devices", "drivers", "drivers_probe")
	kernelDir = dirNode("iommu_groups")
	groupDir  = dirNode("devices")
)

func linkNode(target string) node { return node{kind: kindLink, link: target} }
func roFile(content []byte) node  { return node{kind: kindFile, content: content, readable: true} }
func woFile() node                { return node{kind: kindFile, writable: true} }

// rootBus names the directory under devices/ that holds a device: one root
// bus per PCI domain is enough for a flat simulated topology.
func rootBus(addr string) string { return "pci" + addr[:4] + ":00" }

// onRootBus reports whether bus (a directory name under devices/) is the
// root bus of the device at addr: rootBus(addr) == bus, without building
// the name (resolve asks it for every device, for every path through
// devices/).
func onRootBus(bus, addr string) bool {
	return len(bus) == 10 && bus[:3] == "pci" && bus[3:7] == addr[:4] && bus[7:] == ":00"
}

// deviceDir is the canonical directory of a device, relative to the root.
func deviceDir(addr string) string { return "devices/" + rootBus(addr) + "/" + addr }

// maxLinkHops bounds link resolution like the kernel's MAXSYMLINKS.
const maxLinkHops = 40

// resolve walks parts from the root, following links in every element but
// the last (and the last too when followLast), and returns the canonical
// parts and the node found. Errors are ENOENT, ENOTDIR or ELOOP.
func (k *Kernel) resolve(op, name string, parts []string, followLast bool) ([]string, node, error) {
	for hops := 0; ; hops++ {
		if hops > maxLinkHops {
			return nil, node{}, pathErr(op, name, syscall.ELOOP)
		}
		if len(parts) == 0 {
			n, _ := k.node(nil)
			return nil, n, nil
		}
		followed := false
		for i := 1; i <= len(parts); i++ {
			n, ok := k.node(parts[:i])
			if !ok {
				return nil, node{}, pathErr(op, name, syscall.ENOENT)
			}
			last := i == len(parts)
			if n.kind == kindLink && (!last || followLast) {
				var ok bool
				if parts, ok = followLink(parts, i, n.link); !ok {
					return nil, node{}, pathErr(op, name, syscall.ENOENT)
				}
				followed = true
				break
			}
			if last {
				return parts, n, nil
			}
			if n.kind != kindDir {
				return nil, node{}, pathErr(op, name, syscall.ENOTDIR)
			}
		}
		if !followed {
			return nil, node{}, pathErr(op, name, syscall.ENOENT)
		}
	}
}

// followLink returns parts with its first i elements, the last of which is
// a link with text link, replaced by where the link points (the link's
// directory joined with its text, cleaned as path.Join does), in a new
// slice; false when it points above the root.
func followLink(parts []string, i int, link string) ([]string, bool) {
	out := make([]string, 0, i+strings.Count(link, "/")+len(parts)-i)
	out = append(out, parts[:i-1]...)
	for rest := link; rest != ""; {
		var el string
		el, rest, _ = strings.Cut(rest, "/")
		switch el {
		case "", ".":
		case "..":
			if len(out) == 0 {
				return nil, false
			}
			out = out[:len(out)-1]
		default:
			out = append(out, el)
		}
	}
	return append(out, parts[i:]...), true
}

// node returns the sysfs node at canonical parts, without following links.
// k.mu must be held.
func (k *Kernel) node(p []string) (node, bool) {
	if len(p) == 0 {
		return rootDir, true
	}
	switch p[0] {
	case "class":
		return k.classNode(p[1:])
	case "module":
		return k.moduleNode(p[1:])
	case "bus":
		return k.busNode(p[1:])
	case "devices":
		return k.devicesNode(p[1:])
	case "kernel":
		return k.kernelNode(p[1:])
	}
	return node{}, false
}

// anyDev reports whether some device satisfies keep.
func (k *Kernel) anyDev(keep func(*kdev) bool) bool {
	for _, d := range k.devs {
		if keep(d) {
			return true
		}
	}
	return false
}

func (k *Kernel) addrs(keep func(*kdev) bool) []string {
	var out []string
	for a, d := range k.devs {
		if keep == nil || keep(d) {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out
}

func (k *Kernel) devicesNode(p []string) (node, bool) {
	if len(p) == 0 {
		return listedDir(k, p, func(k *Kernel, _ []string) []string {
			var buses []string
			for _, a := range k.addrs(nil) {
				buses = append(buses, rootBus(a))
			}
			return slices.Compact(buses)
		}), true
	}
	if len(p) == 1 {
		// Listing the bus costs a sort; a path through it only needs the
		// device (resolve walks every prefix of every path).
		if !k.anyDev(func(d *kdev) bool { return onRootBus(p[0], d.Address) }) {
			return node{}, false
		}
		return listedDir(k, p, func(k *Kernel, p []string) []string {
			return k.addrs(func(d *kdev) bool { return onRootBus(p[0], d.Address) })
		}), true
	}
	d, ok := k.devs[p[1]]
	if !ok || !onRootBus(p[0], d.Address) {
		return node{}, false
	}
	if len(p) == 2 {
		// Listed only when read: every attribute's path goes through it.
		return listedDir(k, p, func(k *Kernel, p []string) []string { return k.devs[p[1]].attributes() }), true
	}
	return k.deviceNode(d, p[2:])
}

func (k *Kernel) deviceNode(d *kdev, p []string) (node, bool) {
	if len(p) != 1 {
		return node{}, false
	}
	hex16 := func(v uint16) node { return roFile(fmt.Appendf(nil, "0x%04x\n", v)) }
	switch p[0] {
	case "vendor":
		return hex16(d.Vendor), true
	case "device":
		return hex16(d.Device), true
	case "subsystem_vendor":
		return hex16(d.SubsystemVendor), true
	case "subsystem_device":
		return hex16(d.SubsystemDevice), true
	case "class":
		return roFile(fmt.Appendf(nil, "0x%06x\n", d.Class)), true
	case "numa_node":
		return roFile(fmt.Appendf(nil, "%d\n", d.NUMANode)), true
	case "config":
		return roFile(d.config()), true
	case "driver_override":
		v := d.Override
		if v == "" {
			v = "(null)"
		}
		return node{kind: kindFile, content: []byte(v + "\n"), readable: true, writable: true}, true
	case "driver":
		if d.Driver != "" {
			return linkNode("../../../bus/pci/drivers/" + d.Driver), true
		}
	case "iommu_group":
		if d.IOMMUGroup >= 0 {
			return linkNode("../../../kernel/iommu_groups/" + strconv.Itoa(d.IOMMUGroup)), true
		}
	case "physfn":
		if d.PhysFn != "" {
			return linkNode("../" + d.PhysFn), true
		}
	case "reset", "reset_method":
		return resetNode(d, p[0])
	}
	return node{}, false
}

// attributes lists the entries of the device's directory.
func (d *kdev) attributes() []string {
	c := []string{"class", "config", "device", "driver_override", "numa_node", "subsystem_device", "subsystem_vendor", "vendor"}
	if d.Driver != "" {
		c = append(c, "driver")
	}
	if d.IOMMUGroup >= 0 {
		c = append(c, "iommu_group")
	}
	if d.PhysFn != "" {
		c = append(c, "physfn")
	}
	if !d.NoReset {
		c = append(c, "reset", "reset_method")
	}
	return c
}

// config is the device's PCI config space header: enough for lspci-like
// readers and for the all-ones check, little-endian as the bus is.
func (d *kdev) config() []byte {
	c := make([]byte, 256)
	if d.ConfigAllOnes {
		for i := range c {
			c[i] = 0xff
		}
		return c
	}
	binary.LittleEndian.PutUint16(c[0x00:], d.Vendor)
	binary.LittleEndian.PutUint16(c[0x02:], d.Device)
	c[0x09], c[0x0a], c[0x0b] = byte(d.Class), byte(d.Class>>8), byte(d.Class>>16)
	if d.Class>>8 == vfio.ClassBridge>>8 {
		c[0x0e] = 0x01 // header type 1: PCI-to-PCI bridge
	} else {
		binary.LittleEndian.PutUint16(c[0x2c:], d.SubsystemVendor)
		binary.LittleEndian.PutUint16(c[0x2e:], d.SubsystemDevice)
	}
	return c
}

func (k *Kernel) busNode(p []string) (node, bool) {
	if len(p) == 0 {
		return busDir, true
	}
	if p[0] != "pci" {
		return node{}, false
	}
	if len(p) == 1 {
		return busPCIDir, true
	}
	switch p[1] {
	case "drivers_probe":
		if len(p) == 2 {
			return woFile(), true
		}
	case "devices":
		switch len(p) {
		case 2:
			return listedDir(k, p, func(k *Kernel, _ []string) []string { return k.addrs(nil) }), true
		case 3:
			if _, ok := k.devs[p[2]]; ok {
				return linkNode("../../../" + deviceDir(p[2])), true
			}
		}
	case "drivers":
		if len(p) == 2 {
			return dirNode(k.drivers...), true
		}
		drv := p[2]
		if !k.loaded(drv) {
			return node{}, false
		}
		switch len(p) {
		case 3:
			return listedDir(k, p, func(k *Kernel, p []string) []string {
				return append([]string{"bind", "unbind"}, k.addrs(func(d *kdev) bool { return d.Driver == p[2] })...)
			}), true
		case 4:
			if p[3] == "bind" || p[3] == "unbind" {
				return woFile(), true
			}
			if d, ok := k.devs[p[3]]; ok && d.Driver == drv {
				return linkNode("../../../../" + deviceDir(p[3])), true
			}
		}
	}
	return node{}, false
}

func (k *Kernel) kernelNode(p []string) (node, bool) {
	if len(p) == 0 {
		return kernelDir, true
	}
	if p[0] != "iommu_groups" {
		return node{}, false
	}
	if len(p) == 1 {
		return listedDir(k, p, func(k *Kernel, _ []string) []string { return k.groups(nil) }), true
	}
	g, err := parseGroupName(p[1])
	if err != nil {
		return node{}, false
	}
	if !k.anyDev(func(d *kdev) bool { return d.IOMMUGroup == g }) {
		return node{}, false
	}
	switch {
	case len(p) == 2:
		return groupDir, true
	case p[2] != "devices":
		return node{}, false
	case len(p) == 3:
		return listedDir(k, p, func(k *Kernel, p []string) []string {
			g, _ := parseGroupName(p[1])
			return k.addrs(func(d *kdev) bool { return d.IOMMUGroup == g })
		}), true
	case len(p) == 4:
		if d, ok := k.devs[p[3]]; ok && d.IOMMUGroup == g {
			return linkNode("../../../../" + deviceDir(p[3])), true
		}
	}
	return node{}, false
}

// parseGroupName parses a directory name under kernel/iommu_groups; like
// sysfs, it accepts only the canonical decimal form.
func parseGroupName(name string) (int, error) {
	n, err := strconv.Atoi(name)
	if err != nil || n < 0 || n > vfio.MaxIOMMUGroup || strconv.Itoa(n) != name {
		return 0, fmt.Errorf("%s is not an IOMMU group number", quote(name))
	}
	return n, nil
}

// groups returns the IOMMU groups that have a member for which keep holds,
// as directory names.
func (k *Kernel) groups(keep func(*kdev) bool) []string {
	var gs []int
	for _, d := range k.devs {
		if d.IOMMUGroup >= 0 && (keep == nil || keep(d)) {
			gs = append(gs, d.IOMMUGroup)
		}
	}
	slices.Sort(gs)
	gs = slices.Compact(gs)
	names := make([]string, len(gs))
	for i, g := range gs {
		names[i] = strconv.Itoa(g)
	}
	return names
}

// devNode returns the node at parts under the device root: /dev/vfio/vfio
// always (the vfio module is loaded) and /dev/vfio/N while a member of
// group N is bound to vfio-pci, as vfio creates and removes it.
func (k *Kernel) devNode(p []string) (node, bool) {
	if len(p) == 0 {
		return dirNode("vfio"), true
	}
	if p[0] != "vfio" {
		return node{}, false
	}
	onVFIO := k.groups(func(d *kdev) bool { return d.Driver == vfio.DriverVFIO })
	switch len(p) {
	case 1:
		return dirNode(append([]string{"vfio"}, onVFIO...)...), true
	case 2:
		if p[1] == "vfio" || slices.Contains(onVFIO, p[1]) {
			return node{kind: kindCharDev}, true
		}
	}
	return node{}, false
}
