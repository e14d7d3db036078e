package vfio

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// DefaultWriteTimeout is how long one sysfs write may take before the device
// is declared stuck. Unbinding a busy GPU legitimately takes a few seconds
// (the driver tears down its state); one that is held takes forever.
const DefaultWriteTimeout = 10 * time.Second

// Binder moves GPUs, a whole IOMMU group at a time, between their host
// drivers and vfio-pci. It is safe for concurrent use; calls on the same
// group are serialised.
type Binder struct {
	pci     *PCI
	fs      FS
	allowMu sync.RWMutex
	allow   AllowList // under allowMu: SetAllowList replaces it
	timeout time.Duration
	log     *slog.Logger

	mu     sync.Mutex
	stuck  map[string]*pendingWrite
	groups map[int]chan struct{} // one-slot semaphores, one per IOMMU group
}

// BinderOption configures a Binder.
type BinderOption func(*Binder)

// WithAllowList sets which vendor:device IDs the Binder may move between
// drivers (default DefaultAllowList: NVIDIA only). An empty list allows
// nothing.
func WithAllowList(l AllowList) BinderOption {
	return func(b *Binder) { b.allow = slices.Clone(l) }
}

// WithWriteTimeout sets the deadline of each sysfs write (default
// DefaultWriteTimeout). Values <= 0 keep the default.
func WithWriteTimeout(d time.Duration) BinderOption {
	return func(b *Binder) {
		if d > 0 {
			b.timeout = d
		}
	}
}

// WithBinderLogger sets the logger for every driver change and failure.
func WithBinderLogger(l *slog.Logger) BinderOption {
	return func(b *Binder) {
		if l != nil {
			b.log = l
		}
	}
}

// NewBinder returns a Binder that reads and writes through pci's FS.
func NewBinder(pci *PCI, opts ...BinderOption) *Binder {
	b := &Binder{
		pci:     pci,
		fs:      pci.fs,
		allow:   DefaultAllowList(),
		timeout: DefaultWriteTimeout,
		log:     slog.New(slog.DiscardHandler),
		stuck:   make(map[string]*pendingWrite),
		groups:  make(map[int]chan struct{}),
	}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Change is one device that ended a call on a different driver than it
// started on. "" means no driver.
type Change struct {
	Address string `json:"address"`
	From    string `json:"from"`
	To      string `json:"to"`
}

// Result is what a Bind or Release did to an IOMMU group.
type Result struct {
	Group      int      `json:"group"`
	VFIODevice string   `json:"vfio_device,omitempty"` // "/dev/vfio/12" when the group is on vfio-pci
	Changes    []Change `json:"changes,omitempty"`     // empty: nothing changed
}

// Bind moves the device at addr and every allow-listed endpoint of its IOMMU
// group to vfio-pci, and checks that /dev/vfio/<group> exists, so that the
// group can be given to a VM.
//
// Before any write it checks that the group will be viable: every member
// must be on vfio-pci or no driver once the allow-listed ones have moved, so
// a member that is not on the allow list and has a host driver makes Bind
// refuse with a *GroupError; bridges stay as they are when they are on no
// driver or pcieport. A device with no IOMMU group is refused with
// ErrNoIOMMUGroup. A group already on vfio-pci is left alone: no write.
// When a step fails, Bind tries to put back every device it changed and
// returns both errors; Result.Changes says where devices ended.
func (b *Binder) Bind(ctx context.Context, addr string) (Result, error) {
	return b.apply(ctx, "bind", addr, IdleVFIO)
}

// Release returns the allow-listed endpoints of the IOMMU group of addr to
// the idle policy: IdleVFIO binds them to vfio-pci as Bind does; IdleNVIDIA
// unbinds them from vfio-pci, clears driver_override and reprobes so their
// host drivers (nvidia, snd_hda_intel, ...) take them; IdleNone unbinds them
// from whatever driver they are on and clears driver_override.
// IdleNVIDIA only touches devices on vfio-pci or with an override set: a
// device already on a host driver, or on none with nothing overriding, is
// where a reprobe would leave it anyway. A host driver that is not loaded
// leaves its device on no driver; that is logged, not an error.
func (b *Binder) Release(ctx context.Context, addr string, policy IdlePolicy) (Result, error) {
	if _, err := ParseIdlePolicy(string(policy)); err != nil {
		return Result{}, err
	}
	// Named after what it does, not why: at start, nothing was claimed.
	return b.apply(ctx, "move to idle driver "+string(policy), addr, policy)
}

// target is the state a move leaves a device in.
type target struct {
	override string // driver_override at the end; "" cleared
	driver   string // driver at the end; "" none
	anyHost  bool   // any driver but vfio-pci, or none (whatever the probe picks)
}

var (
	toVFIO = target{override: DriverVFIO, driver: DriverVFIO}
	toHost = target{anyHost: true}
	toNone = target{}
)

// restoreTo is the state d was in, for rollback.
func restoreTo(d Device) target { return target{override: d.DriverOverride, driver: d.Driver} }

func (t target) satisfiedBy(driver string) bool {
	if t.anyHost {
		return driver != DriverVFIO
	}
	return driver == t.driver
}

func (t target) String() string {
	switch {
	case t.anyHost:
		return "host driver"
	case t.driver == "":
		return "no driver"
	}
	return t.driver
}

func policyTarget(p IdlePolicy) target {
	switch p {
	case IdleNVIDIA:
		return toHost
	case IdleNone:
		return toNone
	}
	return toVFIO
}

// Driver names that may stay on a group given to a VM: the kernel lets
// pci-stub and pcieport devices share a group with vfio (both opt out of
// the DMA ownership check), and a bridge can never be moved to vfio-pci,
// whose probe refuses anything but a normal header.
const (
	DriverPCIStub  = "pci-stub"
	DriverPCIePort = "pcieport"
)

func isBridge(d Device) bool { return d.Class>>8 == ClassBridge>>8 }

// Check reports, without writing anything, whether Bind would accept the
// device at addr: nil when its IOMMU group can be given to a VM, otherwise
// the reason (a *GroupError for a foreign device with a host driver,
// ErrNoIOMMUGroup, ErrNotAllowed, a stuck device). `gpuherd inventory`
// shows it to operators before the agent ever runs.
func (b *Binder) Check(addr string) error {
	d, err := b.target("check", addr)
	if err != nil {
		return err
	}
	members, err := b.members("check", addr, d.IOMMUGroup)
	if err != nil {
		return err
	}
	if _, err := b.plan(d, members, toVFIO); err != nil {
		return fmt.Errorf("vfio: check %s: %w", addr, err)
	}
	return nil
}

// target reads the device a Bind, Release or Check is about and refuses one
// gpuherd must not touch or cannot pass through. It reads only what its
// group's lock is found by (PCI.identity): the Device holds its address,
// IDs and group; the rest is read with the members, under the lock.
func (b *Binder) target(op, addr string) (Device, error) {
	if err := ValidateAddress(addr); err != nil {
		return Device{}, err
	}
	d, err := b.pci.identity(addr)
	if err != nil {
		return Device{}, fmt.Errorf("vfio: %s %s: %w", op, addr, err)
	}
	if allow := b.allowList(); !allow.Allows(d.Vendor, d.Device) {
		return Device{}, fmt.Errorf("vfio: %s %s [%04x:%04x]: %w (%s); add its ID to the allow list if gpuherd should manage it",
			op, addr, d.Vendor, d.Device, ErrNotAllowed, allow)
	}
	if d.IOMMUGroup < 0 {
		return Device{}, fmt.Errorf("vfio: %s %s: %w; enable the IOMMU (VT-d or AMD-Vi in firmware, intel_iommu=on or amd_iommu=on on the kernel command line)",
			op, addr, ErrNoIOMMUGroup)
	}
	return d, nil
}

// members reads the IOMMU group of addr, which must list addr.
func (b *Binder) members(op, addr string, group int) ([]Device, error) {
	members, err := b.pci.GroupMembers(group)
	if err != nil {
		return nil, fmt.Errorf("vfio: %s %s: %w", op, addr, err)
	}
	if !slices.ContainsFunc(members, func(m Device) bool { return m.Address == addr }) {
		return nil, fmt.Errorf("vfio: %s %s: not listed in IOMMU group %d: %w (groups changed during the read, retry)",
			op, addr, group, ErrMalformed)
	}
	return members, nil
}

// apply is Bind and Release: plan every member of the group, refuse before
// any write if the plan is unsafe, then move the members one by one.
func (b *Binder) apply(ctx context.Context, op, addr string, policy IdlePolicy) (Result, error) {
	d, err := b.target(op, addr)
	if err != nil {
		return Result{}, err
	}
	group := d.IOMMUGroup
	unlock, err := b.lockGroup(ctx, group)
	if err != nil {
		return Result{}, fmt.Errorf("vfio: %s %s: wait for IOMMU group %d: %w", op, addr, group, err)
	}
	defer unlock()

	members, err := b.members(op, addr, group)
	if err != nil {
		return Result{}, err
	}
	want := policyTarget(policy)
	plan, err := b.plan(d, members, want)
	if err != nil {
		return Result{}, fmt.Errorf("vfio: %s %s: %w", op, addr, err)
	}
	res := Result{Group: group}
	if want == toVFIO {
		res.VFIODevice = vfioGroupDevice(group)
	}
	if len(plan) == 0 {
		if want == toVFIO && !b.fs.Exists(res.VFIODevice) {
			return res, fmt.Errorf("vfio: %s %s: IOMMU group %d is on vfio-pci but %s is missing: %w (is /dev mounted into the agent's namespace? PrivateDevices=yes hides it)",
				op, addr, group, res.VFIODevice, ErrBindFailed)
		}
		return res, nil
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("vfio: %s %s: %w", op, addr, err)
	}

	var touched []Device
	err = nil
	for _, m := range plan {
		touched = append(touched, m)
		if err = b.move(ctx, m, want); err != nil {
			break
		}
	}
	if err == nil && want == toVFIO && !b.fs.Exists(res.VFIODevice) {
		err = fmt.Errorf("IOMMU group %d is on vfio-pci but %s is missing: %w (is /dev mounted into the agent's namespace? PrivateDevices=yes hides it)",
			group, res.VFIODevice, ErrBindFailed)
	}
	if err != nil {
		rbErr := b.rollback(ctx, touched)
		res.Changes = b.changes(touched)
		if rbErr != nil {
			return res, fmt.Errorf("vfio: %s %s (IOMMU group %d): %w; rollback incomplete, check the devices by hand: %w", op, addr, group, err, rbErr)
		}
		return res, fmt.Errorf("vfio: %s %s (IOMMU group %d): %w; changes rolled back", op, addr, group, err)
	}
	res.Changes = b.changes(touched)
	for _, c := range res.Changes {
		b.log.Debug("PCI device changed driver", "op", op, "pci_address", c.Address, "iommu_group", group, "from", c.From, "to", c.To)
	}
	return res, nil
}

// plan returns the members of gpu's group to move to want, or the reason
// the group must not be touched at all. It reads only. A group that goes to
// vfio-pci must be viable by the same rule Assess reports (memberBlocks).
func (b *Binder) plan(gpu Device, members []Device, want target) ([]Device, error) {
	var plan []Device
	allow := b.allowList()
	for _, m := range members {
		switch {
		case isBridge(m) || !allow.Allows(m.Vendor, m.Device):
			// Never moved: vfio-pci refuses bridges, unbinding pcieport
			// takes hotplug and AER away from the slot, and a device off
			// the allow list is not gpuherd's to touch.
			if want == toVFIO {
				if p := memberBlocks(gpu.IOMMUGroup, gpu, m, allow); p != nil {
					return nil, b.groupError(gpu.IOMMUGroup, m, p.what+"; "+p.fix)
				}
			}
		case needsMove(m, want):
			if err := b.stuckError(m.Address); err != nil {
				return nil, err
			}
			plan = append(plan, m)
		}
	}
	return plan, nil
}

func (b *Binder) groupError(group int, m Device, reason string) error {
	return &GroupError{Group: group, Address: m.Address, Vendor: m.Vendor, Device: m.Device, Class: m.Class, Driver: m.Driver, Reason: reason}
}

// needsMove reports whether an allow-listed endpoint is not yet where want
// puts it.
func needsMove(m Device, want target) bool {
	switch want {
	case toVFIO:
		// Bound to vfio-pci is enough even without the override: rewriting
		// a working binding only risks it.
		return m.Driver != DriverVFIO
	case toHost:
		return m.Driver == DriverVFIO || m.DriverOverride != ""
	}
	return m.Driver != "" || m.DriverOverride != ""
}

// move takes one device from its state in d to t: set driver_override to
// where it is going (first, so that anything probing it between our writes
// lands it there too), unbind the driver it is leaving, probe, verify.
func (b *Binder) move(ctx context.Context, d Device, t target) error {
	addr := d.Address
	if d.DriverOverride != t.override {
		v := t.override
		if v == "" {
			v = "\n" // what `echo > driver_override` writes; the kernel clears on it
		}
		if err := b.write(ctx, addr, devicePath(addr, "driver_override"), v); err != nil {
			return err
		}
	}
	cur := d.Driver
	if cur != "" && !t.satisfiedBy(cur) {
		// Through the device's own driver link: whatever driver holds it
		// now is the one to leave, even if it changed since we read it.
		if err := b.write(ctx, addr, devicePath(addr, "driver/unbind"), addr); err != nil {
			return err
		}
		cur = ""
	}
	if cur == "" && (t.anyHost || t.driver != "") {
		if err := b.write(ctx, addr, driversProbe, addr); err != nil {
			return err
		}
		got, err := b.pci.driver(addr)
		if err != nil {
			return &DeviceError{Address: addr, Op: "read driver link after probe", Err: err}
		}
		if got == "" && t.driver != "" {
			// The probe found no taker, e.g. a udev rule or an older kernel
			// without override-aware probing: ask the driver directly.
			if err := ValidateDriverName(t.driver); err != nil {
				return &DeviceError{Address: addr, Op: "bind", Err: err}
			}
			if err := b.write(ctx, addr, pciDriversDir+"/"+t.driver+"/bind", addr); err != nil {
				return err
			}
		}
	}
	got, err := b.pci.driver(addr)
	if err != nil {
		return &DeviceError{Address: addr, Op: "read driver link", Err: err}
	}
	if !t.satisfiedBy(got) {
		return &DeviceError{Address: addr, Op: "verify driver",
			Err: fmt.Errorf("%w: on %s, want %s", ErrBindFailed, driverOrNone(got), t)}
	}
	if t.anyHost && got == "" {
		b.log.Warn("no host driver took the device; it stays on no driver (is its driver loaded?)", "pci_address", addr)
	}
	return nil
}

func driverOrNone(d string) string {
	if d == "" {
		return "no driver"
	}
	return d
}

// rollback puts the touched devices back as they were, newest first, and
// returns what it could not undo. It runs even when ctx has ended (that may
// be why the call failed); each write still has its own deadline.
func (b *Binder) rollback(ctx context.Context, touched []Device) error {
	ctx = context.WithoutCancel(ctx)
	var errs []error
	for _, orig := range slices.Backward(touched) {
		if b.stuckError(orig.Address) != nil {
			errs = append(errs, fmt.Errorf("%s left as it is: a write to it is still pending", orig.Address))
			continue
		}
		now, err := b.pci.Device(orig.Address)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if now.Driver == orig.Driver && now.DriverOverride == orig.DriverOverride {
			continue
		}
		if err := b.move(ctx, now, restoreTo(orig)); err != nil {
			b.log.Error("rollback failed", "pci_address", orig.Address, "want_driver", orig.Driver, "err", err)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// changes re-reads where each touched device ended.
func (b *Binder) changes(touched []Device) []Change {
	var cs []Change
	for _, d := range touched {
		now, err := b.pci.driver(d.Address)
		if err != nil {
			now = "unknown"
		}
		if now != d.Driver {
			cs = append(cs, Change{Address: d.Address, From: d.Driver, To: now})
		}
	}
	return cs
}

// lockGroup serialises Bind and Release on one IOMMU group.
func (b *Binder) lockGroup(ctx context.Context, group int) (func(), error) {
	b.mu.Lock()
	sem, ok := b.groups[group]
	if !ok {
		sem = make(chan struct{}, 1)
		b.groups[group] = sem
	}
	b.mu.Unlock()
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
