package vfio

import (
	"fmt"
	"strconv"
	"strings"
)

// AllowEntry admits one vendor's devices: every device of the vendor when
// AnyDevice is set, else exactly Vendor:Device. Its text form is "10de:*"
// or "1b36:0005".
type AllowEntry struct {
	Vendor    uint16
	Device    uint16
	AnyDevice bool
}

// ParseAllowEntry parses "vvvv:*" or "vvvv:dddd" (four hex digits each,
// either case). A wildcard vendor is refused: it would let gpuherd unbind
// the host's own NICs and disks.
func ParseAllowEntry(s string) (AllowEntry, error) {
	t := strings.TrimSpace(s)
	v, d, ok := strings.Cut(t, ":")
	if !ok {
		return AllowEntry{}, fmt.Errorf("vfio: allow list entry %s: want vendor:device (\"10de:*\" or \"1b36:0005\")", quote(s))
	}
	vendor, err := parseHex4(v)
	if err != nil {
		return AllowEntry{}, fmt.Errorf("vfio: allow list entry %s: vendor %w", quote(s), err)
	}
	if d == "*" {
		return AllowEntry{Vendor: vendor, AnyDevice: true}, nil
	}
	device, err := parseHex4(d)
	if err != nil {
		return AllowEntry{}, fmt.Errorf("vfio: allow list entry %s: device %w (or * for every device of the vendor)", quote(s), err)
	}
	return AllowEntry{Vendor: vendor, Device: device}, nil
}

func parseHex4(s string) (uint16, error) {
	if len(s) != 4 {
		return 0, fmt.Errorf("%s is not four hex digits", quote(s))
	}
	v, err := strconv.ParseUint(s, 16, 16)
	if err != nil {
		return 0, fmt.Errorf("%s is not four hex digits", quote(s))
	}
	return uint16(v), nil
}

// String returns the text form ParseAllowEntry reads.
func (e AllowEntry) String() string {
	if e.AnyDevice {
		return fmt.Sprintf("%04x:*", e.Vendor)
	}
	return fmt.Sprintf("%04x:%04x", e.Vendor, e.Device)
}

// MarshalText lets configuration files hold entries as strings.
func (e AllowEntry) MarshalText() ([]byte, error) { return []byte(e.String()), nil }

// UnmarshalText lets configuration files hold entries as strings.
func (e *AllowEntry) UnmarshalText(b []byte) error {
	v, err := ParseAllowEntry(string(b))
	if err != nil {
		return err
	}
	*e = v
	return nil
}

// Allows reports whether the entry admits vendor:device.
func (e AllowEntry) Allows(vendor, device uint16) bool {
	return e.Vendor == vendor && (e.AnyDevice || e.Device == device)
}

// AllowList names the PCI IDs gpuherd may move between drivers. Any device
// not on it is never written to; an empty list allows nothing.
type AllowList []AllowEntry

// DefaultAllowList admits every NVIDIA device (GPUs and their audio, USB
// and NVSwitch functions) and nothing else.
func DefaultAllowList() AllowList {
	return AllowList{{Vendor: VendorNVIDIA, AnyDevice: true}}
}

// ParseAllowList parses entries in the form ParseAllowEntry reads.
func ParseAllowList(entries []string) (AllowList, error) {
	l := make(AllowList, 0, len(entries))
	for _, s := range entries {
		e, err := ParseAllowEntry(s)
		if err != nil {
			return nil, err
		}
		l = append(l, e)
	}
	return l, nil
}

// Allows reports whether any entry admits vendor:device.
func (l AllowList) Allows(vendor, device uint16) bool {
	for _, e := range l {
		if e.Allows(vendor, device) {
			return true
		}
	}
	return false
}

// String joins the entries with commas, for logs and error messages.
func (l AllowList) String() string {
	s := make([]string, len(l))
	for i, e := range l {
		s[i] = e.String()
	}
	return strings.Join(s, ",")
}
