package names

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

const helperEnv = "NAMES_KILL_HELPER_DIR"

// singleVoter opens a one-voter registry on dir.
func singleVoter(t testing.TB, dir string) *Registry {
	_, trans := raft.NewInmemTransport("node-a")
	reg, err := Open(Config{
		Node: "node-a", Role: RoleVoter, Servers: []Server{{ID: "node-a", Address: "node-a"}},
		DataDir: dir, Transport: trans, Timing: FastTiming(), Lease: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestKillHelper is not a test: run by TestKill9KeepsAcknowledgedNames in
// a child process, it acquires and confirms names until it is killed,
// printing each one once the registry acknowledged it.
func TestKillHelper(t *testing.T) {
	dir := os.Getenv(helperEnv)
	if dir == "" {
		t.Skip("run by TestKill9KeepsAcknowledgedNames")
	}
	reg := singleVoter(t, dir)
	for deadline := time.Now().Add(10 * time.Second); !reg.IsLeader(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no leader")
		}
	}
	ctx := context.Background()
	for i := 0; ; i++ {
		k := Claim(fmt.Sprintf("vm-%d", i))
		g, err := reg.Acquire(ctx, k, "node-a", "", "req", nil)
		if err != nil {
			t.Fatal(err)
		}
		state := StatePending
		if i%2 == 1 {
			if _, err := reg.Confirm(ctx, k, g.Record.Token, "node-b", nil); err != nil {
				t.Fatal(err)
			}
			state = StateHeld
		}
		fmt.Printf("acked %s %d %s\n", k.Name, g.Record.Token, state)
	}
}

// A registry server killed with SIGKILL while it writes keeps, after a
// restart on its data directory, every name it acknowledged, with its
// token and state.
func TestKill9KeepsAcknowledgedNames(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillHelper$", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	type ack struct {
		token uint64
		state State
	}
	acked := map[string]ack{}
	sc := bufio.NewScanner(out)
	for sc.Scan() && len(acked) < 60 {
		f := strings.Fields(sc.Text())
		if len(f) != 4 || f[0] != "acked" {
			continue
		}
		tok, err := strconv.ParseUint(f[2], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		acked[f[1]] = ack{tok, State(f[3])}
	}
	// Kill while it is writing: it has not been told to stop.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if len(acked) < 60 {
		t.Fatalf("the helper acknowledged only %d names", len(acked))
	}

	reg := singleVoter(t, dir)
	defer reg.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, a := range acked {
		r, err := reg.Lookup(ctx, Claim(name), Linearizable)
		if err != nil || r.Token != a.token || r.State != a.state {
			t.Fatalf("%s after kill -9: %+v, %v; acknowledged token %d, %s", name, r, err, a.token, a.state)
		}
	}
}
