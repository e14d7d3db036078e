package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/sim"
)

// The domain XML of testdata/libvirt-hook was recorded from libvirt 9.0's
// QEMU driver, as it hands it to a hook on stdin: domains made with
// `gpuherd get vm-a -o libvirt-domain` on the simulated l40s-4, whose first
// GPU is 0000:18:00.0 with its audio function 0000:18:00.1.
//
//	vm-a       metadata claim vm-a, release-on-stop, 0000:18:00.0 and .1
//	vm-b       metadata claim vm-b (none exists), the same GPU
//	bare-gpu   no metadata, the same GPU
//	plain      no metadata, no hostdev
//	meta-only  metadata claim vm-a, release-on-stop, no hostdev (another UUID)
const (
	uuidVMA      = "b177531e-083c-47d2-9b36-57ceae1063ba"
	uuidMetaOnly = "f3223715-6e3e-46e0-8176-86c0577dfa1b"
)

// hookEnv is a simulated agent on l40s-4, the simulated machine it runs on
// (whose state file the hook reads, as it does for `gpuherd agent
// --simulate`) and a config file the hook reads.
type hookEnv struct {
	t       *testing.T
	cfg     agent.Config
	config  string
	machine *sim.Machine
}

func startHookEnv(t *testing.T) *hookEnv {
	t.Helper()
	p, err := sim.Builtin("l40s-4")
	if err != nil {
		t.Fatal(err)
	}
	dir := shortTempDir(t)
	m, err := sim.Start(p, filepath.Join(dir, "data"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := startAgentWith(t, func(c *agent.Config) {
		c.Simulate = "l40s-4"
		c.IdleDriver = "vfio-pci"
		c.NodeName = "gpu-17"
		c.DataDir = filepath.Join(dir, "data")
		c.Socket = filepath.Join(dir, "api.sock")
	}, agent.WithSysfs(m.Kernel, nil))
	return &hookEnv{t: t, cfg: cfg, config: writeHookConfig(t, cfg), machine: m}
}

func writeHookConfig(t *testing.T, cfg agent.Config) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gpuherd.yaml")
	yaml := fmt.Sprintf("node_name: %s\nsimulate: %s\ndata_dir: %s\nsocket: %s\n", cfg.NodeName, cfg.Simulate, cfg.DataDir, cfg.Socket)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// hook runs `gpuherd libvirt-hook` as libvirt does: argv NAME OP SUBOP -,
// the recorded XML of the domain on stdin.
func (e *hookEnv) hook(xmlFile, name, op, sub string) result {
	e.t.Helper()
	return e.hookFile(filepath.Join("testdata", "libvirt-hook", xmlFile), name, op, sub)
}

// hookFile is hook with the XML from path.
func (e *hookEnv) hookFile(path, name, op, sub string) result {
	e.t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	// No GPUHERD_SOCKET: the socket comes from the config file.
	e.t.Setenv("GPUHERD_SOCKET", "")
	code := runInput(ctx, []string{"libvirt-hook", "--config", e.config, "--", name, op, sub, "-"}, bytes.NewReader(data), &stdout, &stderr)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

func (e *hookEnv) wantExit(r result, code int, stderrPrefix string) {
	e.t.Helper()
	if r.code != code || r.stdout != "" {
		e.t.Fatalf("hook: %s; want exit %d and nothing on stdout", r, code)
	}
	if code != 0 && (!strings.HasPrefix(r.stderr, stderrPrefix) || strings.Count(r.stderr, "\n") != 1) {
		e.t.Fatalf("hook stderr %q: want one line starting %q", r.stderr, stderrPrefix)
	}
}

// claimVMA claims vm-a on the GPU the recordings name.
func (e *hookEnv) claimVMA() api.Claim {
	e.t.Helper()
	c := okJSON[api.Claim](e.t, e.cfg.Socket, "claim", "vm-a", "--gpu", "L40S")
	if len(c.GPUs) != 1 || c.GPUs[0].PCIAddress != "0000:18:00.0" {
		e.t.Fatalf("vm-a holds %v; the recordings name 0000:18:00.0", claimAddrs(c))
	}
	return c
}

func (e *hookEnv) get(id string) (api.Claim, bool) {
	e.t.Helper()
	r := gpuherd(e.t, e.cfg.Socket, "get", id, "-o", "json")
	if r.code == 4 || strings.Contains(r.stdout, `"not_found"`) {
		return api.Claim{}, false
	}
	c := okJSON[api.Claim](e.t, e.cfg.Socket, "get", id)
	return c, true
}

func TestLibvirtHookStartsOnlyClaimedGPUs(t *testing.T) {
	e := startHookEnv(t)
	c := e.claimVMA()
	if len(c.GPUs[0].Companions) != 1 || c.GPUs[0].Companions[0].PCIAddress != "0000:18:00.1" {
		t.Fatalf("claim answer names companions %+v, want the audio function 0000:18:00.1", c.GPUs[0].Companions)
	}

	// A domain without GPUs of this server, nor metadata: not gpuherd's.
	e.wantExit(e.hook("plain.prepare.xml", "plain", "prepare", "begin"), 0, "")
	// Metadata naming a claim that does not exist, on vm-a's GPU.
	e.wantExit(e.hook("vm-b.prepare.xml", "vm-b", "prepare", "begin"), 1,
		"The following GPUs are not claimed by vm-b: 0000:18:00.0, 0000:18:00.1 (claim vm-b is not held on gpu-17; they are held by claim vm-a: run the domain on that claim")
	// No metadata: the claim is the domain's name, and none is held; the
	// refusal says the metadata is missing and how to add it.
	r := e.hook("bare-gpu.prepare.xml", "bare-gpu", "prepare", "begin")
	e.wantExit(r, 1, "The following GPUs are not claimed by bare-gpu: 0000:18:00.0, 0000:18:00.1")
	for _, want := range []string{
		"domain bare-gpu passes this server's GPUs 0000:18:00.0, 0000:18:00.1 without gpuherd metadata",
		`virsh metadata bare-gpu --config --uri https://github.com/gpuherd/gpuherd/xmlns/libvirt/1 --key gpuherd --set '<claim id="vm-a"/>'`,
		"`gpuherd get vm-a -o libvirt`",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("refusal of bare-gpu lacks %q:\n%s", want, r.stderr)
		}
	}
	// libvirt calls release after the refused start: nothing changes.
	e.wantExit(e.hook("vm-b.prepare.xml", "vm-b", "release", "end"), 0, "")
	if got, ok := e.get("vm-a"); !ok || got.Domain != nil {
		t.Fatalf("after refused starts vm-a is %+v (held %v), want held and in use by no domain", got.Domain, ok)
	}

	// The claimed domain starts and marks its claim.
	e.wantExit(e.hook("vm-a.prepare.xml", "vm-a", "prepare", "begin"), 0, "")
	got, _ := e.get("vm-a")
	if got.Domain == nil || got.Domain.UUID != uuidVMA || got.Domain.Name != "vm-a" || got.Domain.Started {
		t.Fatalf("after prepare vm-a is in use by %+v, want domain vm-a (%s), not started yet", got.Domain, uuidVMA)
	}
	e.wantExit(e.hook("vm-a.prepare.xml", "vm-a", "started", "begin"), 0, "")
	if got, _ := e.get("vm-a"); got.Domain == nil || !got.Domain.Started {
		t.Fatalf("after started vm-a is in use by %+v, want started", got.Domain)
	}
	// Another domain naming the same claim is refused while vm-a runs...
	e.wantExit(e.hook("meta-only.prepare.xml", "meta-only", "prepare", "begin"), 1, "claim vm-a is in use by domain vm-a ("+uuidVMA+")")
	// ...and its release (after the refused start) releases nothing,
	// although its metadata asks for release at stop.
	e.wantExit(e.hook("meta-only.release.xml", "meta-only", "release", "end"), 0, "")
	if got, ok := e.get("vm-a"); !ok || got.Domain == nil || got.Domain.UUID != uuidVMA {
		t.Fatalf("another domain's release changed vm-a: held %v, in use by %+v", ok, got.Domain)
	}
	// reconnect re-marks the running domain and never fails.
	e.wantExit(e.hook("vm-a.prepare.xml", "vm-a", "reconnect", "begin"), 0, "")
	e.wantExit(e.hook("vm-b.prepare.xml", "vm-b", "reconnect", "begin"), 0, "")
	// Operations the hook has no business with pass untouched.
	e.wantExit(e.hook("vm-b.prepare.xml", "vm-b", "stopped", "end"), 0, "")
	// vm-a stops: its metadata asks for release-on-stop.
	e.wantExit(e.hook("vm-a.release.xml", "vm-a", "release", "end"), 0, "")
	if got, ok := e.get("vm-a"); ok {
		t.Fatalf("vm-a is still held after its domain stopped with release-on-stop: %+v", got)
	}
	st := okJSON[api.Status](t, e.cfg.Socket, "status")
	for _, g := range st.GPUs {
		if g.Claim != "" {
			t.Errorf("GPU %s still in claim %s after the release", g.PCIAddress, g.Claim)
		}
	}
}

// A start that the hook let through but that failed later (libvirt calls
// release without started) keeps the claim: release needs a domain that ran.
func TestLibvirtHookFailedStartKeepsClaim(t *testing.T) {
	e := startHookEnv(t)
	e.claimVMA()
	e.wantExit(e.hook("vm-a.prepare.xml", "vm-a", "prepare", "begin"), 0, "")
	e.wantExit(e.hook("vm-a.release.xml", "vm-a", "release", "end"), 0, "")
	got, ok := e.get("vm-a")
	if !ok || got.Domain != nil {
		t.Fatalf("after a start that never ran vm-a is held %v, in use by %+v; want held, in use by none", ok, got.Domain)
	}
	// The next start of the same domain works.
	e.wantExit(e.hook("vm-a.prepare.xml", "vm-a", "prepare", "begin"), 0, "")
}

// The recorded domain of vm-a, written back by Python's ElementTree (the
// namespace declared on <domain> as ns0), starts on its claim like the
// original; the same domain with gpuherd's element in another namespace is
// judged by its name and refused, saying the metadata is missing.
func TestLibvirtHookElementTreeMetadata(t *testing.T) {
	e := startHookEnv(t)
	e.claimVMA()
	data, err := os.ReadFile(filepath.Join("testdata", "libvirt-hook", "vm-a.prepare.xml"))
	if err != nil {
		t.Fatal(err)
	}
	const decl = ` xmlns:gpuherd="https://github.com/gpuherd/gpuherd/xmlns/libvirt/1"`
	et := strings.Replace(string(data), decl, "", 1)
	et = strings.Replace(et, "<gpuherd:claim ", "<ns0:claim ", 1)
	et = strings.Replace(et, "<domain ", "<domain"+strings.Replace(decl, "gpuherd=", "ns0=", 1)+" ", 1)
	if et == string(data) || !strings.Contains(et, "<ns0:claim ") {
		t.Fatal("the recording of vm-a has no gpuherd metadata to move")
	}
	write := func(name, doc string) string {
		path, err := filepath.Abs(filepath.Join(t.TempDir(), name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// A name that is no claim: only the metadata can name vm-a.
	renamed := strings.Replace(et, "<name>vm-a</name>", "<name>guest-7</name>", 1)
	e.wantExit(e.hookFile(write("et.xml", renamed), "guest-7", "prepare", "begin"), 0, "")
	if got, _ := e.get("vm-a"); got.Domain == nil || got.Domain.Name != "guest-7" {
		t.Fatalf("vm-a is in use by %+v, want guest-7", got.Domain)
	}
	e.wantExit(e.hookFile(write("et.xml", renamed), "guest-7", "release", "end"), 0, "")

	other := strings.Replace(renamed, "xmlns:ns0=\"https://github.com/gpuherd/gpuherd/xmlns/libvirt/1\"", `xmlns:ns0="urn:example:other"`, 1)
	r := e.hookFile(write("other.xml", other), "guest-7", "prepare", "begin")
	e.wantExit(r, 1, "The following GPUs are not claimed by guest-7: 0000:18:00.0, 0000:18:00.1")
	if !strings.Contains(r.stderr, "without gpuherd metadata") || !strings.Contains(r.stderr, `--set '<claim id="vm-a"/>'`) {
		t.Fatalf("refusal does not say the metadata is missing and how to add it: %s", r.stderr)
	}
}

func TestLibvirtHookMigrateAndRestoreCheckOnly(t *testing.T) {
	e := startHookEnv(t)
	e.wantExit(e.hook("vm-a.prepare.xml", "vm-a", "migrate", "begin"), 1,
		"The following GPUs are not claimed by vm-a: 0000:18:00.0, 0000:18:00.1 (claim vm-a is not held on gpu-17; no other claim holds them: claim GPUs for vm-a on gpu-17 (gpuherd claim vm-a --gpu MODEL --prefer-node gpu-17 --same-node)")
	e.wantExit(e.hook("vm-b.prepare.xml", "vm-b", "restore", "begin"), 1, "The following GPUs are not claimed by vm-b")
	e.claimVMA()
	e.wantExit(e.hook("vm-a.prepare.xml", "vm-a", "migrate", "begin"), 0, "")
	e.wantExit(e.hook("vm-a.prepare.xml", "vm-a", "restore", "begin"), 0, "")
	if got, _ := e.get("vm-a"); got.Domain != nil {
		t.Fatalf("migrate/restore marked vm-a in use by %+v; only prepare marks", got.Domain)
	}
}

// A GPU of the claim that is not on vfio-pci refuses the start: libvirt's
// managed='no' would fail later with a less helpful message.
func TestLibvirtHookRefusesGPUNotOnVFIO(t *testing.T) {
	e := startHookEnv(t)
	e.claimVMA()
	// Behind the agent's back, as a managed='yes' domain would: the audio
	// function goes back to its host driver.
	if err := e.machine.Kernel.WriteFile("bus/pci/devices/0000:18:00.1/driver/unbind", []byte("0000:18:00.1")); err != nil {
		t.Fatal(err)
	}
	e.wantExit(e.hook("vm-a.prepare.xml", "vm-a", "prepare", "begin"), 1, "GPUs of claim vm-a are not on vfio-pci: 0000:18:00.1 on (none)")
}

func TestLibvirtHookWithoutAgent(t *testing.T) {
	dir := shortTempDir(t)
	cfg := agent.DefaultConfig()
	cfg.NodeName, cfg.Simulate = "gpu-17", "l40s-4"
	cfg.DataDir, cfg.Socket = filepath.Join(dir, "data"), filepath.Join(dir, "none.sock")
	e := &hookEnv{t: t, cfg: cfg, config: writeHookConfig(t, cfg)}
	// A domain that is not gpuherd's starts whatever the agent does.
	e.wantExit(e.hook("plain.prepare.xml", "plain", "prepare", "begin"), 0, "")
	// One that is fails closed, saying why.
	e.wantExit(e.hook("meta-only.prepare.xml", "meta-only", "prepare", "begin"), 1,
		"gpuherd cannot check the GPUs of domain meta-only (claim vm-a): the agent is not running")
	// Stop, release and reconnect never fail.
	e.wantExit(e.hook("meta-only.release.xml", "meta-only", "release", "end"), 0, "")
	e.wantExit(e.hook("meta-only.started.xml", "meta-only", "reconnect", "begin"), 0, "")
}

func TestLibvirtHookArguments(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := runInput(context.Background(), []string{"libvirt-hook", "--config", "/nonexistent", "--", "vm"}, strings.NewReader(""), &stdout, &stderr)
	if code != exitUsage {
		t.Fatalf("libvirt-hook with one argument: exit %d (%s), want %d", code, stderr.String(), exitUsage)
	}
}

func TestClaimAndGetHandOffFormats(t *testing.T) {
	e := startHookEnv(t)
	out := ok(t, e.cfg.Socket, "claim", "vm-a", "--gpu", "L40S", "-o", "libvirt", "--release-on-stop")
	for _, want := range []string{
		`id="vm-a" server="gpu-17" release-on-stop="yes"`,
		`<hostdev mode="subsystem" type="pci" managed="no">`,
		`<address domain="0x0000" bus="0x18" slot="0x00" function="0x1"></address>`,
		`bus="0x10" slot="0x00" function="0x0" multifunction="on"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("claim -o libvirt lacks %s:\n%s", want, out)
		}
	}
	dom := ok(t, e.cfg.Socket, "get", "vm-a", "-o", "libvirt-domain", "--guest-bus", "32")
	if !strings.HasPrefix(dom, `<domain type="kvm">`) || !strings.Contains(dom, `<name>vm-a</name>`) || !strings.Contains(dom, `bus="0x20"`) {
		t.Errorf("get -o libvirt-domain --guest-bus 32:\n%s", dom)
	}
	q := ok(t, e.cfg.Socket, "get", "vm-a", "-o", "qemu")
	if !strings.Contains(q, "-device vfio-pci,host=0000:18:00.1,bus=gpuherd-rp0,addr=0x0.0x1") {
		t.Errorf("get -o qemu:\n%s", q)
	}

	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"status", "-o", "libvirt"}, exitUsage, "only claim and get write it"},
		{[]string{"get", "vm-a", "-o", "xml"}, exitUsage, "use table, wide, json, yaml, libvirt, libvirt-domain, qemu or kubevirt"},
		{[]string{"get", "vm-a", "-o", "libvirt", "--guest-bus", "0"}, exitUsage, "--guest-bus 0"},
		{[]string{"get", "vm-none", "-o", "libvirt"}, -1, "vm-none"}, // -1: any failure (not found)
	} {
		r := gpuherd(t, e.cfg.Socket, tc.args...)
		if (tc.code >= 0 && r.code != tc.code) || r.code == exitOK || !strings.Contains(r.stderr, tc.msg) || r.stdout != "" {
			t.Errorf("gpuherd %s: %s; want exit %d, nothing on stdout, %q on stderr", strings.Join(tc.args, " "), r, tc.code, tc.msg)
		}
	}
}

// A claimed GPU passed with managed='yes' is refused: libvirt would rebind
// it at the domain's stop.
func TestLibvirtHookRefusesManagedYes(t *testing.T) {
	e := startHookEnv(t)
	e.claimVMA()
	data, err := os.ReadFile(filepath.Join("testdata", "libvirt-hook", "vm-a.prepare.xml"))
	if err != nil {
		t.Fatal(err)
	}
	yes := strings.Replace(string(data), "managed='no'", "managed='yes'", 1)
	if yes == string(data) {
		t.Fatal("the recording has no managed='no' hostdev")
	}
	path := filepath.Join(t.TempDir(), "vm-a.managed-yes.xml")
	if err := os.WriteFile(path, []byte(yes), 0o644); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	e.wantExit(e.hookFile(abs, "vm-a", "prepare", "begin"), 1, "domain vm-a passes 0000:18:00.0 with managed='yes'")
	if got, _ := e.get("vm-a"); got.Domain != nil {
		t.Fatalf("the refused domain marked vm-a: %+v", got.Domain)
	}
	// A running domain (reconnect) is never failed, and still marked.
	e.wantExit(e.hookFile(abs, "vm-a", "reconnect", "begin"), 0, "")
	if got, _ := e.get("vm-a"); got.Domain == nil || !got.Domain.Started {
		t.Fatalf("reconnect of a managed='yes' domain left vm-a in use by %+v, want marked running", got.Domain)
	}
}
