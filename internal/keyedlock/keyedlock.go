// Package keyedlock is one lock per key, held only while used.
package keyedlock

import (
	"slices"
	"sync"
)

// Set is one mutex per key, held only while someone uses it. As
// device locks it serialises driver changes per GPU: a release returning a
// GPU to its idle driver and a new claim binding it must not interleave
// their sysfs writes, while claims on different GPUs proceed in parallel.
// Keyed by claim ID, it serialises requests for one claim through one
// coordinator. Entries go away when unused, so a stream of claim IDs does
// not grow the map.
type Set struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

// keyedLock is a lock made of a channel of one slot, not a sync.Mutex: a
// caller waiting for it is blocked on a channel, which testing/synctest
// counts as durably blocked, so the deterministic simulation can run the
// roles that take these locks.
type keyedLock struct {
	slot  chan struct{}
	users int // holders and waiters; the entry is dropped at zero
}

func (d *Set) acquire(key string) *keyedLock {
	d.mu.Lock()
	if d.locks == nil {
		d.locks = make(map[string]*keyedLock)
	}
	l, ok := d.locks[key]
	if !ok {
		l = &keyedLock{slot: make(chan struct{}, 1)}
		d.locks[key] = l
	}
	l.users++
	d.mu.Unlock()
	l.slot <- struct{}{}
	return l
}

func (d *Set) release(key string, l *keyedLock) {
	<-l.slot
	d.mu.Lock()
	if l.users--; l.users == 0 {
		delete(d.locks, key)
	}
	d.mu.Unlock()
}

// Lock takes the locks of keys in order (so two callers never deadlock)
// and returns the function that releases them.
func (d *Set) Lock(keys ...string) (unlock func()) {
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	held := make([]*keyedLock, len(sorted))
	for i, k := range sorted {
		held[i] = d.acquire(k)
	}
	return func() {
		for i := len(held) - 1; i >= 0; i-- {
			d.release(sorted[i], held[i])
		}
	}
}

// Users is how many callers hold or wait for key's lock: 0 when nobody
// uses it. Tests await a waiter with it.
func (d *Set) Users(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if l, ok := d.locks[key]; ok {
		return l.users
	}
	return 0
}
