package fakekernel

import (
	"bytes"
	"fmt"
	"io/fs"
	"strings"
	"syscall"

	"github.com/gpuherd/gpuherd/vfio"
)

// pageSize is the most one sysfs write passes to a store callback.
const pageSize = 4096

type writeKind int

const (
	writeOverride writeKind = iota // devices/.../<addr>/driver_override
	writeBind                      // bus/pci/drivers/<drv>/bind
	writeUnbind                    // bus/pci/drivers/<drv>/unbind, or <addr>/driver/unbind
	writeProbe                     // bus/pci/drivers_probe
)

// kwrite is a write resolved to the attribute it hits and the device it
// acts on.
type kwrite struct {
	kind   writeKind
	addr   string // the device the store acts on
	driver string // writeBind, writeUnbind
	data   []byte
}

// WriteFile implements vfio.FS with the semantics of the PCI core's sysfs
// stores.
func (k *Kernel) WriteFile(name string, data []byte) error {
	k.mu.Lock()
	k.writes = append(k.writes, Write{Name: name, Data: string(data)})
	idx := len(k.writes) - 1
	w, err := k.resolveWrite(name, data)
	k.mu.Unlock()
	if err == nil {
		err = k.doWrite(name, w)
	}
	if err != nil {
		k.mu.Lock()
		k.writes[idx].Err = err
		k.mu.Unlock()
	}
	return err
}

// resolveWrite maps a write to its store, failing as open(2) or the store's
// first checks would. k.mu must be held.
func (k *Kernel) resolveWrite(name string, data []byte) (kwrite, error) {
	dev, rel, err := vfio.CleanName("write", name)
	if err != nil {
		return kwrite{}, err
	}
	if dev {
		n, ok := k.devNode(split(rel))
		switch {
		case !ok:
			return kwrite{}, pathErr("write", name, syscall.ENOENT)
		case n.kind == kindDir:
			return kwrite{}, pathErr("write", name, syscall.EISDIR)
		}
		return kwrite{}, pathErr("write", name, syscall.EINVAL)
	}
	parts, n, err := k.resolve("write", name, split(rel), true)
	switch {
	case err != nil:
		return kwrite{}, err
	case n.kind == kindDir:
		return kwrite{}, pathErr("write", name, syscall.EISDIR)
	case !n.writable:
		return kwrite{}, pathErr("write", name, syscall.EACCES)
	}
	// The writable attributes, by canonical path:
	//   devices/<bus>/<addr>/driver_override
	//   bus/pci/drivers_probe
	//   bus/pci/drivers/<drv>/bind|unbind
	switch {
	case len(parts) == 4 && parts[0] == "devices" && parts[3] == "driver_override":
		return kwrite{kind: writeOverride, addr: parts[2], data: data}, nil
	case len(parts) == 3 && parts[2] == "drivers_probe":
		d, err := k.deviceNamed(name, data)
		if err != nil {
			return kwrite{}, err
		}
		return kwrite{kind: writeProbe, addr: d.Address}, nil
	case len(parts) == 5 && parts[2] == "drivers":
		d, err := k.deviceNamed(name, data)
		if err != nil {
			return kwrite{}, err
		}
		if parts[4] == "bind" {
			return kwrite{kind: writeBind, addr: d.Address, driver: parts[3]}, nil
		}
		if d.Driver != parts[3] {
			return kwrite{}, pathErr("write", name, syscall.ENODEV)
		}
		return kwrite{kind: writeUnbind, addr: d.Address, driver: parts[3]}, nil
	}
	return kwrite{}, pathErr("write", name, syscall.EACCES)
}

// deviceNamed finds the device a bind, unbind or probe write names. Like the
// kernel's sysfs_streq, one trailing newline is ignored; anything else that
// is not exactly a device name matches nothing.
func (k *Kernel) deviceNamed(name string, data []byte) (*kdev, error) {
	s := strings.TrimSuffix(string(data), "\n")
	if d, ok := k.devs[s]; ok {
		return d, nil
	}
	return nil, pathErr("write", name, syscall.ENODEV)
}

// doWrite runs the store under the device's lock, waiting outside k.mu so
// that a held unbind stalls only its own device.
func (k *Kernel) doWrite(name string, w kwrite) error {
	unlock := k.lockDevice(w.addr)
	defer unlock()
	if w.kind == writeUnbind {
		k.mu.Lock()
		hold := k.holds[w.addr]
		if b := k.blocked[w.addr]; hold != nil && b != nil {
			select {
			case <-b:
			default:
				close(b)
			}
		}
		k.mu.Unlock()
		if hold != nil {
			<-hold // NVRM: "Attempting to remove device ... with non-zero usage count"
		}
		k.waitGroupClosed(w.addr) // vfio-pci's remove waits for the VM to let go
	}

	k.mu.Lock()
	defer k.mu.Unlock()
	d, ok := k.devs[w.addr]
	if !ok { // removed while we waited
		if w.kind == writeOverride {
			return pathErr("write", name, syscall.ENOENT)
		}
		return pathErr("write", name, syscall.ENODEV)
	}
	prev := *d
	switch w.kind {
	case writeOverride:
		if len(w.data) >= pageSize-1 {
			return pathErr("write", name, syscall.EINVAL)
		}
		// driver_set_override: the value ends at the first newline (or
		// NUL); an empty value clears the override.
		v := w.data
		if i := bytes.IndexAny(v, "\n\x00"); i >= 0 {
			v = v[:i]
		}
		d.Override = string(v)
	case writeBind:
		switch {
		case !k.matches(d, w.driver):
			return pathErr("write", name, syscall.ENODEV)
		case d.Driver != "":
			return pathErr("write", name, syscall.EBUSY)
		case w.driver == vfio.DriverVFIO && d.IOMMUGroup < 0:
			return pathErr("write", name, syscall.EINVAL) // vfio-pci probe: no IOMMU group, -22
		}
		d.Driver = w.driver
	case writeUnbind:
		if d.Driver != w.driver {
			return pathErr("write", name, syscall.ENODEV)
		}
		d.Driver = ""
	case writeProbe:
		if d.Driver == "" {
			d.Driver = k.probe(d)
		}
	}
	if *d == prev {
		return nil
	}
	if err := k.save(); err != nil {
		*d = prev
		return &fs.PathError{Op: "write", Path: shorten(name), Err: fmt.Errorf("%w: save simulated machine state: %v", syscall.EIO, err)}
	}
	k.driverEvents(w.addr, prev.Driver, d.Driver)
	return nil
}

// matches is pci_bus_match: an override names the only driver that may
// bind; without one, drivers match by ID, and vfio-pci, whose id table only
// has override-only entries, never does.
func (k *Kernel) matches(d *kdev, driver string) bool {
	if d.Override != "" {
		return d.Override == driver
	}
	return driver != vfio.DriverVFIO && driver == d.HostDriver
}

// probe is what drivers_probe binds an unbound device to, "" for nothing.
// A failing probe (vfio-pci without an IOMMU group) leaves the device
// unbound and the write still succeeds, as bus_rescan_devices_helper does.
func (k *Kernel) probe(d *kdev) string {
	for _, drv := range k.drivers {
		if k.matches(d, drv) && (drv != vfio.DriverVFIO || d.IOMMUGroup >= 0) {
			return drv
		}
	}
	return ""
}

// lockDevice takes the device's lock, as the kernel's stores take
// device_lock; it returns the unlock function.
func (k *Kernel) lockDevice(addr string) func() {
	k.lockMu.Lock()
	l, ok := k.locks[addr]
	if !ok {
		l = make(chan struct{}, 1)
		k.locks[addr] = l
	}
	k.lockMu.Unlock()
	l <- struct{}{}
	return func() { <-l }
}
