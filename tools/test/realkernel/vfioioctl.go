//go:build linux

package main

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// VFIO's ioctls, from include/uapi/linux/vfio.h (stable UAPI). Each is
// _IO(VFIO_TYPE, VFIO_BASE + n): VFIO_TYPE is ';' (0x3b), VFIO_BASE 100,
// and _IO(t, nr) = t<<8 | nr (no size, no direction bits: VFIO passes its
// structs with an argsz field instead).
const (
	vfioGetAPIVersion     = 0x3b<<8 | (100 + 0) // VFIO_GET_API_VERSION  = 0x3b64
	vfioCheckExtension    = 0x3b<<8 | (100 + 1) // VFIO_CHECK_EXTENSION  = 0x3b65
	vfioSetIOMMU          = 0x3b<<8 | (100 + 2) // VFIO_SET_IOMMU        = 0x3b66
	vfioGroupGetStatus    = 0x3b<<8 | (100 + 3) // VFIO_GROUP_GET_STATUS = 0x3b67
	vfioGroupSetContainer = 0x3b<<8 | (100 + 4) // VFIO_GROUP_SET_CONTAINER = 0x3b68
	vfioGroupGetDeviceFD  = 0x3b<<8 | (100 + 6) // VFIO_GROUP_GET_DEVICE_FD = 0x3b6a
	vfioDeviceGetInfo     = 0x3b<<8 | (100 + 7) // VFIO_DEVICE_GET_INFO  = 0x3b6b

	vfioAPIVersion = 0 // VFIO_API_VERSION
	vfioType1IOMMU = 1 // VFIO_TYPE1_IOMMU
	vfioType1v2    = 3 // VFIO_TYPE1v2_IOMMU

	vfioGroupFlagsViable       = 1 << 0 // VFIO_GROUP_FLAGS_VIABLE
	vfioGroupFlagsContainerSet = 1 << 1 // VFIO_GROUP_FLAGS_CONTAINER_SET
	vfioDeviceFlagsPCI         = 1 << 1 // VFIO_DEVICE_FLAGS_PCI
	vfioPCINumRegions          = 9      // VFIO_PCI_NUM_REGIONS: BAR0-5, ROM, config, VGA
)

// struct vfio_group_status { __u32 argsz; __u32 flags; }
type vfioGroupStatus struct {
	Argsz uint32
	Flags uint32
}

// struct vfio_device_info { __u32 argsz, flags, num_regions, num_irqs; }
// (newer kernels append cap_offset and a pad; argsz says which we know).
type vfioDeviceInfo struct {
	Argsz      uint32
	Flags      uint32
	NumRegions uint32
	NumIRQs    uint32
}

// ioctl passes an integer argument (or none).
func ioctl(fd int, req, arg uintptr) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
	if errno != 0 {
		return r, errno
	}
	return r, nil
}

// ioctlPtr passes a pointer; the conversion to uintptr happens in the
// Syscall expression itself, as unsafe.Pointer's rules require.
func ioctlPtr(fd int, req uintptr, arg unsafe.Pointer) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if errno != 0 {
		return r, errno
	}
	return r, nil
}

// vfioReport is what opening a group through VFIO showed.
type vfioReport struct {
	APIVersion  int
	Type1v2     bool
	Viable      bool // VFIO_GROUP_FLAGS_VIABLE before any container
	Attached    bool // VFIO_GROUP_FLAGS_CONTAINER_SET after SET_CONTAINER
	IOMMU       int  // the type VFIO_SET_IOMMU accepted
	DevicePCI   bool // VFIO_DEVICE_FLAGS_PCI of the device fd
	NumRegions  uint32
	NumIRQs     uint32
	ContainerFD bool
}

// groupStatus opens /dev/vfio/<group> and reads its status only.
func groupStatus(group int) (uint32, error) {
	fd, err := unix.Open(fmt.Sprintf("/dev/vfio/%d", group), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	st := vfioGroupStatus{Argsz: uint32(unsafe.Sizeof(vfioGroupStatus{}))}
	if _, err := ioctlPtr(fd, vfioGroupGetStatus, unsafe.Pointer(&st)); err != nil {
		return 0, fmt.Errorf("VFIO_GROUP_GET_STATUS: %w", err)
	}
	return st.Flags, nil
}

// openThroughVFIO does what a VMM does with a group before it starts a VM:
// a container, the group in it, the type-1 IOMMU, and the device's fd.
// Every descriptor is closed before it returns (an open device keeps
// vfio-pci from unbinding).
func openThroughVFIO(group int, addr string) (vfioReport, error) {
	var rep vfioReport
	container, err := unix.Open("/dev/vfio/vfio", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return rep, fmt.Errorf("open /dev/vfio/vfio: %w", err)
	}
	defer unix.Close(container)
	rep.ContainerFD = true
	v, err := ioctl(container, vfioGetAPIVersion, 0)
	if err != nil {
		return rep, fmt.Errorf("VFIO_GET_API_VERSION: %w", err)
	}
	rep.APIVersion = int(v)
	if rep.APIVersion != vfioAPIVersion {
		return rep, fmt.Errorf("VFIO API version %d, want %d", rep.APIVersion, vfioAPIVersion)
	}
	ext, err := ioctl(container, vfioCheckExtension, vfioType1v2)
	if err != nil {
		return rep, fmt.Errorf("VFIO_CHECK_EXTENSION(TYPE1v2): %w", err)
	}
	rep.Type1v2 = ext == 1

	gfd, err := unix.Open(fmt.Sprintf("/dev/vfio/%d", group), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return rep, fmt.Errorf("open /dev/vfio/%d: %w", group, err)
	}
	defer unix.Close(gfd)
	st := vfioGroupStatus{Argsz: uint32(unsafe.Sizeof(vfioGroupStatus{}))}
	if _, err := ioctlPtr(gfd, vfioGroupGetStatus, unsafe.Pointer(&st)); err != nil {
		return rep, fmt.Errorf("VFIO_GROUP_GET_STATUS: %w", err)
	}
	rep.Viable = st.Flags&vfioGroupFlagsViable != 0
	if !rep.Viable {
		return rep, fmt.Errorf("group %d is not viable (flags %#x)", group, st.Flags)
	}
	cfd := int32(container)
	if _, err := ioctlPtr(gfd, vfioGroupSetContainer, unsafe.Pointer(&cfd)); err != nil {
		return rep, fmt.Errorf("VFIO_GROUP_SET_CONTAINER: %w", err)
	}
	if _, err := ioctlPtr(gfd, vfioGroupGetStatus, unsafe.Pointer(&st)); err != nil {
		return rep, fmt.Errorf("VFIO_GROUP_GET_STATUS: %w", err)
	}
	rep.Attached = st.Flags&vfioGroupFlagsContainerSet != 0
	iommu := vfioType1IOMMU
	if rep.Type1v2 {
		iommu = vfioType1v2
	}
	if _, err := ioctl(container, vfioSetIOMMU, uintptr(iommu)); err != nil {
		if errors.Is(err, unix.EPERM) {
			err = fmt.Errorf("%w (no interrupt remapping? QEMU needs intel-iommu,intremap=on)", err)
		}
		return rep, fmt.Errorf("VFIO_SET_IOMMU(%d): %w", iommu, err)
	}
	rep.IOMMU = iommu
	name, err := unix.BytePtrFromString(addr)
	if err != nil {
		return rep, err
	}
	dfd, err := ioctlPtr(gfd, vfioGroupGetDeviceFD, unsafe.Pointer(name))
	if err != nil {
		return rep, fmt.Errorf("VFIO_GROUP_GET_DEVICE_FD(%s): %w", addr, err)
	}
	defer unix.Close(int(dfd))
	info := vfioDeviceInfo{Argsz: uint32(unsafe.Sizeof(vfioDeviceInfo{}))}
	if _, err := ioctlPtr(int(dfd), vfioDeviceGetInfo, unsafe.Pointer(&info)); err != nil {
		return rep, fmt.Errorf("VFIO_DEVICE_GET_INFO: %w", err)
	}
	rep.DevicePCI = info.Flags&vfioDeviceFlagsPCI != 0
	rep.NumRegions, rep.NumIRQs = info.NumRegions, info.NumIRQs
	return rep, nil
}
