//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/vfio"
)

// Readiness under a real kernel: an edu stands in for a GPU whose IOMMU
// group holds the guest's own network card (virtio-net behind the same
// PCIe-to-PCI bridge), as on a board without ACS. gpuherd must call that
// GPU unusable, name the NIC, never touch it (the NIC keeps passing
// traffic after every step), refuse a claim that needs the GPU without a
// driver change anywhere, and offer the GPU, without a restart, once the
// operator unbinds the NIC by hand.

// The guest's address on QEMU's user network; the gateway answers pings.
const (
	guestAddr = "10.0.2.15/24"
	gateway   = "10.0.2.2"
)

// netIface is the network interface of the NIC, once virtio-net has it.
func netIface(m *machine) (string, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		names, _ := filepath.Glob("/sys/bus/pci/devices/" + m.nic.Address + "/virtio*/net/*")
		if len(names) > 0 {
			return filepath.Base(names[0]), nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no network interface under %s after 5s (is virtio_net loaded?)", m.nic.Address)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// netUp configures the NIC's interface (again, after it came back with its
// driver); it is the guest's own network, as the host's would be.
func netUp(c *checker, m *machine, step string) {
	if d, _ := kernelView(m.nic.Address); d != "virtio-pci" {
		return
	}
	ifc, err := netIface(m)
	if !c.noErr(err, "%s: the NIC's interface", step) {
		return
	}
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"link", "set", ifc, "up"}, {"addr", "replace", guestAddr, "dev", ifc}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			c.check(false, "%s: ip %s: %v %s", step, strings.Join(args, " "), err, bytes.TrimSpace(out))
			return
		}
	}
	c.check(true, "%s: the guest's NIC %s is up as %s with %s", step, m.nic.Address, ifc, guestAddr)
}

// nicTraffic checks that the NIC still passes traffic, unless it was
// deliberately taken off its driver.
func (c *checker) nicTraffic(step string, m *machine) {
	if d, _ := kernelView(m.nic.Address); d != "virtio-pci" {
		return
	}
	out, err := exec.Command("ping", "-c", "1", "-W", "5", gateway).CombinedOutput()
	if err != nil {
		err = fmt.Errorf("%v: %s", err, bytes.TrimSpace(out))
	}
	c.noErr(err, "%s: the guest's NIC passes traffic (ping %s)", step, gateway)
}

// readinessVFIO: the vfio package's verdict on the edu sharing the NIC's
// group names the NIC, and Bind refuses without a write.
func readinessVFIO(c *checker, m *machine, b *vfio.Binder) {
	step := "readiness"
	al, _ := vfio.ParseAllowList(allowed)
	pci := sysPCI()
	host := pci.ReadHostFacts()
	c.check(host.IOMMUGroups && host.VFIOPCILoaded && host.InterruptRemapping == vfio.RemapOn,
		"%s: host facts from sysfs: IOMMU groups, vfio-pci loaded, interrupt remapping on (intel-iommu,intremap=on): %+v", step, host)
	v, err := pci.Readiness(m.eduN.Address, vfio.ReadinessConfig{Allow: al}, &host)
	if c.noErr(err, "%s: Readiness of %s", step, m.eduN.name) {
		named := len(v.Blocking) == 1 && v.Blocking[0].Code == vfio.ProblemGroupNotViable && v.Blocking[0].Device != nil &&
			v.Blocking[0].Device.PCIAddress == m.nic.Address && v.Blocking[0].Device.Driver == "virtio-pci"
		c.check(named, "%s: %s not ready, blocked by the NIC %s on virtio-pci: %s", step, m.eduN.name, m.nic.Address, v.Reason())
	}
	v, err = pci.Readiness(m.eduA.Address, vfio.ReadinessConfig{Allow: al}, &host)
	c.check(err == nil && v.Ready(), "%s: %s alone in its group is ready (warnings: %v): %v", step, m.eduA.name, v.Warnings, err)
	res, err := b.Bind(context.Background(), m.eduN.Address)
	c.check(errors.Is(err, vfio.ErrGroupNotViable) && len(res.Changes) == 0, "%s: Bind of %s refused with no change: %v", step, m.eduN.name, err)
	c.expectDriver(step, m.nic, "virtio-pci")
	c.expectDriver(step, m.eduN, "")
	c.nicTraffic(step, m)
}

// readinessAtStart: before any claim, status shows the edu sharing the
// NIC's group unusable with the NIC named, and a claim that needs it is
// refused with no driver change anywhere.
func readinessAtStart(c *checker, m *machine, st api.Status, last map[*dev]string) {
	step := "agent started"
	g, _ := gpuByAddr(st, m.eduN.Address)
	ok := g.State == api.StateUnusable && g.Readiness != nil && len(g.Readiness.Blocking) == 1
	var bd *api.PCIDevice
	if ok {
		bd = g.Readiness.Blocking[0].BlockingDevice
	}
	c.check(ok && bd != nil && bd.PCIAddress == m.nic.Address && bd.Vendor+":"+bd.Device == idNIC && bd.Driver == "virtio-pci" && bd.Class == "020000",
		"%s: status: %s %s is unusable, blocked by the NIC %s [%s] on virtio-pci: state %q, readiness %+v", step, m.eduN.name, m.eduN.Address, m.nic.Address, idNIC, g.State, g.Readiness)
	g, _ = gpuByAddr(st, m.eduB.Address)
	c.check(g.State == api.StateUnusable, "%s: status: %s (with the balloon) is unusable too: %q", step, m.eduB.name, g.State)
	out, _, _ := cli("status")
	c.check(bytes.Contains(out, []byte(m.eduN.Address+" unusable: ")) && bytes.Contains(out, []byte(m.nic.Address)) && bytes.Contains(out, []byte("fix: ")),
		"%s: the status table says why and what to do:\n%s", step, out)

	// Two edus: only one can be passed through, so this claim needs the
	// one sharing the NIC's group (or the balloon's): refused, nothing moves.
	out, code, err := cli("claim", "vm-n", "--gpu", idEdu+":2")
	c.check(code == 3, "claim vm-n --gpu %s:2: not available, exit 3 (got %d: %v %s)", idEdu, code, err, bytes.TrimSpace(out))
	c.expectKernel("vm-n refused", m, nil, last)
}

// readinessFollows: the operator unbinds the NIC by hand; the agent, not
// restarted, offers the edu within seconds, without touching the NIC. The
// NIC is bound again: the edu is unusable again and the NIC passes traffic.
func readinessFollows(c *checker, m *machine, a *runningAgent, last map[*dev]string) {
	step := "NIC unbound by hand"
	pid := a.cmd.Process.Pid
	t0 := time.Now()
	if !c.noErr(writeSys("bus/pci/devices/"+m.nic.Address+"/driver/unbind", m.nic.Address), "%s: echo %s > .../driver/unbind", step, m.nic.Address) {
		return
	}
	unbound := time.Now() // the write returns once virtio-net's remove is done
	polled, ok := waitState(m.eduN.Address, api.StateFree, 20*time.Second)
	c.check(ok, "%s: %s free without a restart, seen by status %s after the unbind returned (%s after it was written; each status is a CLI run)",
		step, m.eduN.name, polled.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	if seen, ok := logDelay(a.log, "PCI change: re-reading IOMMU groups", t0); ok {
		fmt.Fprintf(c.w, "      (the agent read the uevent %s after the unbind was written, %s after it returned)\n",
			seen.Round(time.Millisecond), (seen - unbound.Sub(t0)).Round(time.Millisecond))
	}
	if logged, ok := logDelay(a.log, "GPU can be passed through again; offered", t0); ok {
		fmt.Fprintf(c.w, "      (the agent logged the GPU offered %s after the unbind was written, %s after it returned)\n",
			logged.Round(time.Millisecond), (logged - unbound.Sub(t0)).Round(time.Millisecond))
	}
	c.check(syscall.Kill(pid, 0) == nil, "%s: the same agent process (pid %d) still runs", step, pid)
	c.expectKernel(step, m, map[*dev]string{m.nic: ""}, last)

	step = "NIC bound again"
	if !c.noErr(writeSys("bus/pci/drivers/virtio-pci/bind", m.nic.Address), "%s: echo %s > /sys/bus/pci/drivers/virtio-pci/bind", step, m.nic.Address) {
		return
	}
	_, ok = waitState(m.eduN.Address, api.StateUnusable, 20*time.Second)
	c.check(ok, "%s: %s unusable again", step, m.eduN.name)
	c.expectKernel(step, m, nil, last)
}

// waitState polls status until the GPU at addr is in state.
func waitState(addr, state string, limit time.Duration) (time.Duration, bool) {
	t0 := time.Now()
	for time.Since(t0) < limit {
		var st api.Status
		if cliJSON(&st, "status") == nil {
			if g, ok := gpuByAddr(st, addr); ok && g.State == state {
				return time.Since(t0), true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(t0), false
}

// logDelay finds the first log line with msg written after t0 and returns
// how long after t0 the agent wrote it (slog's text time= field).
func logDelay(path, msg string, t0 time.Time) (time.Duration, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, msg) || !strings.HasPrefix(line, "time=") {
			continue
		}
		ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err == nil && t.After(t0) {
			return t.Sub(t0), true
		}
	}
	return 0, false
}
