package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

const (
	gossipPort = "7946"
	peerPort   = "7947"
)

// startMarker begins the line the harness writes into an agent's log at
// each start, so that the checks can read what one process logged.
const startMarker = "=== gpuherd-chaos: start "

// profiles are the simulated servers, in turn: H100s on two servers of
// different sizes, so that H100 requests have a choice and contend.
var profiles = []string{"dgx-h100", "mixed", "l40s-4", "a100-pcie-4", "rtx6000pro-2"}

// agent is one gpuherd agent process in its namespace. It is restarted with
// the same command line (data dir, socket, addresses), as a real server's
// agent would be by systemd.
type agent struct {
	i       int
	name    string // node name, also the certificate's name
	profile string
	ns      string
	ip      string
	dataDir string
	socket  string
	logPath string
	args    []string
	bin     string
	client  *api.Client

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	waitErr  error
	expected bool      // the current process is being killed on purpose
	paused   bool      // SIGSTOPped
	lastWake time.Time // last start or SIGCONT
	starts   int

	// clockFile holds the offset the agent adds to its wall clock (a clock
	// step); clockBase is the offset in effect when it last started, which
	// is the one its timestamps carry (its clock ignores later steps).
	clockFile string
	clockBase time.Duration
}

func newAgent(dir, bin string, i, n int, pki, key string, lease, settle time.Duration) *agent {
	a := &agent{
		i:       i,
		name:    fmt.Sprintf("n%d", i),
		profile: profiles[(i-1)%len(profiles)],
		ip:      nodeIP(i),
		bin:     bin,
	}
	sd := filepath.Join(dir, a.name)
	a.dataDir = filepath.Join(sd, "data")
	a.socket = filepath.Join(sd, "api.sock")
	a.logPath = filepath.Join(sd, "agent.log")
	a.clockFile = filepath.Join(sd, "clock-offset")
	a.client = api.NewClient(a.socket)
	a.args = []string{"agent",
		"--simulate", a.profile,
		"--node-name", a.name,
		"--data-dir", a.dataDir,
		"--socket", a.socket,
		"--gossip-addr", a.ip + ":" + gossipPort,
		"--peer-addr", a.ip + ":" + peerPort,
		"--advertise-addr", a.ip,
		"--gossip-key-file", key,
		"--tls-ca", filepath.Join(pki, "ca.crt"),
		"--tls-cert", filepath.Join(pki, a.name+".crt"),
		"--tls-key", filepath.Join(pki, a.name+".key"),
		"--idle-driver", "nvidia", // so that "claimed means vfio-pci" is a real check
		"--reservation-lease", lease.String(),
		"--directory-settle", settle.String(),
		"--clock-offset-file", a.clockFile,
	}
	// Every agent gets every other as a seed, so that any one restarting
	// while some are down or cut off still finds the cluster.
	for j := 1; j <= n; j++ {
		a.args = append(a.args, "--join", nodeIP(j)+":"+gossipPort)
	}
	return a
}

// start runs the agent inside its namespace: `ip netns exec` execs the
// binary, so the pid is the agent's and signals reach it directly.
func (a *agent) start() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := os.MkdirAll(a.dataDir, 0o700); err != nil {
		return err
	}
	logFile, err := os.OpenFile(a.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	a.starts++
	a.clockBase = readOffset(a.clockFile)
	fmt.Fprintf(logFile, startMarker+"#%d of %s at %s, clock offset %s ===\n", a.starts, a.name, time.Now().Format(time.RFC3339Nano), a.clockBase)
	cmd := exec.Command("ip", append([]string{"netns", "exec", a.ns, a.bin}, a.args...)...)
	cmd.Env = append(os.Environ(), "GPUHERD_SOCKET=")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Own process group (a Ctrl-C reaches only this program, which then
	// cleans up), and killed by the kernel should this program die.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting the agent of %s: %w", a.name, err)
	}
	exited := make(chan struct{})
	a.cmd, a.exited, a.expected, a.paused, a.lastWake = cmd, exited, false, false, time.Now()
	go func() {
		err := cmd.Wait()
		logFile.Close()
		a.mu.Lock()
		a.waitErr = err
		a.mu.Unlock()
		close(exited)
	}()
	return nil
}

// running reports whether the process runs (paused counts as running).
func (a *agent) running() bool {
	a.mu.Lock()
	ch := a.exited
	a.mu.Unlock()
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

// crashed is the process's exit when it ended without being killed on
// purpose, else nil.
func (a *agent) crashed() error {
	a.mu.Lock()
	ch, expected := a.exited, a.expected
	a.mu.Unlock()
	if ch == nil || expected {
		return nil
	}
	select {
	case <-ch:
		a.mu.Lock()
		defer a.mu.Unlock()
		return fmt.Errorf("agent %s exited on its own (%v)", a.name, a.waitErr)
	default:
		return nil
	}
}

// kill9 sends SIGKILL and waits for the process to be gone.
func (a *agent) kill9() error {
	a.mu.Lock()
	cmd, ch := a.cmd, a.exited
	a.expected = true
	a.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-ch:
		return nil
	case <-time.After(15 * time.Second):
		return fmt.Errorf("agent %s (pid %d) still there 15s after SIGKILL", a.name, cmd.Process.Pid)
	}
}

func (a *agent) signal(sig syscall.Signal) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd == nil {
		return
	}
	_ = a.cmd.Process.Signal(sig)
	switch sig {
	case syscall.SIGSTOP:
		a.paused = true
	case syscall.SIGCONT:
		a.paused = false
		a.lastWake = time.Now()
	}
}

// setClock writes the offset the agent's wall clock will read from now on.
func (a *agent) setClock(d time.Duration) error {
	return os.WriteFile(a.clockFile, []byte(d.String()+"\n"), 0o600)
}

// realTime converts a time stamped by the agent into the harness's clock.
func (a *agent) realTime(t time.Time) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return t.Add(-a.clockBase)
}

func readOffset(path string) time.Duration {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	d, err := time.ParseDuration(strings.TrimSpace(string(data)))
	if err != nil {
		return 0
	}
	return d
}

func (a *agent) wake() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastWake
}

func (a *agent) isPaused() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.paused
}

// waitReady polls the socket until the agent answers.
func (a *agent) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := a.client.Version(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if !a.running() {
			return fmt.Errorf("agent %s exited before answering%s", a.name, a.tail(10))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent %s not answering on %s after %s: %v", a.name, a.socket, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tail is the end of the agent's log.
func (a *agent) tail(n int) string {
	data, err := os.ReadFile(a.logPath)
	if err != nil || len(bytes.TrimSpace(data)) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return fmt.Sprintf("\n--- last lines of %s ---\n%s", a.logPath, strings.Join(lines, "\n"))
}

// cli runs the gpuherd CLI against the agent's socket: the same binary and
// the same commands an operator or the platform would use.
func (a *agent) cli(ctx context.Context, args ...string) (stdout, stderr string, code int, err error) {
	var o, e bytes.Buffer
	cmd := exec.CommandContext(ctx, a.bin, append([]string{"--socket", a.socket}, args...)...)
	cmd.Env = append(os.Environ(), "GPUHERD_SOCKET=")
	cmd.Stdout, cmd.Stderr = &o, &e
	cmd.WaitDelay = time.Second
	runErr := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case runErr == nil:
		return o.String(), e.String(), 0, nil
	case errors.As(runErr, &exitErr) && exitErr.ExitCode() >= 0:
		return o.String(), e.String(), exitErr.ExitCode(), nil
	default:
		return o.String(), e.String(), -1, runErr
	}
}

// cliJSON runs a CLI command with -o json and decodes its output.
func cliJSON[T any](ctx context.Context, a *agent, args ...string) (T, error) {
	var v T
	out, stderr, code, err := a.cli(ctx, append(args, "-o", "json")...)
	if err != nil {
		return v, err
	}
	if code != 0 {
		return v, fmt.Errorf("gpuherd %s on %s: exit %d: %s", strings.Join(args, " "), a.name, code, strings.TrimSpace(stderr))
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return v, fmt.Errorf("gpuherd %s on %s: decoding: %w", strings.Join(args, " "), a.name, err)
	}
	return v, nil
}
