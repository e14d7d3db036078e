//go:build linux

package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/vfio"
)

// consumerEnv, when set ("GROUP ADDR"), makes the test binary a VFIO
// consumer instead of the test: it opens the group and the device as a VMM
// does, says "ready", and holds them until its stdin closes. Its command
// line carries QEMU's `-name guest=NAME`, so the agent can name the domain.
const consumerEnv = "GPUHERD_VFIO_CONSUMER"

// consumerMain is the consumer process; it never returns.
func consumerMain(spec string) {
	f := strings.Fields(spec)
	group, err := strconv.Atoi(f[0])
	if err != nil || len(f) != 2 {
		fmt.Println("consumer: bad spec", spec)
		os.Exit(2)
	}
	if err := holdThroughVFIO(group, f[1]); err != nil {
		fmt.Println("consumer:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it
	os.Exit(0)                           // the kernel closes the fds, as when QEMU exits
}

// holdThroughVFIO opens the container, the group (set on the container,
// type-1 IOMMU) and the device's fd, and leaves them open.
func holdThroughVFIO(group int, addr string) error {
	container, err := unix.Open("/dev/vfio/vfio", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev/vfio/vfio: %w", err)
	}
	gfd, err := unix.Open(vfioNode(group), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", vfioNode(group), err)
	}
	cfd := int32(container)
	if _, err := ioctlPtr(gfd, vfioGroupSetContainer, unsafe.Pointer(&cfd)); err != nil {
		return fmt.Errorf("VFIO_GROUP_SET_CONTAINER: %w", err)
	}
	if _, err := ioctl(container, vfioSetIOMMU, vfioType1v2); err != nil {
		if _, err := ioctl(container, vfioSetIOMMU, vfioType1IOMMU); err != nil {
			return fmt.Errorf("VFIO_SET_IOMMU: %w", err)
		}
	}
	name, err := unix.BytePtrFromString(addr)
	if err != nil {
		return err
	}
	if _, err := ioctlPtr(gfd, vfioGroupGetDeviceFD, unsafe.Pointer(name)); err != nil {
		return fmt.Errorf("VFIO_GROUP_GET_DEVICE_FD(%s): %w", addr, err)
	}
	return nil
}

// consumer is a running consumer process.
type consumer struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan error
}

// startConsumer runs the consumer of d's group as domain and waits until
// it holds the group.
func startConsumer(d *dev, domain string) (*consumer, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-name", "guest="+domain+",debug-threads=on")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d %s", consumerEnv, d.IOMMUGroup, d.Address))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &consumer{cmd: cmd, stdin: stdin, done: make(chan error, 1)}
	line, err := bufio.NewReader(out).ReadString('\n')
	go func() { c.done <- cmd.Wait() }()
	if strings.TrimSpace(line) != "ready" {
		c.stop()
		return nil, fmt.Errorf("consumer: %q %v", strings.TrimSpace(line), err)
	}
	return c, nil
}

// stop ends the consumer (its stdin closes) and waits for it to exit.
func (c *consumer) stop() error {
	c.stdin.Close()
	select {
	case err := <-c.done:
		return err
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		return fmt.Errorf("consumer pid %d did not exit", c.cmd.Process.Pid)
	}
}

// partInUse: a claimed device opened by a real VFIO consumer is shown in
// use, its release is refused, a forced release leaves it on vfio-pci, and
// it returns to its host driver only once the consumer has exited.
func partInUse(c *checker, m *machine) {
	last := map[*dev]string{}
	for _, d := range m.all {
		last[d], _ = kernelView(d.Address)
	}
	a, err := startAgent(c, 3)
	if !c.noErr(err, "start the agent again (idle driver nvidia)") {
		return
	}
	defer func() {
		if a != nil {
			a.kill()
		}
	}()
	var cl api.Claim
	if !c.noErr(cliJSON(&cl, "claim", "vm-u", "--gpu", idRNG+":1"), "claim vm-u --gpu %s:1", idRNG) {
		return
	}
	c.expectKernel("vm-u claimed", m, map[*dev]string{m.rng: vfio.DriverVFIO}, last)

	vm, err := startConsumer(m.rng, "vm-u")
	if !c.noErr(err, "a VFIO consumer (container, group, type-1 IOMMU, device fd) holds group %d open as domain vm-u", m.rng.IOMMUGroup) {
		return
	}
	pid := vm.cmd.Process.Pid
	c.opens++
	defer func() { _ = vm.stop() }()

	inUse := func(step string, state string) {
		var st api.Status
		if !c.noErr(cliJSON(&st, "status"), "%s: status", step) {
			return
		}
		g, _ := gpuByAddr(st, m.rng.Address)
		u := g.InUseBy
		c.check(u != nil && u.PID == pid && u.Domain == "vm-u" && g.State == state,
			"%s: status shows %s %s, in use by %+v; want %s, pid %d, domain vm-u", step, m.rng.Address, g.State, u, state, pid)
	}
	inUse("consumer running", api.StateClaimed)

	out, code, err := cli("release", "vm-u")
	c.check(code == 6 && err != nil && strings.Contains(err.Error(), fmt.Sprintf("in use by pid %d", pid)) && strings.Contains(err.Error(), "domain vm-u"),
		"release vm-u while the consumer runs: refused, exit 6 naming pid and domain (exit %d: %v %s)", code, err, strings.TrimSpace(string(out)))
	c.expectKernel("release refused", m, map[*dev]string{m.rng: vfio.DriverVFIO}, last)

	_, _, err = cli("release", "vm-u", "--force")
	c.noErr(err, "release vm-u --force while the consumer runs")
	inUse("forced release", api.StateReturning)
	time.Sleep(2 * time.Second) // two of the agent's checks of returning GPUs
	c.expectKernel("forced release, consumer still running", m, map[*dev]string{m.rng: vfio.DriverVFIO}, last)

	c.noErr(vm.stop(), "the consumer exits")
	deadline := time.Now().Add(15 * time.Second)
	for {
		if d, _ := kernelView(m.rng.Address); d == m.rng.hostDriver || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.expectKernel("consumer exited: back on the host driver", m, nil, last)
	var st api.Status
	if c.noErr(cliJSON(&st, "status"), "status after the consumer exited") {
		g, _ := gpuByAddr(st, m.rng.Address)
		c.check(g.State == api.StateFree && g.InUseBy == nil, "status: %s %s, in use by %+v", m.rng.name, g.State, g.InUseBy)
	}
	b, _ := os.ReadFile(a.log)
	c.check(strings.Contains(string(b), "GPU returned: its VFIO group was closed"), "the agent logged the return")

	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-a.done:
		c.noErr(err, "the agent exits cleanly on SIGTERM")
	case <-time.After(15 * time.Second):
		c.check(false, "the agent did not exit within 15s of SIGTERM")
		a.kill()
	}
	a = nil
	if c.failed > 0 {
		(&runningAgent{log: "/tmp/agent-3.log"}).dumpLog(c)
	}
}
