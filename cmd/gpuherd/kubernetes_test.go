package main

import (
	"os"
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

// The plugin refuses to start on a kubeconfig it cannot read, naming the
// key, and on a driver name Kubernetes would refuse.
func TestKubeletPluginRefusesBadSettings(t *testing.T) {
	dir := t.TempDir()
	r := gpuherd(t, dir+"/none.sock", "kubelet-plugin", "--kubeconfig", dir+"/missing.conf")
	if r.code != exitError || !strings.Contains(r.stderr, "config: kubernetes.kubeconfig: "+dir+"/missing.conf") {
		t.Errorf("missing kubeconfig: %s", r)
	}
	kc := dir + "/kubeconfig"
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: x}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = gpuherd(t, dir+"/none.sock", "kubelet-plugin", "--kubeconfig", kc, "--driver-name", "GPU_driver")
	if r.code != exitError || !strings.Contains(r.stderr, `driver name "GPU_driver"`) {
		t.Errorf("bad driver name: %s", r)
	}
}
