//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/vfio"
)

const (
	agentData   = "/tmp/gpuherd"
	agentSocket = "/run/gpuherd.sock"
)

// gpuherdBin is the static agent binary run.sh puts in the guest.
func gpuherdBin() string {
	if b := os.Getenv("GPUHERD_BIN"); b != "" {
		return b
	}
	return "/bin/gpuherd"
}

// cli runs a gpuherd client command against the agent and returns its
// stdout and exit status.
func cli(args ...string) ([]byte, int, error) {
	cmd := exec.Command(gpuherdBin(), append([]string{"--socket", agentSocket}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.Bytes(), ee.ExitCode(), fmt.Errorf("gpuherd %s: exit %d: %s", strings.Join(args, " "), ee.ExitCode(), strings.TrimSpace(errb.String()))
	}
	if err != nil {
		return nil, -1, err
	}
	return out.Bytes(), 0, nil
}

func cliJSON(v any, args ...string) error {
	out, _, err := cli(append(args, "-o", "json")...)
	if err != nil {
		return err
	}
	return json.Unmarshal(out, v)
}

// runningAgent is a started `gpuherd agent`.
type runningAgent struct {
	cmd  *exec.Cmd
	log  string
	done chan error
}

func startAgent(c *checker, n int) (*runningAgent, error) {
	ids := strings.Join(allowed, ",")
	logPath := fmt.Sprintf("/tmp/agent-%d.log", n)
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(gpuherdBin(), "agent",
		"--node-name", "realkernel", "--sysfs-root", "/sys", "--dev-root", "/dev",
		"--allow-devices", ids, "--gpu-devices", ids,
		"--data-dir", agentData, "--socket", agentSocket,
		"--idle-driver", "nvidia", "--nvml", "off", "--log-level", "debug")
	cmd.Stdout, cmd.Stderr = lf, lf
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, err
	}
	a := &runningAgent{cmd: cmd, log: logPath, done: make(chan error, 1)}
	go func() { a.done <- cmd.Wait(); lf.Close() }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, _, err := cli("status"); err == nil {
			break
		}
		select {
		case err := <-a.done:
			a.dumpLog(c)
			return nil, fmt.Errorf("the agent exited at start: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			a.kill()
			a.dumpLog(c)
			return nil, errors.New("the agent did not answer within 60s")
		}
	}
	c.starts++
	fmt.Fprintf(c.w, "      (agent #%d pid %d serving after %s)\n", n, cmd.Process.Pid, time.Since(t0).Round(time.Millisecond))
	return a, nil
}

func (a *runningAgent) kill() {
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.done
}

func (a *runningAgent) dumpLog(c *checker) {
	b, _ := os.ReadFile(a.log)
	fmt.Fprintf(c.w, "----- %s\n%s-----\n", a.log, b)
}

// expectKernel checks every emulated device's driver link against want
// (devices not named: their host driver) and /dev/vfio/N for the groups on
// vfio-pci; it counts the transitions since the last call.
func (c *checker) expectKernel(step string, m *machine, want map[*dev]string, last map[*dev]string) {
	for _, d := range m.all {
		w, ok := want[d]
		if !ok {
			w = d.hostDriver
		}
		got, _ := kernelView(d.Address)
		c.check(got == w, "%s: kernel: %s %s on %s, want %s", step, d.name, d.Address, orNone(got), orNone(w))
		if d.IOMMUGroup >= 0 && d != m.balloon {
			c.check(waitNode(d.IOMMUGroup, w == vfio.DriverVFIO), "%s: %s %s", step, vfioNode(d.IOMMUGroup), map[bool]string{true: "present", false: "absent"}[w == vfio.DriverVFIO])
		}
		if prev := last[d]; prev != got {
			if d == m.nic {
				netUp(c, m, step) // the interface came back with its driver
			}
			if got == vfio.DriverVFIO {
				c.bound++
			}
			if prev == vfio.DriverVFIO {
				c.unbound++
			}
		}
		last[d] = got
	}
	c.nicTraffic(step, m)
}

func addrsOf(cl api.Claim) []string {
	var out []string
	for _, g := range cl.GPUs {
		out = append(out, g.PCIAddress)
	}
	slices.Sort(out)
	return out
}

func sorted(s ...string) []string { slices.Sort(s); return s }

func gpuByAddr(st api.Status, addr string) (api.GPU, bool) {
	for _, g := range st.GPUs {
		if g.PCIAddress == addr {
			return g, true
		}
	}
	return api.GPU{}, false
}

// partAgent runs the agent on the emulated devices and drives it through
// its CLI, checking the kernel after each step.
func partAgent(c *checker, m *machine) {
	if _, err := os.Stat(gpuherdBin()); !c.noErr(err, "agent binary %s", gpuherdBin()) {
		return
	}
	last := map[*dev]string{}
	for _, d := range m.all {
		last[d], _ = kernelView(d.Address)
	}
	a, err := startAgent(c, 1)
	if !c.noErr(err, "start the agent (idle driver nvidia: free GPUs on their host drivers)") {
		return
	}
	defer func() {
		if a != nil {
			a.kill()
		}
	}()
	c.expectKernel("agent started", m, nil, last)

	var st api.Status
	if c.noErr(cliJSON(&st, "status"), "status -o json") {
		var addrs []string
		for _, g := range st.GPUs {
			addrs = append(addrs, g.PCIAddress)
			fmt.Fprintf(c.w, "      GPU %s model %s group %d driver %s state %s %s\n", g.PCIAddress, g.Model, g.IOMMUGroup, orNone(g.Driver), g.State, g.Health)
		}
		slices.Sort(addrs)
		c.check(slices.Equal(addrs, sorted(m.eduA.Address, m.eduB.Address, m.eduN.Address, m.testdev.Address, m.rng.Address)),
			"status lists the five allow-listed devices as GPUs (gpu_devices), not the balloon nor the NIC: %v", addrs)
		readinessAtStart(c, m, st, last)
		g, _ := gpuByAddr(st, m.rng.Address)
		c.check(g.Model == idRNG && g.State == api.StateFree && g.Driver == "virtio-pci", "virtio-rng offered as model %s, %s, on %s", g.Model, g.State, g.Driver)
	}

	// vm-1: virtio-rng (from its real host driver) and pci-testdev.
	var cl api.Claim
	if c.noErr(cliJSON(&cl, "claim", "vm-1", "--gpu", idRNG+":1", "--gpu", idTestdev+":1"), "claim vm-1 --gpu %s:1 --gpu %s:1", idRNG, idTestdev) {
		c.check(cl.State == api.StateClaimed && slices.Equal(addrsOf(cl), sorted(m.rng.Address, m.testdev.Address)), "vm-1 claimed %v (%s)", addrsOf(cl), cl.State)
		for _, g := range cl.GPUs {
			c.check(g.VFIODevice == vfioNode(g.IOMMUGroup), "vm-1: %s vfio device %s", g.PCIAddress, g.VFIODevice)
		}
	}
	c.expectKernel("vm-1 claimed", m, map[*dev]string{m.rng: vfio.DriverVFIO, m.testdev: vfio.DriverVFIO}, last)
	c.vfioOpen("vm-1 claimed", m.rng)
	c.vfioOpen("vm-1 claimed", m.testdev)

	// vm-2: one edu. Two exist; the shared one cannot be bound, so the agent
	// must end on the one alone in its group (fencing the other if it tried
	// it first).
	cl = api.Claim{}
	if c.noErr(cliJSON(&cl, "claim", "vm-2", "--gpu", idEdu+":1"), "claim vm-2 --gpu %s:1", idEdu) {
		c.check(slices.Equal(addrsOf(cl), []string{m.eduA.Address}), "vm-2 got the edu alone in its group: %v", addrsOf(cl))
	}
	onVFIO := map[*dev]string{m.rng: vfio.DriverVFIO, m.testdev: vfio.DriverVFIO, m.eduA: vfio.DriverVFIO}
	c.expectKernel("vm-2 claimed", m, onVFIO, last)

	// vm-3: no edu left that can be passed through.
	out, code, err := cli("claim", "vm-3", "--gpu", idEdu+":1")
	c.check(code == 3, "claim vm-3 --gpu %s:1: not available, exit 3 (got %d: %v %s)", idEdu, code, err, bytes.TrimSpace(out))
	c.expectKernel("vm-3 refused", m, onVFIO, last)

	// kill -9: the kernel keeps what the agent did.
	a.kill()
	a = nil
	c.check(true, "agent killed with SIGKILL")
	c.expectKernel("after kill -9", m, onVFIO, last)
	_, _, err = cli("status")
	c.check(err != nil, "no agent answers after kill -9")

	// While it is down, virtio-rng goes back to its host driver (an
	// operator, or a crash in the middle of a release): the restarted agent
	// must put it back on vfio-pci, since vm-1 still holds it.
	c.noErr(hostBack(m.rng), "by hand: virtio-rng back to virtio-pci while the agent is down")
	c.expectKernel("tampered", m, map[*dev]string{m.testdev: vfio.DriverVFIO, m.eduA: vfio.DriverVFIO}, last)

	a, err = startAgent(c, 2)
	if !c.noErr(err, "restart the agent on the same ledger") {
		return
	}
	c.expectKernel("restarted (reconciled)", m, onVFIO, last)
	b, _ := os.ReadFile(a.log)
	c.check(bytes.Contains(b, []byte("reconciled")), "the agent logged its reconcile")
	cl = api.Claim{}
	if c.noErr(cliJSON(&cl, "get", "vm-1"), "get vm-1 after the restart") {
		c.check(cl.State == api.StateClaimed && slices.Equal(addrsOf(cl), sorted(m.rng.Address, m.testdev.Address)), "vm-1 survived kill -9: %v (%s)", addrsOf(cl), cl.State)
	}
	cl = api.Claim{}
	if c.noErr(cliJSON(&cl, "get", "vm-2"), "get vm-2 after the restart") {
		c.check(cl.State == api.StateClaimed && slices.Equal(addrsOf(cl), []string{m.eduA.Address}), "vm-2 survived kill -9: %v (%s)", addrsOf(cl), cl.State)
	}
	st = api.Status{}
	if c.noErr(cliJSON(&st, "status"), "status after the restart") {
		for _, d := range []*dev{m.rng, m.testdev, m.eduA} {
			g, _ := gpuByAddr(st, d.Address)
			c.check(g.State == api.StateClaimed && g.Driver == vfio.DriverVFIO, "status: %s %s, on %s", d.name, g.State, orNone(g.Driver))
		}
	}
	c.vfioOpen("after the restart", m.rng)

	// Release: back to the host drivers, /dev/vfio/N gone.
	_, _, err = cli("release", "vm-1")
	c.noErr(err, "release vm-1")
	c.expectKernel("vm-1 released", m, map[*dev]string{m.eduA: vfio.DriverVFIO}, last)
	_, _, err = cli("release", "vm-2")
	c.noErr(err, "release vm-2")
	c.expectKernel("vm-2 released", m, nil, last)
	// A second release must not touch the kernel; the agent answers either
	// success or "not found" (it forgets a released claim).
	_, code, err = cli("release", "vm-2")
	c.check(code == 0 || (err != nil && strings.Contains(err.Error(), "not found")), "release vm-2 again: no harm (exit %d: %v)", code, err)
	c.expectKernel("vm-2 released twice", m, nil, last)
	var claims api.ClaimList
	if c.noErr(cliJSON(&claims, "claims"), "claims -o json") {
		c.check(len(claims.Claims) == 0 && !claims.Partial, "no claims left: %d (partial %v)", len(claims.Claims), claims.Partial)
	}

	// The operator moves the NIC away: the GPU sharing its group is
	// offered, without a restart; the NIC back, and it is unusable again.
	readinessFollows(c, m, a, last)

	// SIGTERM: a clean exit.
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-a.done:
		c.noErr(err, "the agent exits cleanly on SIGTERM")
	case <-time.After(15 * time.Second):
		c.check(false, "the agent did not exit within 15s of SIGTERM")
		a.kill()
	}
	a = nil
	c.expectKernel("agent stopped", m, nil, last)
	if c.failed > 0 {
		for i := 1; i <= 2; i++ {
			(&runningAgent{log: fmt.Sprintf("/tmp/agent-%d.log", i)}).dumpLog(c)
		}
	}
}
