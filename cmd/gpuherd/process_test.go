package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// asMainEnv makes the test binary run as the gpuherd command, so that the
// process tests start the real agent without building a second binary.
const asMainEnv = "GPUHERD_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main() // exits
		return
	}
	os.Exit(m.Run())
}

// child is a gpuherd process started by a test.
type child struct {
	cmd    *exec.Cmd
	log    string        // its stdout and stderr
	exited chan struct{} // closed once Wait returned
	err    error         // Wait's error, set before exited is closed
}

// startChild runs `gpuherd args...` as a process. Cleanup kills it (if it
// still runs) and waits for it, so that no test leaves one behind.
func startChild(t *testing.T, logName string, args ...string) *child {
	t.Helper()
	return startChildEnv(t, logName, nil, args...)
}

// startChildEnv is startChild with extra environment variables.
func startChildEnv(t *testing.T, logName string, env []string, args ...string) *child {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), logName)
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), asMainEnv+"=1", "GPUHERD_SOCKET="), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("starting gpuherd %s: %v", strings.Join(args, " "), err)
	}
	c := &child{cmd: cmd, log: logPath, exited: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		logFile.Close()
		close(c.exited)
	}()
	t.Cleanup(func() {
		c.kill()
		if t.Failed() {
			t.Logf("log of gpuherd %s:\n%s", strings.Join(args, " "), c.output())
		}
	})
	return c
}

// kill sends SIGKILL, as `kill -9` does, and waits for the process to go.
func (c *child) kill() {
	select {
	case <-c.exited:
		return
	default:
	}
	_ = c.cmd.Process.Kill()
	<-c.exited
}

func (c *child) output() string {
	b, _ := os.ReadFile(c.log)
	return string(b)
}

// waitReady polls the agent's API with a short backoff until it answers, the
// process exits, or the deadline passes. There is no event to wait on across
// processes: the socket answering is the readiness signal.
func waitReady(t *testing.T, c *child, socket string) {
	t.Helper()
	client := api.NewClient(socket)
	defer client.Close()
	deadline := time.Now().Add(startTimeout)
	backoff := 5 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := client.Version(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent on %s not answering after %s: %v", socket, startTimeout, err)
		}
		select {
		case <-c.exited:
			t.Fatalf("agent exited before it answered (%v):\n%s", c.err, c.output())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// TestProcessClaimSurvivesKill9 is the crash invariant end to end: a
// committed claim survives kill -9 of its agent, with its GPUs still on
// vfio-pci, and a second agent on the same data dir is refused.
func TestProcessClaimSurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts agent processes")
	}
	t.Parallel()
	dir := shortTempDir(t)
	sock := filepath.Join(dir, "api.sock")
	agentArgs := []string{"agent", "--simulate", "dgx-h100", "--data-dir", filepath.Join(dir, "data"),
		"--socket", sock, "--idle-driver", "nvidia", "--node-name", "p1"}

	first := startChild(t, "agent-1.log", agentArgs...)
	waitReady(t, first, sock)
	t.Logf("agent 1 (pid %d) answers on %s", first.cmd.Process.Pid, sock)

	cl := okJSON[api.Claim](t, sock, "claim", "vm-1", "--gpu", "H100 80GB:2")
	addrs := claimAddrs(cl)
	if cl.State != api.StateClaimed || len(addrs) != 2 {
		t.Fatalf("claim vm-1 = %+v, want 2 GPUs claimed", cl)
	}
	checkDrivers(t, okJSON[api.Status](t, sock, "status"), "vm-1", addrs)
	t.Logf("claimed vm-1: %v on vfio-pci", addrs)

	first.kill()
	var exitErr *exec.ExitError
	if !errors.As(first.err, &exitErr) || exitErr.ExitCode() != -1 {
		t.Fatalf("agent 1 after SIGKILL: %v, want killed by a signal", first.err)
	}
	if r := gpuherd(t, sock, "status"); r.code != exitUnavailable || !strings.Contains(r.stderr, "agent not reachable") {
		t.Fatalf("status with the agent killed: %s, want exit 5 'agent not reachable'", r)
	}
	t.Logf("agent 1 killed with SIGKILL; its stale socket refuses connections")

	second := startChild(t, "agent-2.log", agentArgs...)
	waitReady(t, second, sock)
	t.Logf("agent 2 (pid %d) restarted on the same data dir", second.cmd.Process.Pid)

	got := okJSON[api.Claim](t, sock, "get", "vm-1")
	if got.State != api.StateClaimed || !reflect.DeepEqual(claimAddrs(got), addrs) || !got.CommittedAt.Equal(cl.CommittedAt) {
		t.Fatalf("get vm-1 after the restart = %+v, want the claim as committed before: %+v", got, cl)
	}
	checkDrivers(t, okJSON[api.Status](t, sock, "status"), "vm-1", addrs)
	t.Logf("after the restart vm-1 still holds %v, on vfio-pci", addrs)

	// A second agent on the same data dir while this one runs: refused fast,
	// naming the lock, and the running one is untouched.
	start := time.Now()
	dup := startChild(t, "agent-dup.log", "agent", "--simulate", "dgx-h100", "--data-dir", filepath.Join(dir, "data"),
		"--socket", filepath.Join(dir, "dup.sock"), "--idle-driver", "nvidia", "--node-name", "p2")
	select {
	case <-dup.exited:
	case <-time.After(startTimeout):
		t.Fatalf("a second agent on the same data dir still runs after %s", startTimeout)
	}
	took := time.Since(start)
	out := dup.output()
	if !errors.As(dup.err, &exitErr) || exitErr.ExitCode() != exitError {
		t.Errorf("second agent: %v, want exit 1", dup.err)
	}
	for _, want := range []string{"ledger", "locked by another process", "another gpuherd agent"} {
		if !strings.Contains(out, want) {
			t.Errorf("second agent's message does not mention %q:\n%s", want, out)
		}
	}
	if took > 15*time.Second {
		t.Errorf("second agent took %s to give up, want a few seconds (the lock timeout)", took)
	}
	t.Logf("a second agent on the same data dir exits 1 after %s: ledger locked", took.Round(time.Millisecond))
	if got := okJSON[api.Claim](t, sock, "get", "vm-1"); !reflect.DeepEqual(claimAddrs(got), addrs) {
		t.Errorf("vm-1 after the refused second agent = %+v", got)
	}

	if out := ok(t, sock, "release", "vm-1"); out != "Released vm-1 on p1: 2 GPU(s) freed\n" {
		t.Errorf("release vm-1: %q", out)
	}
	checkDrivers(t, okJSON[api.Status](t, sock, "status"), "", nil)
	t.Logf("released vm-1: %v back on nvidia", addrs)
}
