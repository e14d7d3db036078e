package fakekernel

import (
	"context"
	"slices"

	"github.com/gpuherd/gpuherd/vfio"
)

// uevSub is one WatchPCI subscriber: an unbounded queue, so the kernel
// never blocks on a slow watcher and never drops an event.
type uevSub struct {
	queue  []vfio.PCIEvent
	wake   chan struct{} // one slot: something was queued
	closed bool
}

// WatchPCI implements vfio.PCIEventSource for the simulated machine: every
// driver change its writes make, and every Add and Remove, is delivered
// as the kernel's uevent would be (unbind, then bind on a rebind).
func (k *Kernel) WatchPCI(ctx context.Context) (<-chan vfio.PCIEvent, error) {
	sub := &uevSub{wake: make(chan struct{}, 1)}
	k.mu.Lock()
	k.subs = append(k.subs, sub)
	k.mu.Unlock()
	out := make(chan vfio.PCIEvent)
	go func() {
		defer close(out)
		defer func() {
			k.mu.Lock()
			sub.closed = true
			k.subs = slices.DeleteFunc(k.subs, func(s *uevSub) bool { return s == sub })
			k.mu.Unlock()
		}()
		for {
			k.mu.Lock()
			batch := sub.queue
			sub.queue = nil
			k.mu.Unlock()
			for _, ev := range batch {
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
			select {
			case <-sub.wake:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// emit queues ev for every watcher. k.mu must be held.
func (k *Kernel) emit(ev vfio.PCIEvent) {
	for _, s := range k.subs {
		if s.closed {
			continue
		}
		s.queue = append(s.queue, ev)
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// driverEvents emits what a change of addr's driver from prev to now looks
// like to a uevent listener. k.mu must be held.
func (k *Kernel) driverEvents(addr, prev, now string) {
	if prev == now {
		return
	}
	if prev != "" {
		k.emit(vfio.PCIEvent{Action: vfio.UeventUnbind, Address: addr})
	}
	if now != "" {
		k.emit(vfio.PCIEvent{Action: vfio.UeventBind, Address: addr, Driver: now})
	}
}
