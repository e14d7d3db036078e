package vfio

import (
	"bytes"
	"fmt"
	"path"
	"strconv"
	"strings"
)

// maxValueLen bounds a sysfs attribute value this package parses. Real ones
// are a few bytes; anything longer is garbage and is not worth scanning.
const maxValueLen = 256

// sysfsValue trims the newline sysfs appends (and stray surrounding blanks)
// and rejects values that cannot be a real attribute.
func sysfsValue(b []byte) (string, error) {
	if len(b) > maxValueLen {
		return "", fmt.Errorf("%w: %d bytes, longer than any attribute", ErrMalformed, len(b))
	}
	s := string(bytes.TrimSpace(b))
	if s == "" {
		return "", fmt.Errorf("%w: empty", ErrMalformed)
	}
	return s, nil
}

// parseHex parses a "0x"-prefixed hex attribute of at most bits bits, as
// the kernel prints vendor ("0x10de\n") and class ("0x030200\n").
func parseHex(b []byte, bits int) (uint64, error) {
	s, err := sysfsValue(b)
	if err != nil {
		return 0, err
	}
	digits, ok := strings.CutPrefix(s, "0x")
	if !ok || digits == "" {
		return 0, fmt.Errorf("%w: %s is not 0x-prefixed hex", ErrMalformed, quote(s))
	}
	v, err := strconv.ParseUint(digits, 16, bits)
	if err != nil {
		return 0, fmt.Errorf("%w: %s is not a %d-bit hex number", ErrMalformed, quote(s), bits)
	}
	return v, nil
}

// parseID parses a 16-bit ID attribute: vendor, device, subsystem_*.
func parseID(b []byte) (uint16, error) {
	v, err := parseHex(b, 16)
	return uint16(v), err
}

// parseClass parses the class attribute: 24 bits, base class, subclass and
// programming interface ("0x030200\n").
func parseClass(b []byte) (uint32, error) {
	v, err := parseHex(b, 24)
	return uint32(v), err
}

// MaxNUMANode is far above any real machine; it only keeps garbage out.
const MaxNUMANode = 1 << 16

// parseNUMANode parses numa_node: a decimal node number, or -1 when the
// platform does not say.
func parseNUMANode(b []byte) (int, error) {
	s, err := sysfsValue(b)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < -1 || n > MaxNUMANode {
		return 0, fmt.Errorf("%w: numa_node %s is not -1 or a node number", ErrMalformed, quote(s))
	}
	return n, nil
}

// pageSize is the most one sysfs attribute holds or one write passes to a
// store callback.
const pageSize = 4096

// parseDriverOverride parses driver_override: "(null)\n" when unset, the
// override otherwise. The kernel accepts any string there (an operator may
// have written "none", or a typo), and gpuherd only compares it and writes
// it back, never builds a path from it, so anything but an oversized value
// is returned as it is rather than hiding the device from the inventory.
func parseDriverOverride(b []byte) (string, error) {
	if len(b) > pageSize {
		return "", fmt.Errorf("%w: driver_override is %d bytes, more than the kernel stores", ErrMalformed, len(b))
	}
	s, _, _ := strings.Cut(string(b), "\n")
	if s == "(null)" {
		return "", nil
	}
	return s, nil
}

// maxDriverNameLen is generous: the kernel's longest PCI driver names are
// around 30 bytes.
const maxDriverNameLen = 64

// ValidateDriverName accepts what can be a driver directory under
// bus/pci/drivers and nothing that could change the path it is joined into.
func ValidateDriverName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > maxDriverNameLen {
		return fmt.Errorf("%w: %s is not a driver name", ErrMalformed, quote(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '_' || c == '-' || c == '.' || c == '+'
		if !ok {
			return fmt.Errorf("%w: %s is not a driver name", ErrMalformed, quote(name))
		}
	}
	return nil
}

// parseDriverLink takes the driver name from the target of a device's
// driver link ("../../../bus/pci/drivers/nvidia").
func parseDriverLink(target string) (string, error) {
	name := linkBase(target)
	if err := ValidateDriverName(name); err != nil {
		return "", fmt.Errorf("driver link %s: %w", quote(target), err)
	}
	return name, nil
}

// MaxIOMMUGroup bounds group numbers; real ones stay in the hundreds.
const MaxIOMMUGroup = 1 << 20

// parseGroupLink takes the group number from the target of a device's
// iommu_group link ("../../../kernel/iommu_groups/12").
// pcieRoot is the root complex in a bus/pci/devices link's target
// ("../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0" names
// "pci0000:3a"), or "" when none is there.
func pcieRoot(target string) string {
	for _, part := range strings.Split(target, "/") {
		if len(part) == len("pci0000:00") && strings.HasPrefix(part, "pci") && part[7] == ':' && isHex(part[3:7]) && isHex(part[8:]) {
			return part
		}
	}
	return ""
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return s != ""
}

func parseGroupLink(target string) (int, error) {
	return parseGroupName(linkBase(target))
}

// parseGroupName parses a directory name under kernel/iommu_groups.
func parseGroupName(name string) (int, error) {
	n, err := strconv.Atoi(name)
	// Atoi accepts "+12" and "012"; sysfs never prints either, and a name
	// that does not round-trip would build a different path than was read.
	if err != nil || n < 0 || n > MaxIOMMUGroup || strconv.Itoa(n) != name {
		return 0, fmt.Errorf("%w: %s is not an IOMMU group number", ErrMalformed, quote(name))
	}
	return n, nil
}

// linkBase is the last element of a link target, ignoring a trailing slash.
func linkBase(target string) string {
	if len(target) > 4096 { // PATH_MAX: no real link is longer
		return ""
	}
	b := path.Base(strings.TrimRight(target, "/"))
	if b == "." || b == "/" {
		return ""
	}
	return b
}
