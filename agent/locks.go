package agent

import (
	"slices"
	"sync"
)

// deviceLocks serialises driver changes per GPU: a release returning a GPU to
// its idle driver and a new claim binding it must not interleave their sysfs
// writes. Claims on different GPUs proceed in parallel.
type deviceLocks struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

func (d *deviceLocks) get(addr string) *sync.Mutex {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.locks == nil {
		d.locks = make(map[string]*sync.Mutex)
	}
	m, ok := d.locks[addr]
	if !ok {
		m = new(sync.Mutex)
		d.locks[addr] = m
	}
	return m
}

// lock takes the locks of addrs in address order (so two callers never
// deadlock) and returns the function that releases them.
func (d *deviceLocks) lock(addrs ...string) (unlock func()) {
	sorted := slices.Clone(addrs)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	held := make([]*sync.Mutex, 0, len(sorted))
	for _, a := range sorted {
		m := d.get(a)
		m.Lock()
		held = append(held, m)
	}
	return func() {
		for i := len(held) - 1; i >= 0; i-- {
			held[i].Unlock()
		}
	}
}
