package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// startAgentOnKernel is startAgent with the simulated machine's kernel in
// the test's hands, so that a VM can hold a GPU open.
func startAgentOnKernel(t *testing.T) (string, *fakekernel.Kernel) {
	t.Helper()
	dir := shortTempDir(t)
	cfg := agent.DefaultConfig()
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.Socket = filepath.Join(dir, "api.sock")
	cfg.IdleDriver = "nvidia"
	cfg.NodeName = "test"
	p, err := sim.Load("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	m, err := sim.Start(p, cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", logs)
		}
	})
	a, err := agent.New(context.Background(), cfg, slog.New(slog.NewTextHandler(logs, nil)), agent.WithSysfs(m.Kernel, m.NVML))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, func() { close(ready) }) }()
	t.Cleanup(func() {
		cancel()
		<-done
		a.Close()
	})
	select {
	case <-ready:
	case <-time.After(startTimeout):
		t.Fatalf("agent not ready within %s", startTimeout)
	}
	return cfg.Socket, m.Kernel
}

func TestCLIReleaseOfAGPUInUse(t *testing.T) {
	t.Parallel()
	sock, k := startAgentOnKernel(t)
	c := okJSON[api.Claim](t, sock, "claim", "vm-b", "--gpu", "H100 80GB")
	g := c.GPUs[0]
	stop, err := k.OpenGroup(g.IOMMUGroup, fakekernel.Process{PID: 4242, Comm: "qemu-system-x86",
		Cmdline: []string{"qemu-system-x86_64", "-name", "guest=vm-b,debug-threads=on"}})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	out := ok(t, sock, "status")
	if !strings.Contains(out, "claimed (in use by pid 4242, domain vm-b)") {
		t.Errorf("status does not show the VM:\n%s", out)
	}
	st := okJSON[api.Status](t, sock, "status")
	for _, gp := range st.GPUs {
		if gp.PCIAddress == g.PCIAddress && (gp.InUseBy == nil || gp.InUseBy.PID != 4242 || gp.InUseBy.Domain != "vm-b") {
			t.Errorf("status -o json: in_use_by = %+v", gp.InUseBy)
		}
	}

	r := gpuherd(t, sock, "release", "vm-b")
	want := "gpuherd: claim vm-b: GPU " + g.PCIAddress + " is in use by pid 4242 (qemu-system-x86, domain vm-b); stop the VM first, or release with --force\n"
	if r.code != exitConflict || r.stderr != want || r.stdout != "" {
		t.Fatalf("release while in use: %s; want exit 6 and %q", r, want)
	}
	r = gpuherd(t, sock, "release", "vm-b", "-o", "json")
	var eb api.ErrorBody
	if err := json.Unmarshal([]byte(r.stderr), &eb); err != nil || r.code != exitConflict || r.stdout != "" || eb.Error == nil || eb.Error.Code != api.CodeInUse {
		t.Fatalf("release -o json while in use: %s", r)
	}

	out = ok(t, sock, "release", "vm-b", "--force")
	if !strings.Contains(out, "Released vm-b on test: 1 GPU(s) freed") {
		t.Errorf("forced release: %q", out)
	}
	out = ok(t, sock, "status")
	if !strings.Contains(out, "returning (in use by pid 4242, domain vm-b)") {
		t.Errorf("status after a forced release does not show the GPU returning:\n%s", out)
	}
	stop()
	// The agent looks again every second; wait for the GPU to come back.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := okJSON[api.Status](t, sock, "status")
		var got api.GPU
		for _, gp := range st.GPUs {
			if gp.PCIAddress == g.PCIAddress {
				got = gp
			}
		}
		if got.State == api.StateFree && got.Driver == vfio.DriverNVIDIA {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GPU not returned 10 s after the VM let go: %+v", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := k.UnbindsWhileOpen(); n != 0 {
		t.Errorf("%d unbinds under an open group", n)
	}
}

func TestCLIClaimVCPUWarnings(t *testing.T) {
	t.Parallel()
	sock := startAgent(t)
	tests := []struct {
		args []string
		warn string
	}{
		{[]string{"claim", "vm-1", "--gpu", "H100 80GB:2", "--vcpus", "8"},
			"8 vCPUs for 2 GPU(s) is 4.0 per GPU; the platform recommends 8 to 16 per GPU (16 to 32 vCPUs for this VM)"},
		{[]string{"claim", "vm-2", "--gpu", "H100 80GB:1", "--vcpus", "64"},
			"64 vCPUs for 1 GPU(s) is 64.0 per GPU; the platform recommends 8 to 16 per GPU (8 to 16 vCPUs for this VM)"},
		{[]string{"claim", "vm-3", "--gpu", "H100 80GB:2", "--vcpus", "24"}, ""},
		{[]string{"claim", "vm-4", "--gpu", "H100 80GB:1"}, ""},
	}
	for _, tc := range tests {
		r := gpuherd(t, sock, tc.args...)
		wantErr := ""
		if tc.warn != "" {
			wantErr = "gpuherd: warning: " + tc.warn + "\n"
		}
		if r.code != 0 || r.stderr != wantErr || !strings.HasPrefix(r.stdout, "Claim "+tc.args[1]) {
			t.Errorf("%s: %s; want the claim and stderr %q", strings.Join(tc.args, " "), r, wantErr)
		}
		c := okJSON[api.Claim](t, sock, append(tc.args, "-o", "json")...)
		var want []string
		if tc.warn != "" {
			want = []string{tc.warn}
		}
		if strings.Join(c.Warnings, "|") != strings.Join(want, "|") {
			t.Errorf("%s -o json: warnings %q, want %q", strings.Join(tc.args, " "), c.Warnings, want)
		}
	}
	for _, bad := range []string{"0", "-3"} {
		if r := gpuherd(t, sock, "claim", "vm-9", "--gpu", "H100 80GB", "--vcpus", bad); r.code != exitUsage || !strings.Contains(r.stderr, "--vcpus") {
			t.Errorf("--vcpus %s: %s; want a usage error", bad, r)
		}
	}
}

func TestCLIClaimSameNode(t *testing.T) {
	t.Parallel()
	sock := startAgent(t)
	ok(t, sock, "claim", "filler", "--gpu", "H100 80GB:7")
	r := gpuherd(t, sock, "claim", "vm-1", "--gpu", "H100 80GB:2", "--prefer-node", "test", "--same-node")
	first, rest, _ := strings.Cut(r.stderr, "\n")
	if r.code != exitNotAvailable || first != "gpuherd: The following GPUs are not available: 2x NVIDIA H100 80GB on test, where claim vm-1 must stay" ||
		!strings.HasPrefix(rest, "Select an alternative GPU:\n  --gpu \"NVIDIA H100 80GB:1\"") {
		t.Fatalf("same-node claim on a full server: %s", r)
	}
	if out := ok(t, sock, "claim", "vm-1", "--gpu", "H100 80GB:1", "--prefer-node", "test", "--same-node"); !strings.HasPrefix(out, "Claim vm-1 on test: claimed") {
		t.Errorf("same-node claim that fits: %q", out)
	}
	if r := gpuherd(t, sock, "claim", "vm-2", "--gpu", "H100 80GB:1", "--same-node", "--any-node"); r.code != exitUsage || !strings.Contains(r.stderr, "--same-node and --any-node") {
		t.Errorf("--same-node with --any-node: %s; want a usage error", r)
	}
}

// --any-node reaches the agent as any_node: a server alone remembers no
// other server, and the claim is an ordinary one.
func TestCLIClaimAnyNode(t *testing.T) {
	t.Parallel()
	sock := startAgent(t)
	if out := ok(t, sock, "claim", "vm-1", "--gpu", "H100 80GB:1", "--any-node"); !strings.HasPrefix(out, "Claim vm-1 on test: claimed") {
		t.Errorf("claim --any-node: %q", out)
	}
}

// An alternative of several models is printed as the flags that ask for it.
func TestGPUFlags(t *testing.T) {
	got := gpuFlags([]api.Item{{Model: "NVIDIA A100 80GB", Count: 1}, {Model: "NVIDIA L40S", Count: 2}})
	if want := `--gpu "NVIDIA A100 80GB:1" --gpu "NVIDIA L40S:2"`; got != want {
		t.Errorf("gpuFlags = %s, want %s", got, want)
	}
}
