package vfio

import (
	"bytes"
	"context"
	"path"
	"strings"
)

// PCI uevent actions, as the kernel names them (KOBJ_ADD, ...), plus
// UeventResync, which a source sends when it lost events (a full netlink
// buffer): the receiver must then re-read everything.
const (
	UeventAdd    = "add"
	UeventRemove = "remove"
	UeventBind   = "bind"
	UeventUnbind = "unbind"
	UeventChange = "change"
	UeventResync = "resync"
)

// PCIEvent is one kernel uevent of the PCI subsystem: a function appeared,
// disappeared, or was bound to or unbound from a driver.
type PCIEvent struct {
	Action  string `json:"action"`
	Address string `json:"pci_address,omitempty"` // "" for UeventResync
	Driver  string `json:"driver,omitempty"`      // bind: the driver now bound
}

// PCIEventSource delivers the kernel's PCI uevents. WatchPCI returns a
// channel that receives every event from the call on, in order, until ctx
// ends (it is closed then, or when the source fails). The real source is
// NetlinkUevents (the kobject-uevent netlink socket); fakekernel.Kernel is
// the simulated one, driven by its own writes, Add and Remove.
type PCIEventSource interface {
	WatchPCI(ctx context.Context) (<-chan PCIEvent, error)
}

// parseUevent reads one kobject uevent datagram ("ACTION@DEVPATH" then
// NUL-separated KEY=VALUE pairs) and keeps it when it is about a PCI
// function. Messages of other subsystems and from udev ("libudev" header)
// are dropped.
func parseUevent(b []byte) (PCIEvent, bool) {
	fields := bytes.Split(b, []byte{0})
	if len(fields) < 2 || !bytes.Contains(fields[0], []byte("@")) {
		return PCIEvent{}, false
	}
	var ev PCIEvent
	var subsystem, devpath, slot string
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(string(f), "=")
		if !ok {
			continue
		}
		switch k {
		case "ACTION":
			ev.Action = v
		case "SUBSYSTEM":
			subsystem = v
		case "DEVPATH":
			devpath = v
		case "PCI_SLOT_NAME":
			slot = v
		case "DRIVER":
			ev.Driver = v
		}
	}
	if subsystem != "pci" || ev.Action == "" {
		return PCIEvent{}, false
	}
	ev.Address = slot
	if ev.Address == "" {
		ev.Address = path.Base(devpath)
	}
	if ValidateAddress(ev.Address) != nil {
		return PCIEvent{}, false
	}
	if ev.Action != UeventBind {
		ev.Driver = ""
	}
	return ev, true
}
