package vfio

import (
	"fmt"
	"io/fs"
	"path"
	"strings"
)

// devPrefix marks FS names that live under the device root, not sysfs.
const devPrefix = "/dev/"

// CleanName checks an FS name and splits it into the root it belongs to and
// a cleaned slash path relative to that root ("." for the root itself).
// Names that escape their root, absolute names outside /dev/, and names
// holding NUL bytes are rejected: every implementation of FS goes through
// here, so a bug that builds a hostile name fails the same way against the
// fake kernel as against the real /sys.
func CleanName(op, name string) (dev bool, rel string, err error) {
	bad := func(why string) (bool, string, error) {
		return false, "", &fs.PathError{Op: op, Path: shorten(name), Err: fmt.Errorf("%w: %s", ErrInvalidPath, why)}
	}
	switch {
	case name == "":
		return bad("empty name")
	case strings.IndexByte(name, 0) >= 0:
		return bad("NUL byte in name")
	case len(name) > 4096:
		return bad("name longer than PATH_MAX")
	case name == "/dev" || strings.HasPrefix(name, devPrefix):
		dev, rel = true, strings.TrimLeft(strings.TrimPrefix(name, "/dev"), "/")
	case strings.HasPrefix(name, "/"):
		return bad("absolute name outside /dev/")
	default:
		rel = name
	}
	rel = path.Clean(rel)
	if rel == ".." || strings.HasPrefix(rel, "../") || strings.HasPrefix(rel, "/") {
		return bad("name escapes its root")
	}
	return dev, rel, nil
}

// shorten keeps error messages bounded when a name is huge.
func shorten(s string) string {
	if len(s) <= 2*maxQuoted {
		return s
	}
	return s[:2*maxQuoted] + "..."
}

// devicePath is the sysfs name of attr in the directory of the device at
// addr. addr must have passed ValidateAddress.
func devicePath(addr, attr string) string {
	if attr == "" {
		return "bus/pci/devices/" + addr
	}
	return "bus/pci/devices/" + addr + "/" + attr
}

// Fixed sysfs names this package reads or writes.
const (
	pciDevicesDir = "bus/pci/devices"
	pciDriversDir = "bus/pci/drivers"
	driversProbe  = "bus/pci/drivers_probe"
	iommuGroupDir = "kernel/iommu_groups"
	vfioDevDir    = "/dev/vfio"
)

// vfioGroupDevice is the character device vfio creates for a group.
func vfioGroupDevice(group int) string {
	return fmt.Sprintf("%s/%d", vfioDevDir, group)
}
