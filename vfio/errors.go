package vfio

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Every error this package returns that matches one of them
// does so through errors.Is, usually wrapped in a typed error that names the
// device.
var (
	// ErrInvalidAddress: a PCI address is not in the sysfs form 0000:3b:00.0.
	ErrInvalidAddress = errors.New("invalid PCI address")
	// ErrInvalidPath: an FS name is malformed or escapes its root.
	ErrInvalidPath = errors.New("invalid sysfs path")
	// ErrMalformed: a sysfs value could not be parsed.
	ErrMalformed = errors.New("malformed sysfs value")
	// ErrVanished: the device directory is gone (hot-unplugged or fell off the bus).
	ErrVanished = errors.New("device vanished from the PCI bus")
	// ErrConfigAllOnes: config space reads as all ones, the card no longer answers.
	ErrConfigAllOnes = errors.New("PCI config space reads all ones (device fell off the bus)")
	// ErrNoIOMMUGroup: the device has no IOMMU group, so vfio cannot take it.
	ErrNoIOMMUGroup = errors.New("device has no IOMMU group")
	// ErrGroupNotViable: a member of the IOMMU group keeps it from being given to a VM.
	ErrGroupNotViable = errors.New("IOMMU group is not viable for vfio")
	// ErrNotAllowed: the device is not on the allow list, gpuherd must not touch it.
	ErrNotAllowed = errors.New("device is not on the allow list")
	// ErrStuck: a sysfs write to the device did not return within its deadline.
	ErrStuck = errors.New("sysfs write is stuck")
	// ErrBindFailed: the writes succeeded but the device did not end where it should.
	ErrBindFailed = errors.New("device did not end on the expected driver")
)

// maxQuoted bounds how much of a caller-supplied value an error message
// repeats, so a hostile multi-megabyte address cannot flood the logs.
const maxQuoted = 64

// quote renders s for an error message: Go-quoted (control bytes and NULs
// escaped) and cut to maxQuoted bytes with a note of the full length.
func quote(s string) string {
	if len(s) <= maxQuoted {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:maxQuoted], len(s))
}

// AddressError reports a PCI address that failed validation.
type AddressError struct {
	Value  string // the rejected value, as given
	Reason string // what is wrong with it
}

func (e *AddressError) Error() string {
	return fmt.Sprintf("vfio: invalid PCI address %s: %s (want the sysfs form 0000:3b:00.0, lower-case hex)", quote(e.Value), e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidAddress) hold.
func (e *AddressError) Unwrap() error { return ErrInvalidAddress }

// DeviceError reports a failed operation on one PCI device.
type DeviceError struct {
	Address string // PCI address of the device
	Op      string // what was being done: "read vendor", "health", ...
	Err     error
}

func (e *DeviceError) Error() string {
	return fmt.Sprintf("vfio: %s: %s: %v", e.Address, e.Op, e.Err)
}

func (e *DeviceError) Unwrap() error { return e.Err }

// GroupError reports an IOMMU group member that makes the group unusable for
// passthrough. errors.Is(err, ErrGroupNotViable) holds.
type GroupError struct {
	Group   int    // IOMMU group number
	Address string // the offending member
	Vendor  uint16
	Device  uint16
	Class   uint32
	Driver  string // its current driver; "" when none
	Reason  string
}

func (e *GroupError) Error() string {
	drv := e.Driver
	if drv == "" {
		drv = "no driver"
	}
	return fmt.Sprintf("vfio: IOMMU group %d is not viable: member %s [%04x:%04x class %06x] on %s: %s",
		e.Group, e.Address, e.Vendor, e.Device, e.Class, drv, e.Reason)
}

// Unwrap makes errors.Is(err, ErrGroupNotViable) hold.
func (e *GroupError) Unwrap() error { return ErrGroupNotViable }

// StuckError reports a sysfs write that did not return in time, or a write
// refused because an earlier one to the same device is still pending.
// errors.Is(err, ErrStuck) holds; when the caller's context ended the wait,
// errors.Is(err, context.Canceled or DeadlineExceeded) holds too.
type StuckError struct {
	Address string        // PCI address of the device
	Op      string        // the pending write: `write "0000:3b:00.0" to bus/pci/...`
	Since   time.Time     // when the pending write was issued
	Timeout time.Duration // the deadline it missed; 0 when the context ended it
	Refused bool          // true: this call issued nothing, an older write is still pending
	Err     error         // the context's error, if that is what ended the wait
}

func (e *StuckError) Error() string {
	const hint = "something on the host still holds the device (nvidia-persistenced, an open /dev/nvidia*); " +
		"the write stays pending in the kernel and gpuherd will not write to this device until it returns"
	switch {
	case e.Refused:
		return fmt.Sprintf("vfio: %s: refusing to write: earlier %s has not returned since %s; %s",
			e.Address, e.Op, e.Since.Format(time.RFC3339), hint)
	case e.Err != nil:
		return fmt.Sprintf("vfio: %s: %s abandoned (%v) before the kernel returned; %s", e.Address, e.Op, e.Err, hint)
	default:
		return fmt.Sprintf("vfio: %s: %s did not return within %s; %s", e.Address, e.Op, e.Timeout, hint)
	}
}

// Is makes errors.Is(err, ErrStuck) hold.
func (e *StuckError) Is(target error) bool { return target == ErrStuck }

// Unwrap exposes the context error, if any.
func (e *StuckError) Unwrap() error { return e.Err }
