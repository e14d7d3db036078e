package main

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// TestAgentSpeaksSystemdNotify runs the agent as systemd would with
// Type=notify and WatchdogSec=: READY=1 comes only once the API answers,
// watchdog pings follow, and SIGTERM brings STOPPING=1 and a clean exit.
func TestAgentSpeaksSystemdNotify(t *testing.T) {
	dir := t.TempDir()
	notifyPath := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msgs := make(chan string, 64)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(buf[:n])
		}
	}()

	socket := filepath.Join(dir, "api.sock")
	c := startChildEnv(t, "agent.log", []string{"NOTIFY_SOCKET=" + notifyPath, "WATCHDOG_USEC=400000"},
		"agent", "--simulate", "dgx-h100", "--data-dir", filepath.Join(dir, "data"), "--socket", socket, "--node-name", "sd")

	await := func(prefix string) string {
		t.Helper()
		timeout := time.After(startTimeout)
		exited := c.exited
		for {
			select {
			case m, ok := <-msgs:
				if !ok {
					t.Fatalf("notify socket closed before %q", prefix)
				}
				if strings.HasPrefix(m, prefix) {
					return m
				}
			case <-exited:
				// Its last datagrams are in the socket already; the
				// reader hands them over within moments.
				exited, timeout = nil, time.After(2*time.Second)
			case <-timeout:
				t.Fatalf("no %q from the agent within %s:\n%s", prefix, startTimeout, c.output())
			}
		}
	}
	first := await("STATUS=")
	await("READY=1")
	// READY means usable: the API answers now, without any retry.
	client := api.NewClient(socket)
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := client.Status(ctx)
	if err != nil || len(st.GPUs) != 8 {
		t.Fatalf("right after READY=1 the API answered %d GPUs, %v", len(st.GPUs), err)
	}
	status := await("STATUS=")
	await("WATCHDOG=1")
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	await("STOPPING=1")
	select {
	case <-c.exited:
		if c.err != nil {
			t.Errorf("agent exit after SIGTERM: %v", c.err)
		}
	case <-time.After(startTimeout):
		t.Fatal("agent did not exit after SIGTERM")
	}
	t.Logf("systemd saw %q, READY=1 with the API up, %q, WATCHDOG=1, STOPPING=1, exit 0", first, status)
}
