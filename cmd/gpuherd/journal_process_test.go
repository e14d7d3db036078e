package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// With stderr marked as the journal (JOURNAL_STREAM) but no journal socket
// to write to natively, the agent writes sd-daemon(3) lines: a priority
// prefix, no timestamp of its own (the journal stamps each line).
func TestProcessLogsForTheJournal(t *testing.T) {
	if _, err := os.Stat("/run/systemd/journal/socket"); err == nil {
		t.Skip("a real journal listens here: the agent would log into it")
	}
	dir := t.TempDir()
	logPath := filepath.Join(dir, "agent.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(logFile.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "api.sock")
	cmd := exec.Command(os.Args[0], "agent", "--simulate", "l40s-4", "--node-name", "j",
		"--data-dir", filepath.Join(dir, "data"), "--socket", sock)
	cmd.Env = append(os.Environ(), asMainEnv+"=1", "GPUHERD_SOCKET=", fmt.Sprintf("JOURNAL_STREAM=%d:%d", st.Dev, st.Ino))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, log: logPath, exited: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	defer c.kill()
	waitReady(t, c, sock)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-c.exited
	out := c.output()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 3 {
		t.Fatalf("log:\n%s", out)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "<") || strings.Contains(l, "time=") {
			t.Errorf("line %q: want a <N> priority prefix and no time", l)
		}
	}
	if !strings.Contains(out, "<6>level=INFO msg=\"gpuherd agent stopped") {
		t.Errorf("no shutdown line at info priority:\n%s", out)
	}
}
