package fakekernel

import (
	"fmt"
	"slices"

	"github.com/gpuherd/gpuherd/vfio"
)

// Hold makes the next unbind of the device at addr, from whatever driver it
// is on, block until Unhold: what nvidia does while anything still holds the
// card ("NVRM: Attempting to remove device ... with non-zero usage count").
// Until then, other writes to the same device wait behind it, as they would
// on the kernel's device lock; other devices are unaffected.
func (k *Kernel) Hold(addr string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.devs[addr]; !ok {
		return fmt.Errorf("vfio: simulated kernel: hold %s: no such device", quote(addr))
	}
	if k.holds[addr] == nil {
		k.holds[addr] = make(chan struct{})
		if k.blocked == nil {
			k.blocked = make(map[string]chan struct{})
		}
		k.blocked[addr] = make(chan struct{})
	}
	return nil
}

// Blocked returns a channel that is closed once an unbind of the held
// device at addr waits on Hold: a test's cue that a move is half-way.
func (k *Kernel) Blocked(addr string) (<-chan struct{}, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	b := k.blocked[addr]
	if b == nil {
		return nil, fmt.Errorf("vfio: simulated kernel: blocked %s: not held; call Hold first", quote(addr))
	}
	return b, nil
}

// Unhold releases Hold: a blocked unbind completes, later ones do not block.
func (k *Kernel) Unhold(addr string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if h := k.holds[addr]; h != nil {
		close(h)
		delete(k.holds, addr)
		delete(k.blocked, addr)
	}
}

// Remove takes the device at addr off the bus: its directory and every link
// to it disappear, as on a hot-unplug or a card that fell off the bus and
// was removed by pciehp.
func (k *Kernel) Remove(addr string) error {
	if err := k.mutate("remove", addr, func(*kdev) { delete(k.devs, addr) }); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.emit(vfio.PCIEvent{Action: vfio.UeventRemove, Address: addr})
	return nil
}

// SetConfigAllOnes makes the device at addr read ff from all of its config
// space, as a card that stopped answering on the bus does while its
// directory is still there.
func (k *Kernel) SetConfigAllOnes(addr string) error {
	return k.mutate("set config all ones", addr, func(d *kdev) { d.ConfigAllOnes = true })
}

// mutate applies a fault to one device and saves the state, undoing the
// fault if the state cannot be saved.
func (k *Kernel) mutate(op, addr string, f func(*kdev)) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	d, ok := k.devs[addr]
	if !ok {
		return fmt.Errorf("vfio: simulated kernel: %s %s: no such device", op, quote(addr))
	}
	prev := *d
	f(d)
	if err := k.save(); err != nil {
		*d = prev
		k.devs[addr] = d
		return fmt.Errorf("vfio: simulated kernel: %s %s: save state: %w", op, addr, err)
	}
	return nil
}

// Writes returns every write the Kernel received, in order.
func (k *Kernel) Writes() []Write {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.writes)
}
