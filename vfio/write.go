package vfio

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"
)

// pendingWrite is one sysfs write in flight. Its goroutine owns the write(2)
// and outlives the caller when the kernel does not return in time.
type pendingWrite struct {
	addr     string
	op       string
	since    time.Time
	finished chan struct{} // closed by the write goroutine as its last act
	// Guarded by Binder.mu until finished is closed, read-only after.
	returned bool
	err      error
}

// write does one sysfs write on behalf of the device at addr, with the
// Binder's deadline.
//
// A write(2) to sysfs cannot be interrupted: unbinding a card from nvidia
// blocks in the driver's remove callback for as long as anything holds the
// card, possibly forever. So the write runs in its own goroutine, and when
// the deadline (or ctx) ends the wait first, that goroutine is deliberately
// leaked: it finishes whenever the kernel returns. Until then the device is
// stuck: no further write for it is issued (a second one would only queue on
// the kernel's device lock, one more goroutine that cannot be ended), and
// Stuck lists it. When the leaked write returns, the device is forgotten
// and the next Bind or Release starts again from what sysfs then says.
func (b *Binder) write(ctx context.Context, addr, name, data string) error {
	op := fmt.Sprintf("write %q to %s", data, name)
	if err := b.stuckError(addr); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return &DeviceError{Address: addr, Op: op, Err: err}
	}
	p := &pendingWrite{addr: addr, op: op, since: time.Now(), finished: make(chan struct{})}
	go b.runWrite(p, name, data)

	timer := time.NewTimer(b.timeout)
	defer timer.Stop()
	var cause error
	select {
	case <-p.finished:
		return b.writeResult(p)
	case <-timer.C:
	case <-ctx.Done():
		cause = ctx.Err()
	}

	b.mu.Lock()
	if p.returned { // it returned while we were giving up on it
		b.mu.Unlock()
		return b.writeResult(p)
	}
	b.stuck[addr] = p
	b.mu.Unlock()
	b.log.Error("sysfs write did not return; device marked stuck",
		"pci_address", addr, "op", op, "timeout", b.timeout, "cause", cause)
	se := &StuckError{Address: addr, Op: op, Since: p.since, Err: cause}
	if cause == nil {
		se.Timeout = b.timeout
	}
	return se
}

// runWrite is the body of a write goroutine.
func (b *Binder) runWrite(p *pendingWrite, name, data string) {
	err := b.fs.WriteFile(name, []byte(data))
	b.mu.Lock()
	p.returned, p.err = true, err
	late := b.stuck[p.addr] == p
	if late {
		delete(b.stuck, p.addr)
	}
	// Closed under the lock so that once a device leaves the stuck set,
	// WaitUnstuck never sees it without its write having finished.
	close(p.finished)
	b.mu.Unlock()
	if late {
		b.log.Warn("stuck sysfs write returned; device may be written again",
			"pci_address", p.addr, "op", p.op, "after", time.Since(p.since), "err", err)
	}
}

func (b *Binder) writeResult(p *pendingWrite) error {
	if p.err != nil {
		return &DeviceError{Address: p.addr, Op: p.op, Err: p.err}
	}
	return nil
}

// stuckError returns a refusal when a write for addr is still pending.
func (b *Binder) stuckError(addr string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p, ok := b.stuck[addr]; ok {
		return &StuckError{Address: addr, Op: p.op, Since: p.since, Refused: true}
	}
	return nil
}

// Stuck returns the addresses of devices with a sysfs write that missed its
// deadline and has not returned yet, sorted. gpuherd writes nothing to them
// and callers should report them unhealthy.
func (b *Binder) Stuck() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Sorted(maps.Keys(b.stuck))
}

// WaitUnstuck blocks until the pending write of a stuck device returns (at
// once if addr is not stuck) or ctx ends. It lets a caller, or a test, know
// that the leaked write goroutine has finished.
func (b *Binder) WaitUnstuck(ctx context.Context, addr string) error {
	b.mu.Lock()
	p := b.stuck[addr]
	b.mu.Unlock()
	if p == nil {
		return nil
	}
	select {
	case <-p.finished:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("vfio: %s: wait for stuck %s: %w", addr, p.op, ctx.Err())
	}
}
