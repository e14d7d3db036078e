//go:build linux

// Command realkernel proves gpuherd's vfio binding on a real Linux kernel.
// run.sh (make test-kernel) boots a Debian kernel under QEMU with an
// emulated IOMMU and emulated PCI devices standing in for GPUs, and runs
// this package's test binary inside; it must never run on a real host, and
// refuses to unless GPUHERD_REAL_KERNEL=1 says it is in that guest.
//
// Part one drives the vfio package straight against /sys: bind, unbind,
// the refused group, /dev/vfio/N, and opening each group through VFIO as a
// VMM would. Part two runs the gpuherd agent binary and drives it through
// its CLI: claim, kill -9, restart and reconcile, release, checking the
// kernel's driver links after each step.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpuherd/gpuherd/vfio"
)

// The emulated devices (run.sh's QEMU command line).
const (
	idEdu     = "1234:11e8" // QEMU's edu: no host driver
	idTestdev = "1b36:0005" // pci-testdev: no host driver
	idRNG     = "1af4:1005" // virtio-rng (transitional): virtio-pci
	idBalloon = "1af4:1002" // virtio-balloon (transitional): virtio-pci, never allow-listed
	idNIC     = "1af4:1000" // virtio-net (transitional): virtio-pci, the guest's own network card
)

// allowed is the allow list of both parts: everything but the balloon.
var allowed = []string{idEdu, idTestdev, idRNG}

func main() {
	if os.Getenv("GPUHERD_REAL_KERNEL") != "1" {
		fmt.Fprintln(os.Stderr, "realkernel binds PCI devices through /sys: it runs only inside run.sh's QEMU guest (GPUHERD_REAL_KERNEL=1)")
		os.Exit(2)
	}
	if err := run(os.Stdout); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
}

// run runs both parts and prints the counts. It returns an error when any
// check failed.
func run(w io.Writer) error {
	start := time.Now()
	c := &checker{w: w}
	m, err := findMachine()
	if err != nil {
		return fmt.Errorf("REALKERNEL: FAIL: %w", err)
	}
	m.print(w)
	netUp(c, m, "boot")
	c.section("part 1: the vfio package on real sysfs")
	partVFIO(c, m)
	c.section("part 2: the gpuherd agent")
	partAgent(c, m)
	c.section("part 3: a device in use by a VFIO consumer")
	partInUse(c, m)
	fmt.Fprintf(w, "\nREALKERNEL: counts: checks passed=%d failed=%d; kernel driver changes: bound to vfio-pci=%d, unbound from vfio-pci=%d; VFIO group opens=%d; agent starts=%d; took %s\n",
		c.passed, c.failed, c.bound, c.unbound, c.opens, c.starts, time.Since(start).Round(time.Millisecond))
	if c.failed > 0 {
		return fmt.Errorf("REALKERNEL: FAIL: %d of %d checks failed", c.failed, c.passed+c.failed)
	}
	fmt.Fprintf(w, "REALKERNEL: PASS (%d checks)\n", c.passed)
	return nil
}

// checker counts and prints checks; a failed check does not stop the run.
type checker struct {
	w              io.Writer
	passed, failed int
	bound, unbound int // transitions onto and off vfio-pci the kernel showed
	opens, starts  int
}

func (c *checker) section(s string) { fmt.Fprintf(c.w, "\n=== %s\n", s) }

func (c *checker) check(ok bool, format string, args ...any) bool {
	if ok {
		c.passed++
		fmt.Fprintf(c.w, "ok    %s\n", fmt.Sprintf(format, args...))
	} else {
		c.failed++
		fmt.Fprintf(c.w, "FAIL  %s\n", fmt.Sprintf(format, args...))
	}
	return ok
}

func (c *checker) noErr(err error, format string, args ...any) bool {
	if err != nil {
		return c.check(false, "%s: %v", fmt.Sprintf(format, args...), err)
	}
	return c.check(true, format, args...)
}

// count records the changes of a Bind or Release.
func (c *checker) count(changes []vfio.Change) {
	for _, ch := range changes {
		if ch.To == vfio.DriverVFIO {
			c.bound++
		}
		if ch.From == vfio.DriverVFIO {
			c.unbound++
		}
	}
}

// dev is one emulated device of the guest.
type dev struct {
	name string
	vfio.Device
	hostDriver string // the driver it had at boot
}

type machine struct {
	eduA, testdev, rng *dev // each alone in its IOMMU group
	eduB, balloon      *dev // one group, behind a PCIe-to-PCI bridge
	eduN, nic          *dev // one group behind another bridge: the NIC is the guest's own
	all                []*dev
}

func (m *machine) print(w io.Writer) {
	fmt.Fprintln(w, "emulated devices:")
	for _, d := range m.all {
		fmt.Fprintf(w, "  %-16s %s [%04x:%04x] IOMMU group %d, driver %s\n", d.name, d.Address, d.Vendor, d.Device.Device, d.IOMMUGroup, orNone(d.Driver))
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func pciID(d vfio.Device) string { return fmt.Sprintf("%04x:%04x", d.Vendor, d.Device) }

func sysPCI() *vfio.PCI { return vfio.New(vfio.NewOSFS("/sys", "/dev")) }

// findMachine finds the emulated devices by ID and group.
func findMachine() (*machine, error) {
	pci := sysPCI()
	devs, err := pci.Devices()
	if err != nil {
		return nil, err
	}
	m := &machine{}
	var shared []*dev // edus that share their group: told apart by who they share it with
	for _, d := range devs {
		alone := false
		if d.IOMMUGroup >= 0 {
			members, err := pci.GroupMembers(d.IOMMUGroup)
			if err != nil {
				return nil, err
			}
			alone = len(members) == 1
		}
		nd := &dev{Device: d, hostDriver: d.Driver}
		switch id := pciID(d); {
		case id == idEdu && alone:
			nd.name, m.eduA = "edu", nd
		case id == idEdu:
			shared = append(shared, nd)
			continue
		case id == idTestdev:
			nd.name, m.testdev = "pci-testdev", nd
		case id == idRNG:
			nd.name, m.rng = "virtio-rng", nd
		case id == idBalloon:
			nd.name, m.balloon = "virtio-balloon", nd
		case id == idNIC:
			nd.name, m.nic = "virtio-net (NIC)", nd
		default:
			continue
		}
		m.all = append(m.all, nd)
	}
	for _, e := range shared {
		switch {
		case m.balloon != nil && e.IOMMUGroup == m.balloon.IOMMUGroup:
			e.name, m.eduB = "edu (shared)", e
		case m.nic != nil && e.IOMMUGroup == m.nic.IOMMUGroup:
			e.name, m.eduN = "edu (with NIC)", e
		default:
			continue
		}
		m.all = append(m.all, e)
	}
	for name, d := range map[string]*dev{"edu": m.eduA, "shared edu": m.eduB, "pci-testdev": m.testdev, "virtio-rng": m.rng, "virtio-balloon": m.balloon,
		"virtio-net": m.nic, "edu sharing the NIC's group": m.eduN} {
		if d == nil {
			return nil, fmt.Errorf("no %s device in the guest (is the IOMMU on? run.sh's QEMU command line)", name)
		}
	}
	if m.eduB.IOMMUGroup != m.balloon.IOMMUGroup {
		return nil, fmt.Errorf("the edu and balloon behind the bridge are in groups %d and %d, want one", m.eduB.IOMMUGroup, m.balloon.IOMMUGroup)
	}
	return m, nil
}

// kernelView reads what the kernel says about a device, not through the vfio
// package: the driver link and driver_override, straight from /sys.
func kernelView(addr string) (driver, override string) {
	if t, err := os.Readlink("/sys/bus/pci/devices/" + addr + "/driver"); err == nil {
		driver = filepath.Base(t)
	}
	if b, err := os.ReadFile("/sys/bus/pci/devices/" + addr + "/driver_override"); err == nil {
		override = strings.TrimSpace(string(b))
		if override == "(null)" {
			override = ""
		}
	}
	return driver, override
}

func vfioNode(group int) string { return fmt.Sprintf("/dev/vfio/%d", group) }

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// waitNode waits for /dev/vfio/N to be present (or gone): devtmpfs follows
// the driver core, but give it a moment.
func waitNode(group int, present bool) bool {
	deadline := time.Now().Add(3 * time.Second)
	for {
		if exists(vfioNode(group)) == present {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// expectDriver checks the kernel's driver link (and, for vfio-pci, the
// group's node) of d.
func (c *checker) expectDriver(step string, d *dev, want string) {
	got, ov := kernelView(d.Address)
	c.check(got == want, "%s: %s %s on %s (kernel), want %s; driver_override %q", step, d.name, d.Address, orNone(got), orNone(want), ov)
}

func (c *checker) expectNode(step string, d *dev, present bool) {
	what := "present"
	if !present {
		what = "gone"
	}
	c.check(waitNode(d.IOMMUGroup, present), "%s: %s %s", step, vfioNode(d.IOMMUGroup), what)
}

// vfioOpen opens d's group through VFIO as a VMM would.
func (c *checker) vfioOpen(step string, d *dev) {
	rep, err := openThroughVFIO(d.IOMMUGroup, d.Address)
	if !c.noErr(err, "%s: VFIO open of group %d (%s): container, viable group, type-1 IOMMU, device fd", step, d.IOMMUGroup, d.name) {
		return
	}
	c.opens++
	c.check(rep.APIVersion == vfioAPIVersion && rep.Viable && rep.Attached && rep.IOMMU != 0,
		"%s: VFIO API %d, group viable %v, container set %v, IOMMU type %d", step, rep.APIVersion, rep.Viable, rep.Attached, rep.IOMMU)
	c.check(rep.DevicePCI && rep.NumRegions >= vfioPCINumRegions && rep.NumIRQs > 0,
		"%s: device %s is a VFIO PCI device: %d regions, %d IRQ types", step, d.Address, rep.NumRegions, rep.NumIRQs)
}

// partVFIO binds and unbinds each device with the vfio package.
func partVFIO(c *checker, m *machine) {
	ctx := context.Background()
	al, err := vfio.ParseAllowList(allowed)
	if err != nil {
		c.noErr(err, "allow list")
		return
	}
	pci := sysPCI()
	b := vfio.NewBinder(pci, vfio.WithAllowList(al), vfio.WithWriteTimeout(10*time.Second))

	c.check(m.rng.hostDriver == "virtio-pci", "virtio-rng starts on its real host driver: %s", orNone(m.rng.hostDriver))
	for _, d := range []*dev{m.eduA, m.testdev, m.rng} {
		step := "bind " + d.name
		c.noErr(b.Check(d.Address), "%s: Check accepts group %d", step, d.IOMMUGroup)
		c.check(!exists(vfioNode(d.IOMMUGroup)), "%s: no %s before", step, vfioNode(d.IOMMUGroup))
		res, err := b.Bind(ctx, d.Address)
		c.count(res.Changes)
		if !c.noErr(err, "%s: Bind %s", step, d.Address) {
			continue
		}
		c.check(len(res.Changes) == 1 && res.Changes[0].From == d.hostDriver && res.Changes[0].To == vfio.DriverVFIO,
			"%s: one change, %s -> vfio-pci: %+v", step, orNone(d.hostDriver), res.Changes)
		c.expectDriver(step, d, vfio.DriverVFIO)
		_, ov := kernelView(d.Address)
		c.check(ov == vfio.DriverVFIO, "%s: driver_override %q", step, ov)
		c.expectNode(step, d, true)
		c.check(res.VFIODevice == vfioNode(d.IOMMUGroup), "%s: Result names %s", step, res.VFIODevice)

		res, err = b.Bind(ctx, d.Address)
		c.check(err == nil && len(res.Changes) == 0, "%s again: nothing to do (changes %v, err %v)", step, res.Changes, err)
		c.vfioOpen(step, d)

		step = "release " + d.name + " to its host driver"
		res, err = b.Release(ctx, d.Address, vfio.IdleNVIDIA)
		c.count(res.Changes)
		if c.noErr(err, "%s: Release", step) {
			c.expectDriver(step, d, d.hostDriver)
			_, ov := kernelView(d.Address)
			c.check(ov == "", "%s: driver_override cleared (%q)", step, ov)
			c.expectNode(step, d, false)
		}
	}

	// Idle policy none: unbound from vfio-pci, no driver, override cleared.
	d := m.testdev
	res, err := b.Bind(ctx, d.Address)
	c.count(res.Changes)
	c.noErr(err, "bind %s again", d.name)
	res, err = b.Release(ctx, d.Address, vfio.IdleNone)
	c.count(res.Changes)
	if c.noErr(err, "release %s with idle driver none", d.name) {
		c.expectDriver("idle none", d, "")
		c.expectNode("idle none", d, false)
	}
	// Idle policy vfio-pci: Release keeps it bound.
	res, err = b.Bind(ctx, d.Address)
	c.count(res.Changes)
	c.noErr(err, "bind %s for idle vfio-pci", d.name)
	res, err = b.Release(ctx, d.Address, vfio.IdleVFIO)
	c.check(err == nil && len(res.Changes) == 0, "release with idle driver vfio-pci leaves it bound (changes %v, err %v)", res.Changes, err)
	c.expectDriver("idle vfio-pci", d, vfio.DriverVFIO)
	res, err = b.Release(ctx, d.Address, vfio.IdleNVIDIA)
	c.count(res.Changes)
	c.noErr(err, "release %s back", d.name)
	c.expectDriver("back", d, "")

	refusedGroup(c, m, b)
	readinessVFIO(c, m, b)
}

// refusedGroup: edu and virtio-balloon share a group behind a PCIe-to-PCI
// bridge. The edu is allow-listed, the balloon is not and has a host driver:
// gpuherd must refuse the group without a single write, and the kernel's
// own view (VFIO_GROUP_GET_STATUS) must agree that the group is not viable.
func refusedGroup(c *checker, m *machine, b *vfio.Binder) {
	ctx := context.Background()
	e, bal := m.eduB, m.balloon
	step := "refused group"
	c.check(bal.hostDriver == "virtio-pci", "%s: virtio-balloon %s on %s in group %d with edu %s", step, bal.Address, orNone(bal.hostDriver), e.IOMMUGroup, e.Address)
	err := b.Check(e.Address)
	var ge *vfio.GroupError
	c.check(errors.Is(err, vfio.ErrGroupNotViable) && errors.As(err, &ge) && ge.Address == bal.Address,
		"%s: Check refuses, naming the balloon: %v", step, err)
	res, err := b.Bind(ctx, e.Address)
	c.check(errors.Is(err, vfio.ErrGroupNotViable) && len(res.Changes) == 0, "%s: Bind refuses with no change: %v", step, err)
	c.expectDriver(step, e, "")
	c.expectDriver(step, bal, "virtio-pci")
	_, ov := kernelView(e.Address)
	c.check(ov == "", "%s: edu's driver_override untouched (%q)", step, ov)
	c.check(!exists(vfioNode(e.IOMMUGroup)), "%s: no %s", step, vfioNode(e.IOMMUGroup))
	_, err = b.Bind(ctx, bal.Address)
	c.check(errors.Is(err, vfio.ErrNotAllowed), "%s: the balloon itself is not on the allow list: %v", step, err)

	// The kernel agrees: bind the edu by hand (what a careless tool would
	// do) and ask VFIO about the group.
	if !c.noErr(writeSys("bus/pci/devices/"+e.Address+"/driver_override", vfio.DriverVFIO), "%s: by hand: driver_override", step) {
		return
	}
	c.noErr(writeSys("bus/pci/drivers_probe", e.Address), "%s: by hand: drivers_probe", step)
	c.expectDriver(step+" by hand", e, vfio.DriverVFIO)
	c.bound++
	if c.check(waitNode(e.IOMMUGroup, true), "%s by hand: %s present", step, vfioNode(e.IOMMUGroup)) {
		flags, err := groupStatus(e.IOMMUGroup)
		c.check(err == nil && flags&vfioGroupFlagsViable == 0,
			"%s: the kernel says group %d is not viable (flags %#x, err %v): what gpuherd refused", step, e.IOMMUGroup, flags, err)
		_, err = openThroughVFIO(e.IOMMUGroup, e.Address)
		c.check(err != nil, "%s: a VMM could not use it: %v", step, err)
	}
	c.noErr(writeSys("bus/pci/devices/"+e.Address+"/driver/unbind", e.Address), "%s: by hand: unbind", step)
	c.noErr(writeSys("bus/pci/devices/"+e.Address+"/driver_override", "\n"), "%s: by hand: clear driver_override", step)
	c.unbound++
	c.expectDriver(step+" undone", e, "")
	c.expectDriver(step+" undone", bal, "virtio-pci")
	c.expectNode(step+" undone", e, false)
}

// writeSys writes one value to a sysfs file of the guest in one write(2).
func writeSys(rel, val string) error {
	f, err := os.OpenFile(filepath.Join("/sys", rel), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(val)
	cerr := f.Close()
	return errors.Join(werr, cerr)
}

// hostBack returns d to its host driver by hand (as an operator, or a
// crash in the middle of a release, would leave it).
func hostBack(d *dev) error {
	dir := "bus/pci/devices/" + d.Address
	if err := writeSys(dir+"/driver_override", "\n"); err != nil {
		return err
	}
	if err := writeSys(dir+"/driver/unbind", d.Address); err != nil {
		return err
	}
	return writeSys("bus/pci/drivers_probe", d.Address)
}
