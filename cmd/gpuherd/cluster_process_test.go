package main

import (
	"context"
	"fmt"
	"github.com/gpuherd/gpuherd/internal/testport"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/pki"
	"github.com/gpuherd/gpuherd/gossip"
	"github.com/gpuherd/gpuherd/vfio"
)

// clusterNode is one agent process of a test cluster, with what it needs to
// be restarted on the same data dir and ports.
type clusterNode struct {
	name, socket, peerAddr string
	args                   []string
	proc                   *child
}

// freePort finds a port nothing listens on: --gossip-addr :0 would not tell
// the others where to --join, and a restarted agent must come back on the
// same ports. Taken below the ephemeral range (internal/testport), so that
// no agent's own port-0 listener can be handed it first.
func freePort(t *testing.T) int {
	t.Helper()
	ports, err := testport.Free(1)
	if err != nil {
		t.Fatal(err)
	}
	return ports[0]
}

// pollUntil retries f with a short pause until it returns true or within
// passes; there is no event to wait on across processes.
func pollUntil(t *testing.T, what string, within time.Duration, f func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !f() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

// availableFree asks agent socket for the free count of model, quietly.
func availableFree(socket, model string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c := api.NewClient(socket)
	defer c.Close()
	av, err := c.Availability(ctx)
	if err != nil {
		return -1
	}
	for _, m := range av.Models {
		if m.Model == model {
			return m.Free
		}
	}
	return -1
}

// TestProcessClusterClaimSurvivesOwnerKill9 runs three agents as separate
// processes with mutual TLS and an encrypted gossip key: a claim through A
// lands on B (the only L40S server), C sees the capacity change, B is killed
// with SIGKILL right after the claim and again between a reserve and its
// commit, restarts on the same data dir and ports with the claim intact on
// vfio-pci and the orphan reservation expired, and a release through C frees
// the GPUs.
func TestProcessClusterClaimSurvivesOwnerKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts agent processes")
	}
	t.Parallel()
	dir := shortTempDir(t)
	ca := filepath.Join(dir, "ca")
	certs := filepath.Join(dir, "certs")
	if err := pki.CreateCA(ca, "cluster test CA", 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b", "c", "tester"} {
		if err := pki.IssueCert(ca, certs, n, []string{"127.0.0.1"}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	key, err := gossip.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "gossip.key")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	profiles := map[string]string{"a": "a100-pcie-4", "b": "l40s-4", "c": "dgx-h100"}
	gossipPort := map[string]int{}
	nodes := map[string]*clusterNode{}
	for _, n := range []string{"a", "b", "c"} {
		gossipPort[n] = freePort(t)
	}
	seed := fmt.Sprintf("127.0.0.1:%d", gossipPort["a"])
	for _, n := range []string{"a", "b", "c"} {
		node := &clusterNode{name: n, socket: filepath.Join(dir, n+".sock"), peerAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
		node.args = []string{"agent", "--simulate", profiles[n], "--node-name", n,
			"--data-dir", filepath.Join(dir, n), "--socket", node.socket, "--idle-driver", "nvidia",
			"--gossip-addr", fmt.Sprintf("127.0.0.1:%d", gossipPort[n]), "--advertise-addr", "127.0.0.1",
			"--peer-addr", node.peerAddr, "--gossip-key-file", keyFile, "--reservation-lease", "2s",
			"--tls-ca", filepath.Join(ca, "ca.crt"),
			"--tls-cert", filepath.Join(certs, n+".crt"), "--tls-key", filepath.Join(certs, n+".key")}
		if n != "a" {
			node.args = append(node.args, "--join", seed)
		} else {
			node.args = append(node.args, "--join", fmt.Sprintf("127.0.0.1:%d", gossipPort["b"]))
		}
		nodes[n] = node
	}
	start := func(n *clusterNode, run int) {
		n.proc = startChild(t, fmt.Sprintf("%s-%d.log", n.name, run), n.args...)
		waitReady(t, n.proc, n.socket)
	}
	for _, n := range []string{"a", "b", "c"} {
		start(nodes[n], 1)
	}
	a, b, c := nodes["a"], nodes["b"], nodes["c"]
	const l40s = "NVIDIA L40S"
	took := pollUntil(t, "A and C see B's 4 L40S", 30*time.Second, func() bool {
		return availableFree(a.socket, l40s) == 4 && availableFree(c.socket, l40s) == 4
	})
	t.Logf("3 agent processes (pids %d, %d, %d) converged in %v", a.proc.cmd.Process.Pid, b.proc.cmd.Process.Pid, c.proc.cmd.Process.Pid, took.Round(time.Millisecond))

	// A claim through A lands on B, the only server with L40S.
	cl := okJSON[api.Claim](t, a.socket, "claim", "vm-1", "--gpu", "L40S:2")
	addrs := claimAddrs(cl)
	if cl.Node != "b" || cl.State != api.StateClaimed || len(addrs) != 2 {
		t.Fatalf("claim through A = %+v, want 2 L40S claimed on b", cl)
	}
	took = pollUntil(t, "C's availability shows the claim", 30*time.Second, func() bool {
		av := okJSON[api.Availability](t, c.socket, "availability")
		for _, m := range av.Models {
			if m.Model == l40s {
				return m.Free == 2
			}
		}
		return false
	})
	t.Logf("claim vm-1 through A landed on B (%v); `availability -o json` on C showed 2 L40S free after %v", addrs, took.Round(time.Millisecond))

	// A coordinator (the tester, with its own client certificate) reserves
	// on B over the peer API; B is killed before any commit.
	files := pki.Files{CA: filepath.Join(ca, "ca.crt"), Cert: filepath.Join(certs, "tester.crt"), Key: filepath.Join(certs, "tester.key")}
	tlsCfg, err := pki.ClientConfigFor(files, "b")
	if err != nil {
		t.Fatal(err)
	}
	peer := api.NewPeerClient(b.peerAddr, tlsCfg, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	res, err := peer.Reserve(ctx, "vm-2", api.ReserveRequest{Items: []api.Item{{Model: l40s, Count: 1}}, Coordinator: "tester"})
	cancel()
	peer.Close()
	if err != nil || res.State != api.StateReserved {
		t.Fatalf("reserve vm-2 on B through the peer API: %+v, %v", res, err)
	}
	b.proc.kill()
	t.Logf("reserved vm-2 (%v) on B, then killed B with SIGKILL before the commit", claimAddrs(res))

	start(b, 2)
	st := okJSON[api.Status](t, b.socket, "status")
	for _, g := range st.GPUs {
		held := g.Claim == "vm-1"
		if held != (g.PCIAddress == addrs[0] || g.PCIAddress == addrs[1]) {
			t.Errorf("after the restart B's GPU %s is in claim %q", g.PCIAddress, g.Claim)
		}
		if held && (g.Driver != vfio.DriverVFIO || g.State != api.StateClaimed) {
			t.Errorf("after the restart vm-1's GPU %s is %s on %q, want claimed on vfio-pci", g.PCIAddress, g.State, g.Driver)
		}
	}
	t.Logf("B restarted (pid %d) on the same data dir and ports: vm-1 still claimed on vfio-pci", b.proc.cmd.Process.Pid)

	// Nobody commits vm-2: it expires and its GPU leaves vfio-pci.
	took = pollUntil(t, "vm-2's reservation expires on B", 15*time.Second, func() bool {
		st := okJSON[api.Status](t, b.socket, "status")
		for _, g := range st.GPUs {
			if g.Claim == "vm-2" || (g.Claim == "" && g.Driver == vfio.DriverVFIO) {
				return false
			}
		}
		return true
	})
	t.Logf("vm-2's orphan reservation gone %v after B restarted; its GPU off vfio-pci", took.Round(time.Millisecond))
	if r := gpuherd(t, b.socket, "get", "vm-2"); r.code != exitNotFound || !strings.Contains(r.stderr, "not found") {
		t.Errorf("get vm-2 after its lease: %s, want not found (exit 4)", r)
	}

	// C learns that B is back, then releases vm-1 through it.
	pollUntil(t, "C sees vm-1 on B again", 30*time.Second, func() bool {
		return gpuherd(t, c.socket, "get", "vm-1").code == exitOK
	})
	if out := ok(t, c.socket, "release", "vm-1"); !strings.Contains(out, "Released vm-1 on b") {
		t.Errorf("release vm-1 through C: %q", out)
	}
	st = okJSON[api.Status](t, b.socket, "status")
	free := 0
	for _, g := range st.GPUs {
		if g.State == api.StateFree && g.Driver != vfio.DriverVFIO && g.Claim == "" {
			free++
		}
	}
	if free != len(st.GPUs) {
		t.Errorf("after the release B has %d of %d GPUs free off vfio-pci: %+v", free, len(st.GPUs), st.GPUs)
	}
	took = pollUntil(t, "A sees B's 4 L40S free again", 30*time.Second, func() bool { return availableFree(a.socket, l40s) == 4 })
	t.Logf("released vm-1 through C: B's %d GPUs free; A saw it after %v; 3 processes, 2 starts of B, 1 kill -9, 1 claim kept, 1 reservation expired", len(st.GPUs), took.Round(time.Millisecond))
}
