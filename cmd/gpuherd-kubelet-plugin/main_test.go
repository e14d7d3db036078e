package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent"
)

type result struct {
	code           int
	stdout, stderr string
}

// plugin runs one command line in-process.
func plugin(t *testing.T, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// The plugin refuses to start on a kubeconfig it cannot read, naming the
// key, and on a driver name Kubernetes would refuse.
func TestRefusesBadSettings(t *testing.T) {
	dir := t.TempDir()
	r := plugin(t, "--socket", dir+"/none.sock", "--kubeconfig", dir+"/missing.conf")
	if r.code != exitError || !strings.Contains(r.stderr, "gpuherd-kubelet-plugin: config: kubernetes.kubeconfig: "+dir+"/missing.conf") {
		t.Errorf("missing kubeconfig: %+v", r)
	}
	kc := dir + "/kubeconfig"
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: x}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = plugin(t, "--socket", dir+"/none.sock", "--kubeconfig", kc, "--driver-name", "GPU_driver")
	if r.code != exitError || !strings.Contains(r.stderr, `driver name "GPU_driver"`) {
		t.Errorf("bad driver name: %+v", r)
	}
	r = plugin(t, "--config", dir+"/missing.yaml")
	if r.code != exitError || !strings.Contains(r.stderr, dir+"/missing.yaml") {
		t.Errorf("missing --config: %+v", r)
	}
}

// A bad command line is exit 2 and starts nothing.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{{"extra"}, {"--no-such-flag"}, {"-o", "json"}} {
		if r := plugin(t, args...); r.code != exitUsage || !strings.HasPrefix(r.stderr, "gpuherd-kubelet-plugin: ") {
			t.Errorf("%q: %+v, want exit 2", args, r)
		}
	}
	if r := plugin(t, "--version"); r.code != exitOK || !strings.Contains(r.stdout, agent.Version) {
		t.Errorf("--version: %+v", r)
	}
	if r := plugin(t, "--help"); r.code != exitOK || !strings.Contains(r.stdout, "--metrics-addr") || strings.Contains(r.stdout, "Available Commands") {
		t.Errorf("--help: %+v", r)
	}
}

// Settings come from the defaults, then --config (the agent's file), then
// flags; the socket from --socket or GPUHERD_SOCKET over the file's, and
// --agent-socket over all of them: as `gpuherd kubelet-plugin` took them.
func TestSettings(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "gpuherd.yaml")
	if err := os.WriteFile(conf, []byte(`node_name: hv-7
socket: /run/file.sock
dev_root: /host/dev
kubernetes:
  kubeconfig: /etc/file.conf
  node_name: k8s-hv-7
  driver_name: gpus.example.com
  plugin_dir: /plugins/file
  registrar_dir: /registry/file
  cdi_dir: /cdi/file
`), 0o600); err != nil {
		t.Fatal(err)
	}
	settings := func(env string, args ...string) (agent.Config, string) {
		t.Helper()
		t.Setenv("GPUHERD_SOCKET", env)
		var got agent.Config
		var metrics string
		root := newRoot(io.Discard, io.Discard, func(_ context.Context, _ io.Writer, cfg agent.Config, m string) error {
			got, metrics = cfg, m
			return nil
		})
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		return got, metrics
	}

	d := agent.DefaultConfig()
	if cfg, m := settings(""); cfg.Socket != agent.DefaultSocket || cfg.Kubernetes != d.Kubernetes || cfg.NodeName != d.NodeName || m != "" {
		t.Errorf("defaults: %+v, metrics %q", cfg, m)
	}
	cfg, _ := settings("", "--config", conf)
	want := agent.KubernetesConfig{Kubeconfig: "/etc/file.conf", NodeName: "k8s-hv-7", DriverName: "gpus.example.com",
		PluginDir: "/plugins/file", RegistrarDir: "/registry/file", CDIDir: "/cdi/file"}
	if cfg.Kubernetes != want || cfg.NodeName != "hv-7" || cfg.Socket != "/run/file.sock" || cfg.DevRoot != "/host/dev" {
		t.Errorf("--config: %+v", cfg)
	}
	cfg, m := settings("", "--config", conf, "--kubeconfig", "/k", "--kubernetes-node-name", "kn", "--node-name", "n",
		"--driver-name", "d.example.com", "--plugin-dir", "/p", "--registrar-dir", "/r", "--cdi-dir", "/c", "--metrics-addr", ":9466")
	want = agent.KubernetesConfig{Kubeconfig: "/k", NodeName: "kn", DriverName: "d.example.com", PluginDir: "/p", RegistrarDir: "/r", CDIDir: "/c"}
	if cfg.Kubernetes != want || cfg.NodeName != "n" || m != ":9466" {
		t.Errorf("flags over --config: %+v, metrics %q", cfg, m)
	}
	for _, tc := range []struct {
		env  string
		args []string
		want string
	}{
		{"/run/env.sock", nil, "/run/env.sock"},
		{"/run/env.sock", []string{"--socket", "/run/flag.sock"}, "/run/flag.sock"},
		{"", []string{"--socket", "/run/flag.sock"}, "/run/flag.sock"},
		{"/run/env.sock", []string{"--socket", "/run/flag.sock", "--agent-socket", "/run/agent.sock"}, "/run/agent.sock"},
		{"", []string{"--agent-socket", "/run/agent.sock"}, "/run/agent.sock"},
	} {
		if cfg, _ := settings(tc.env, append([]string{"--config", conf}, tc.args...)...); cfg.Socket != tc.want {
			t.Errorf("GPUHERD_SOCKET=%q %q: socket %s, want %s", tc.env, tc.args, cfg.Socket, tc.want)
		}
	}
}

// The hidden man writes gpuherd-kubelet-plugin(1), carrying the help and
// every flag, and no page for itself or for help.
func TestManPage(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("SOURCE_DATE_EPOCH", "1767225600") // 2026-01-01: reproducible
	if r := plugin(t, "man", "--dir", dir); r.code != exitOK {
		t.Fatalf("man: %+v", r)
	}
	names, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil || len(names) != 1 || filepath.Base(names[0]) != "gpuherd-kubelet-plugin.1" {
		t.Fatalf("man wrote %v (%v), want gpuherd-kubelet-plugin.1 alone", names, err)
	}
	data, err := os.ReadFile(names[0])
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	if !strings.Contains(text, `.TH "GPUHERD-KUBELET-PLUGIN" "1" "Jan 2026"`) || !strings.Contains(text, "Dynamic Resource Allocation") {
		t.Errorf("gpuherd-kubelet-plugin.1 lacks its header or help:\n%.300s", text)
	}
	for _, f := range []string{"config", "kubeconfig", "kubernetes-node-name", "node-name", "driver-name", "plugin-dir",
		"registrar-dir", "cdi-dir", "agent-socket", "metrics-addr", "socket"} {
		if !strings.Contains(text, `\fB--`+f+`\fP=`) {
			t.Errorf("gpuherd-kubelet-plugin.1 does not document --%s", f)
		}
	}
}
