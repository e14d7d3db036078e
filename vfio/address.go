package vfio

import (
	"fmt"
	"regexp"
	"strings"
)

// AddressPattern is the only PCI address form this package builds paths
// from: domain:bus:device.function in lower-case hex, as sysfs names devices.
const AddressPattern = `^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`

var addressRE = regexp.MustCompile(AddressPattern)

// addressLen is the length of every valid address; checked first so that a
// huge hostile value is rejected without scanning it.
const addressLen = len("0000:3b:00.0")

// ValidateAddress reports whether addr is a PCI address in sysfs form. It is
// called before any path is built from an address, so that a value from a
// request, a config file or sysfs itself can never name another file.
// The error is an *AddressError; errors.Is(err, ErrInvalidAddress) holds.
func ValidateAddress(addr string) error {
	if addressRE.MatchString(addr) {
		return nil
	}
	return &AddressError{Value: addr, Reason: addressProblem(addr)}
}

// addressProblem says, for an address the pattern rejected, what is wrong in
// words an operator can act on.
func addressProblem(addr string) string {
	switch {
	case addr == "":
		return "empty"
	case len(addr) != addressLen:
		return fmt.Sprintf("%d bytes long, want %d", len(addr), addressLen)
	case strings.ContainsAny(addr, "ABCDEF") && addressRE.MatchString(strings.ToLower(addr)):
		return "upper-case hex (sysfs names are lower-case)"
	default:
		return "not of the form dddd:bb:dd.f"
	}
}

// AddressFromNVMLBusID converts an NVML bus ID ("00000000:3B:00.0", an
// 8-digit domain in upper case, possibly NUL-padded as NVML's C string is)
// to the sysfs address of the same function ("0000:3b:00.0").
func AddressFromNVMLBusID(busID string) (string, error) {
	s := strings.TrimRight(busID, "\x00")
	bad := func(reason string) (string, error) {
		return "", &AddressError{Value: busID, Reason: "NVML bus ID " + reason}
	}
	domain, rest, ok := strings.Cut(s, ":")
	if !ok {
		return bad("has no domain")
	}
	switch len(domain) {
	case 4:
	case 8:
		// PCI domains above 0xffff do exist (Intel VMD) but sysfs then
		// uses more than four digits, which this package does not accept.
		if strings.Trim(domain[:4], "0") != "" {
			return bad("has a domain above 0xffff")
		}
		domain = domain[4:]
	default:
		return bad(fmt.Sprintf("has a %d-digit domain, want 4 or 8", len(domain)))
	}
	addr := strings.ToLower(domain + ":" + rest)
	if err := ValidateAddress(addr); err != nil {
		return bad("is not of the form 00000000:BB:DD.F")
	}
	return addr, nil
}
