package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A claim for a KubeVirt VM prints its pinned ResourceClaim and the VM's
// part; a claim that is not for Kubernetes is refused with what to do;
// GPUs named by address are claimed exactly.
func TestKubeVirtManifestsAndPinnedClaims(t *testing.T) {
	e := startHookEnv(t)
	out := ok(t, e.cfg.Socket, "claim", "vm-k", "--device", "0000:18:00.0", "--device", "0000:2a:00.0", "--kubernetes", "-o", "kubevirt", "--namespace", "vms")
	for _, want := range []string{
		"# gpuherd claim vm-k on gpu-17: 2x NVIDIA L40S\n",
		"kind: ResourceClaim\n",
		"    gpuherd.io/claim: vm-k\n",
		"  namespace: vms\n",
		"deviceClassName: claimed.gpu.gpuherd.io",
		`pciBusID == "0000:2a:00.0"`,
		"#         requestName: gpu1\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("claim -o kubevirt lacks %q:\n%s", want, out)
		}
	}
	if again := ok(t, e.cfg.Socket, "get", "vm-k", "-o", "kubevirt", "--namespace", "vms"); again != out {
		t.Errorf("get -o kubevirt differs from the claim's:\n%s\nvs\n%s", again, out)
	}
	ok(t, e.cfg.Socket, "claim", "vm-l", "--gpu", "L40S")
	r := gpuherd(t, e.cfg.Socket, "get", "vm-l", "-o", "kubevirt")
	if r.code == exitOK || !strings.Contains(r.stderr, "claim it with --kubernetes") {
		t.Errorf("get -o kubevirt of a libvirt claim: %s", r)
	}
	r = gpuherd(t, e.cfg.Socket, "claim", "vm-m", "--device", "0000:18:00.0")
	if r.code != exitNotAvailable {
		t.Errorf("claim of a GPU held by vm-k: %s, want exit %d", r, exitNotAvailable)
	}

	classes := ok(t, e.cfg.Socket, "kubernetes", "deviceclasses")
	for _, want := range []string{"  name: gpu.gpuherd.io\n", "  name: l40s.gpu.gpuherd.io\n", "  name: h100-80gb.gpu.gpuherd.io\n", "  name: claimed.gpu.gpuherd.io\n"} {
		if !strings.Contains(classes, want) {
			t.Errorf("deviceclasses lacks %q", want)
		}
	}
}

// A node group of KubeVirt VMs: every node's claim is for Kubernetes, and
// each prints its pinned ResourceClaim.
func TestKubernetesNodeGroup(t *testing.T) {
	e := startHookEnv(t)
	ok(t, e.cfg.Socket, "group", "create", "tenant-a", "--nodes", "2", "--gpu", "L40S", "--kubernetes")
	for _, node := range []string{"tenant-a.node-0", "tenant-a.node-1"} {
		out := ok(t, e.cfg.Socket, "get", node, "-o", "kubevirt", "--namespace", "tenant-a")
		if !strings.Contains(out, "gpuherd.io/claim: "+node+"\n") || !strings.Contains(out, "name: tenant-a.node-0\n") && node == "tenant-a.node-0" {
			t.Errorf("get %s -o kubevirt:\n%s", node, out)
		}
	}
	// A node released by hand comes back through repair as its siblings are.
	ok(t, e.cfg.Socket, "release", "tenant-a.node-1")
	ok(t, e.cfg.Socket, "group", "repair", "tenant-a")
	if out := ok(t, e.cfg.Socket, "get", "tenant-a.node-1", "-o", "kubevirt"); !strings.Contains(out, "kind: ResourceClaim") {
		t.Errorf("repaired node is not for Kubernetes:\n%s", out)
	}
}

// `gpuherd kubelet-plugin` runs gpuherd-kubelet-plugin from gpuherd's own
// directory, in the same process, with the command line after gpuherd's
// name (global flags included) as its arguments; without the plugin's
// binary it fails, naming it and where it looked.
func TestKubeletPluginCommandExecsThePlugin(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "gpuherd")
	// The test binary runs as gpuherd (asMainEnv); os.Executable is where
	// it was started from, so it goes into dir, linked or copied.
	test, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Link(test, self); err != nil {
		data, err := os.ReadFile(test)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(self, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--socket", "/run/x.sock", "kubelet-plugin", "--config", "/etc/gpuherd/gpuherd.yaml", "--metrics-addr", ":9466"}
	start := func() (pid int, out string, code int) {
		t.Helper()
		cmd := exec.Command(self, args...)
		cmd.Env = append(os.Environ(), asMainEnv+"=1")
		var b strings.Builder
		cmd.Stdout, cmd.Stderr = &b, &b
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.Process.Pid, b.String(), cmd.ProcessState.ExitCode()
	}

	plugin := filepath.Join(dir, "gpuherd-kubelet-plugin")
	if _, out, code := start(); code != exitError || !strings.Contains(out, "gpuherd-kubelet-plugin") || !strings.Contains(out, "no "+plugin) {
		t.Errorf("without the plugin's binary: exit %d, %q; want exit %d naming %s", code, out, exitError, plugin)
	}

	if err := os.WriteFile(plugin, []byte("#!/bin/sh\necho \"$$ $0 $*\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	pid, out, code := start()
	want := fmt.Sprintf("%d %s --socket /run/x.sock --config /etc/gpuherd/gpuherd.yaml --metrics-addr :9466\n", pid, plugin)
	if code != 0 || out != want {
		t.Errorf("gpuherd %s: exit %d, %q; want the plugin run in its process as %q", strings.Join(args, " "), code, out, want)
	}
}
