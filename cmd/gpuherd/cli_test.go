package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// noClaims is `claims -o json` on a platform without claims.
const noClaims = "{\n  \"claims\": [],\n  \"partial\": false\n}\n"

// startTimeout bounds how long an agent on simulated hardware may take to
// come up; it needs well under a second.
const startTimeout = 30 * time.Second

// lockedBuffer is a bytes.Buffer that the agent's goroutines and the test
// may share.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// shortTempDir is t.TempDir, or a shorter directory when the test's name
// would make a socket path longer than sun_path allows.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if len(dir) < 60 {
		return dir
	}
	dir, err := os.MkdirTemp("", "gh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// startAgent runs a real agent in this process on the simulated dgx-h100
// (8 × H100 80GB, free GPUs on nvidia) and returns its socket. The agent
// stops, and its log is shown if the test failed, at cleanup.
func startAgent(t *testing.T) string {
	t.Helper()
	return startAgentWith(t, nil).Socket
}

// startAgentWith is startAgent with the configuration changed by tune
// (nil: unchanged); it returns the configuration the agent runs with.
func startAgentWith(t *testing.T, tune func(*agent.Config), opts ...agent.Option) agent.Config {
	t.Helper()
	dir := shortTempDir(t)
	cfg := agent.DefaultConfig()
	cfg.Simulate = "dgx-h100"
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.Socket = filepath.Join(dir, "api.sock")
	cfg.IdleDriver = "nvidia"
	cfg.NodeName = "test"
	if tune != nil {
		tune(&cfg)
	}
	logs := &lockedBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", logs)
		}
	})
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	a, err := agent.New(context.Background(), cfg, log, opts...)
	if err != nil {
		t.Fatalf("agent.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, func() { close(ready) }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent.Run: %v", err)
		}
		if err := a.Close(); err != nil {
			t.Errorf("agent.Close: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		done <- err // for the cleanup
		t.Fatalf("agent.Run returned before it was ready: %v", err)
	case <-time.After(startTimeout):
		t.Fatalf("agent not ready within %s", startTimeout)
	}
	return cfg
}

// result is what one command line did.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
}

// gpuherd runs one command line in-process against the agent on socket.
func gpuherd(t *testing.T, socket string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, append([]string{"--socket", socket}, args...), &stdout, &stderr)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// ok runs a command that must succeed and returns its stdout.
func ok(t *testing.T, socket string, args ...string) string {
	t.Helper()
	r := gpuherd(t, socket, args...)
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("gpuherd %s: %s", strings.Join(args, " "), r)
	}
	return r.stdout
}

// okJSON runs a command with -o json that must succeed and decodes its output
// strictly into a T.
func okJSON[T any](t *testing.T, socket string, args ...string) T {
	t.Helper()
	out := ok(t, socket, append(args, "-o", "json")...)
	var v T
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("gpuherd %s -o json: %v in %q", strings.Join(args, " "), err, out)
	}
	return v
}

func claimAddrs(c api.Claim) []string {
	var out []string
	for _, g := range c.GPUs {
		out = append(out, g.PCIAddress)
	}
	return out
}

// checkDrivers fails unless the GPUs of claimed are on vfio-pci, claimed by
// id, and every other GPU is free on nvidia.
func checkDrivers(t *testing.T, st api.Status, id string, claimed []string) {
	t.Helper()
	for _, g := range st.GPUs {
		wantDriver, wantState, wantClaim := "nvidia", api.StateFree, ""
		if slices.Contains(claimed, g.PCIAddress) {
			wantDriver, wantState, wantClaim = vfio.DriverVFIO, api.StateClaimed, id
		}
		if g.Driver != wantDriver || g.State != wantState || g.Claim != wantClaim {
			t.Errorf("GPU %s: driver %s, state %s, claim %q; want %s, %s, %q",
				g.PCIAddress, g.Driver, g.State, g.Claim, wantDriver, wantState, wantClaim)
		}
	}
}

func TestCLIStatus(t *testing.T) {
	t.Parallel()
	sock := startAgent(t)

	out := ok(t, sock, "status")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 10 || lines[0] != "NODE test: 8 GPUs; NVSwitch fabric: shared-nvswitch" {
		t.Fatalf("status table:\n%s\nwant a NODE line, a header and 8 rows", out)
	}
	if !regexp.MustCompile(`^PCI ADDRESS\s+MODEL\s+MEMORY\s+NUMA\s+GROUP\s+DRIVER\s+STATE\s+CLAIM$`).MatchString(lines[1]) {
		t.Errorf("header %q", lines[1])
	}
	row := regexp.MustCompile(`^0000:[0-9a-f]{2}:00\.0\s+NVIDIA H100 80GB\s+80 GiB\s+[01]\s+\d+\s+nvidia\s+free\s+-$`)
	for _, l := range lines[2:] {
		if !row.MatchString(l) {
			t.Errorf("row %q does not match %s", l, row)
		}
	}

	st := okJSON[api.Status](t, sock, "status")
	if st.Node != "test" || len(st.GPUs) != 8 {
		t.Fatalf("status -o json: node %q, %d GPUs; want test, 8", st.Node, len(st.GPUs))
	}
	numa := map[int]int{}
	for _, g := range st.GPUs {
		if g.Model != "NVIDIA H100 80GB" || g.MemoryBytes != 80<<30 || g.Driver != "nvidia" || g.State != api.StateFree || g.IOMMUGroup < 0 || g.UUID == "" {
			t.Errorf("GPU %+v: want a free NVIDIA H100 80GB of 80 GiB on nvidia with an IOMMU group and a UUID", g)
		}
		numa[g.NUMANode]++
	}
	if !reflect.DeepEqual(numa, map[int]int{0: 4, 1: 4}) {
		t.Errorf("GPUs per NUMA node %v, want 4 on each of two", numa)
	}
	t.Logf("status: 8 × NVIDIA H100 80GB, table and JSON")
}

// TestCLIClaimLifecycle walks one claim through every client command.
func TestCLIClaimLifecycle(t *testing.T) {
	t.Parallel()
	sock := startAgent(t)

	// claim
	out := ok(t, sock, "claim", "vm-1", "--gpu", "H100 80GB:2", "--label", "tenant=t-1")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 4 || lines[0] != "Claim vm-1 on test: claimed, 2 GPU(s)" {
		t.Fatalf("claim output:\n%s", out)
	}
	for _, l := range lines[2:] {
		if !regexp.MustCompile(`^0000:[0-9a-f]{2}:00\.0\s+NVIDIA H100 80GB\s+(\d+)\s+/dev/vfio/\d+$`).MatchString(l) {
			t.Errorf("claim row %q", l)
		}
	}

	cl := okJSON[api.Claim](t, sock, "get", "vm-1")
	addrs := claimAddrs(cl)
	if cl.ID != "vm-1" || cl.Node != "test" || cl.State != api.StateClaimed || len(addrs) != 2 ||
		!reflect.DeepEqual(cl.Items, []api.Item{{Model: "NVIDIA H100 80GB", Count: 2}}) ||
		!reflect.DeepEqual(cl.Labels, map[string]string{"tenant": "t-1"}) || cl.CommittedAt.IsZero() {
		t.Fatalf("get vm-1 -o json = %+v", cl)
	}
	for _, g := range cl.GPUs {
		if g.VFIODevice != fmt.Sprintf("/dev/vfio/%d", g.IOMMUGroup) {
			t.Errorf("GPU %s: vfio device %q for group %d", g.PCIAddress, g.VFIODevice, g.IOMMUGroup)
		}
	}
	checkDrivers(t, okJSON[api.Status](t, sock, "status"), "vm-1", addrs)
	t.Logf("claim vm-1: %v on vfio-pci, the other six on nvidia", addrs)

	// The same request again is the same claim; another one under its ID is refused.
	again := okJSON[api.Claim](t, sock, "claim", "vm-1", "--gpu", "h100-80gb:1", "--gpu", "NVIDIA H100 80GB", "--label", "tenant=t-1")
	if !reflect.DeepEqual(claimAddrs(again), addrs) {
		t.Errorf("claiming vm-1 again gave %v, want the same %v", claimAddrs(again), addrs)
	}
	if r := gpuherd(t, sock, "claim", "vm-1", "--gpu", "H100 80GB:3"); r.code != exitConflict || !strings.Contains(r.stderr, "different request") {
		t.Errorf("claim vm-1 with another request: %s; want exit 6 naming the different request", r)
	}

	// get (table)
	if got := ok(t, sock, "get", "vm-1"); got != out {
		t.Errorf("get vm-1:\n%s\nwant the claim's own table:\n%s", got, out)
	}

	// claims
	out = ok(t, sock, "claims")
	if !regexp.MustCompile(`(?m)^ID\s+NODE\s+STATE\s+GPUS\s+MODELS\n^vm-1\s+test\s+claimed\s+2\s+2x NVIDIA H100 80GB\n\z`).MatchString(out) {
		t.Errorf("claims:\n%s", out)
	}
	if cls := okJSON[api.ClaimList](t, sock, "claims"); len(cls.Claims) != 1 || !reflect.DeepEqual(cls.Claims[0], cl) || cls.Partial {
		t.Errorf("claims -o json = %+v, want [%+v], not partial", cls, cl)
	}

	// availability: every model of the catalog, L40S included though absent here
	out = ok(t, sock, "availability")
	for _, want := range []string{`(?m)^NVIDIA H100 80GB\s+Available\s+6\s+8\s+6$`, `(?m)^NVIDIA L40S\s+Unavailable\s+0\s+0\s+0$`, `(?m)^NVIDIA A100 80GB\s+Unavailable\s+0\s+0\s+0$`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("availability does not match %s:\n%s", want, out)
		}
	}
	av := okJSON[api.Availability](t, sock, "availability")
	models := map[string]api.ModelAvailability{}
	for _, m := range av.Models {
		models[m.Model] = m
	}
	if got := models["NVIDIA H100 80GB"]; !got.Available || got.Free != 6 || got.Total != 8 || got.Healthy != 8 {
		t.Errorf("availability of H100 80GB = %+v, want available, 6 free of 8, 8 healthy", got)
	}
	if got, ok := models["NVIDIA L40S"]; !ok || got.Available {
		t.Errorf("availability of L40S = %+v (listed: %v), want listed and unavailable", got, ok)
	}
	t.Logf("availability: H100 80GB Available 6/8, L40S Unavailable")

	// drain / undrain a free GPU
	var free string
	for _, g := range okJSON[api.Status](t, sock, "status").GPUs {
		if g.State == api.StateFree {
			free = g.PCIAddress
			break
		}
	}
	if out := ok(t, sock, "drain", free, "--reason", "RMA 42"); out != free+" (NVIDIA H100 80GB): drained\n" {
		t.Errorf("drain: %q", out)
	}
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(free) + `\s.*\sdrained \(RMA 42\)\s+-$`).MatchString(ok(t, sock, "status")) {
		t.Errorf("status does not show %s drained with its reason", free)
	}
	if m := okJSON[api.Availability](t, sock, "availability").Models; !slices.ContainsFunc(m, func(m api.ModelAvailability) bool {
		return m.Model == "NVIDIA H100 80GB" && m.Free == 5
	}) {
		t.Errorf("a drained GPU still counts as free: %+v", m)
	}
	g := okJSON[api.GPU](t, sock, "undrain", free)
	if g.PCIAddress != free || g.State != api.StateFree || g.DrainReason != "" {
		t.Errorf("undrain -o json = %+v", g)
	}
	g = okJSON[api.GPU](t, sock, "drain", free)
	if g.State != api.StateDrained {
		t.Errorf("drain -o json = %+v", g)
	}
	if out := ok(t, sock, "undrain", free); out != free+" (NVIDIA H100 80GB): free\n" {
		t.Errorf("undrain: %q", out)
	}
	if r := gpuherd(t, sock, "drain", "0000:ff:00.0"); r.code != exitNotFound || !strings.Contains(r.stderr, "no GPU at 0000:ff:00.0") {
		t.Errorf("drain of an absent GPU: %s", r)
	}
	t.Logf("drain/undrain %s: table and JSON", free)

	// release
	if out := ok(t, sock, "release", "vm-1"); out != "Released vm-1 on test: 2 GPU(s) freed\n" {
		t.Errorf("release: %q", out)
	}
	checkDrivers(t, okJSON[api.Status](t, sock, "status"), "", nil)
	if r := gpuherd(t, sock, "get", "vm-1"); r.code != exitNotFound || !strings.Contains(r.stderr, "vm-1") || !strings.Contains(r.stderr, "not found") {
		t.Errorf("get after release: %s; want exit 4", r)
	}
	if r := gpuherd(t, sock, "release", "vm-1"); r.code != exitNotFound || !strings.Contains(r.stderr, "not found") {
		t.Errorf("release of a released claim: %s; want exit 4", r)
	}
	for _, args := range [][]string{{"release", "vm-1", "--ignore-not-found"}, {"release", "vm-1", "--ignore-not-found", "-o", "json"}} {
		if r := gpuherd(t, sock, args...); r.code != exitOK || r.stdout != "" || r.stderr != "" {
			t.Errorf("%s: %s; want exit 0 and nothing printed", strings.Join(args, " "), r)
		}
	}
	if out := ok(t, sock, "claims", "-o", "json"); out != noClaims {
		t.Errorf("claims -o json after release = %q, want %q", out, noClaims)
	}
	rel := okJSON[api.Claim](t, sock, "claim", "vm-2", "--gpu", "H100 80GB:8")
	if len(rel.GPUs) != 8 {
		t.Fatalf("claim of all eight: %+v", rel)
	}
	if rel = okJSON[api.Claim](t, sock, "release", "vm-2"); rel.ID != "vm-2" || len(rel.GPUs) != 8 || rel.State != api.StateReleased {
		t.Errorf("release -o json = %+v, want vm-2's 8 GPUs in state released", rel)
	}
	t.Logf("release: GPUs back on nvidia, claim gone")
}

func TestCLINotAvailable(t *testing.T) {
	t.Parallel()
	sock := startAgent(t)
	tests := []struct {
		name    string
		args    []string
		missing []api.Item
	}{
		{"a model the server lacks", []string{"claim", "vm-2", "--gpu", "L40S"}, []api.Item{{Model: "NVIDIA L40S", Count: 1}}},
		{"more than the server has", []string{"claim", "vm-2", "--gpu", "H100 80GB:9"}, []api.Item{{Model: "NVIDIA H100 80GB", Count: 9}}},
		{"only the missing items are named", []string{"claim", "vm-2", "--gpu", "H100 80GB:2", "--gpu", "L40S", "--gpu", "A100 80GB:3"},
			[]api.Item{{Model: "NVIDIA L40S", Count: 1}, {Model: "NVIDIA A100 80GB", Count: 3}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			msg := api.NotAvailableMessage(tc.missing)
			r := gpuherd(t, sock, tc.args...)
			// The first line is the message, exactly; alternatives may follow.
			first, rest, _ := strings.Cut(r.stderr, "\n")
			if r.code != exitNotAvailable || r.stdout != "" || first != "gpuherd: "+msg {
				t.Errorf("%s: %s; want exit 3 and stderr starting with %q", strings.Join(tc.args, " "), r, "gpuherd: "+msg)
			}
			if rest != "" && !strings.HasPrefix(rest, "Select an alternative GPU:\n  --gpu ") {
				t.Errorf("%s: after the message, stderr has %q; want the alternatives", strings.Join(tc.args, " "), rest)
			}

			r = gpuherd(t, sock, append(tc.args, "-o", "json")...)
			var eb api.ErrorBody
			if err := json.Unmarshal([]byte(r.stderr), &eb); err != nil || r.code != exitNotAvailable || r.stdout != "" {
				t.Fatalf("-o json: %s (decode: %v); want exit 3 with the error as JSON on stderr", r, err)
			}
			if e := eb.Error; e == nil || e.Code != api.CodeNotAvailable || e.Message != msg || !reflect.DeepEqual(e.Missing, tc.missing) {
				t.Errorf("-o json error = %+v, want code %s, message %q, missing %v", e, api.CodeNotAvailable, msg, tc.missing)
			}
		})
	}
	if out := ok(t, sock, "claims", "-o", "json"); out != noClaims {
		t.Errorf("a refused claim left something behind: %s", out)
	}
	checkDrivers(t, okJSON[api.Status](t, sock, "status"), "", nil)
	t.Logf("not available: exit 3, one line or JSON on stderr, nothing taken")
}

// TestCLIUsageErrors: bad input is exit 2 with one line naming what is wrong,
// and changes nothing.
func TestCLIUsageErrors(t *testing.T) {
	t.Parallel()
	sock := startAgent(t)
	tests := []struct {
		name string
		args []string
		want string // substring of the one stderr line
	}{
		{"count 0", []string{"claim", "vm-1", "--gpu", "H100 80GB:0"}, `--gpu "H100 80GB:0": count must be at least 1`},
		{"count negative", []string{"claim", "vm-1", "--gpu", "H100 80GB:-1"}, "count must be at least 1"},
		{"count above the maximum", []string{"claim", "vm-1", "--gpu", "H100 80GB:17"}, "count 17 for NVIDIA H100 80GB: must be between 1 and 16"},
		{"count not a number", []string{"claim", "vm-1", "--gpu", "H100 80GB:x"}, `count "x" is not a number`},
		{"empty model", []string{"claim", "vm-1", "--gpu", ":2"}, "model is empty"},
		{"unknown model", []string{"claim", "vm-1", "--gpu", "V100"}, `unknown GPU model "V100"`},
		{"ambiguous model", []string{"claim", "vm-1", "--gpu", "h100"}, `"h100" is ambiguous: NVIDIA H100 80GB, NVIDIA H100 NVL`},
		{"slash in the ID", []string{"claim", "a/b", "--gpu", "H100 80GB"}, `id: "a/b" has '/'`},
		{"ID of 129 characters", []string{"claim", strings.Repeat("i", 129), "--gpu", "H100 80GB"}, "id: is 129 characters long"},
		{"label without =", []string{"claim", "vm-1", "--gpu", "H100 80GB", "--label", "tenant"}, `--label "tenant": use key=value`},
		{"label without key", []string{"claim", "vm-1", "--gpu", "H100 80GB", "--label", "=v"}, `--label "=v": use key=value`},
		{"label twice", []string{"claim", "vm-1", "--gpu", "H100 80GB", "--label", "k=1", "--label", "k=2"}, `key "k" given twice`},
		{"oversized label value", []string{"claim", "vm-1", "--gpu", "H100 80GB", "--label", "k=" + strings.Repeat("v", 257)}, `labels["k"]`},
		{"missing --gpu", []string{"claim", "vm-1"}, "--gpu: give at least one"},
		{"claim without ID", []string{"claim", "--gpu", "H100 80GB"}, "expected one claim ID, got 0 argument(s)"},
		{"claim with two IDs", []string{"claim", "vm-1", "vm-2", "--gpu", "H100 80GB"}, "expected one claim ID, got 2 argument(s)"},
		{"status with an argument", []string{"status", "now"}, "expected no arguments, got 1 argument(s)"},
		{"get without ID", []string{"get"}, "expected one claim ID, got 0"},
		{"release with two IDs", []string{"release", "a", "b"}, "expected one claim ID, got 2"},
		{"drain without address", []string{"drain"}, "expected one PCI address"},
		{"drain of a bad address", []string{"drain", "../../bus/pci/drivers/nvidia/unbind"}, "invalid PCI address"},
		{"unknown flag", []string{"status", "--bogus"}, "unknown flag: --bogus"},
		{"flag without value", []string{"claim", "vm-1", "--gpu"}, "flag needs an argument"},
		{"unknown command", []string{"frob"}, `unknown command "frob"`},
		{"output xml", []string{"status", "-o", "xml"}, `--output "xml": use table, wide, json, yaml`},
		{"output xml on claim", []string{"claim", "vm-1", "--gpu", "H100 80GB", "-o", "xml"}, `--output "xml"`},
		{"empty claim ID", []string{"claim", "", "--gpu", "H100 80GB"}, "id: must not be empty"},
		{"empty ID on get", []string{"get", ""}, "id: must not be empty"},
		{"empty ID on release", []string{"release", ""}, "id: must not be empty"},
		{"empty ID on resize", []string{"resize", "", "--gpu", "H100 80GB"}, "id: must not be empty"},
		{"empty group name", []string{"group", "get", ""}, "id: must not be empty"},
		{"dot ID", []string{"get", "."}, `"." must start with a letter or a digit`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := gpuherd(t, sock, tc.args...)
			if r.code != exitUsage {
				t.Errorf("exit %d, want 2 (%s)", r.code, r)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
			if !strings.HasPrefix(r.stderr, "gpuherd: ") || strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") {
				t.Errorf("stderr %q, want one line starting with \"gpuherd: \"", r.stderr)
			}
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr %q does not contain %q", r.stderr, tc.want)
			}
		})
	}
	// For programs: the same errors, in the API's shape on stderr.
	for _, tc := range tests {
		if slices.Contains(tc.args, "-o") {
			continue
		}
		args := append(slices.Clone(tc.args), "-o", "json")
		r := gpuherd(t, sock, args...)
		var eb api.ErrorBody
		if err := json.Unmarshal([]byte(r.stderr), &eb); err != nil || r.code != exitUsage || r.stdout != "" ||
			eb.Error == nil || (eb.Error.Code != api.CodeInvalid && eb.Error.Code != api.CodeUnknownModel) || eb.Error.Message == "" {
			t.Errorf("%s -o json: %s (decode: %v); want exit 2 and {\"error\": {\"code\": \"invalid_request\", ...}} on stderr", tc.name, r, err)
		}
	}
	if out := ok(t, sock, "claims", "-o", "json"); out != noClaims {
		t.Errorf("a refused command left a claim behind: %s", out)
	}
	checkDrivers(t, okJSON[api.Status](t, sock, "status"), "", nil)
	t.Logf("%d usage errors: exit 2, one line, nothing changed", len(tests))
}

// TestCLIDotIDs: "." and ".." as a claim ID are usage errors (exit 2),
// never reach another endpoint's data and never change anything.
func TestCLIDotIDs(t *testing.T) {
	t.Parallel()
	sock := startAgent(t)
	held := okJSON[api.Claim](t, sock, "claim", "vm-1", "--gpu", "H100 80GB:1")
	for _, id := range []string{".", ".."} {
		for _, args := range [][]string{
			{"claim", id, "--gpu", "H100 80GB"},
			{"get", id},
			{"release", id},
			{"get", id, "-o", "json"},
		} {
			r := gpuherd(t, sock, args...)
			if r.code != exitUsage || strings.Contains(r.stdout, "vm-1") || strings.Contains(r.stderr, "vm-1") {
				t.Errorf("gpuherd %s: %s; want exit 2 and an error that shows no other claim", strings.Join(args, " "), r)
			}
		}
	}
	if cls := okJSON[api.ClaimList](t, sock, "claims"); len(cls.Claims) != 1 || !reflect.DeepEqual(cls.Claims[0], held) {
		t.Errorf("claims after dot IDs = %+v, want only %+v", cls, held)
	}
}

func TestCLIAgentDown(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(shortTempDir(t), "missing.sock")
	msg := "agent not reachable on " + sock + " (is `gpuherd agent` running? set --socket or GPUHERD_SOCKET)"
	for _, args := range [][]string{{"status"}, {"claim", "vm-1", "--gpu", "L40S"}, {"release", "vm-1"}} {
		r := gpuherd(t, sock, args...)
		if want := "gpuherd: " + msg + "\n"; r.code != exitUnavailable || r.stdout != "" || r.stderr != want {
			t.Errorf("gpuherd %s with no agent: %s; want exit 5 and %q", strings.Join(args, " "), r, want)
		}
	}
	// For programs, the same error in the API's shape, on stderr.
	for _, args := range [][]string{{"status", "-o", "json"}, {"claims", "-ojson"}, {"release", "vm-1", "--output=json"}} {
		r := gpuherd(t, sock, args...)
		var eb api.ErrorBody
		dec := json.NewDecoder(strings.NewReader(r.stderr))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&eb); err != nil || r.code != exitUnavailable || r.stdout != "" || eb.Error == nil ||
			eb.Error.Code != "unreachable" || eb.Error.Message != msg {
			t.Errorf("gpuherd %s with no agent: %s (decode: %v); want exit 5 and {\"error\": {\"code\": \"unreachable\", ...}} on stderr", strings.Join(args, " "), r, err)
		}
	}
	t.Logf("agent down: exit 5 naming the socket %s, as text or JSON on stderr", sock)
}

func TestCLIVersion(t *testing.T) {
	t.Parallel()
	// version needs no agent: the socket is never dialled.
	sock := filepath.Join(shortTempDir(t), "missing.sock")
	want := agent.VersionInfo()
	line := "gpuherd " + want.Version
	if want.Commit != "" {
		line += " (" + want.Commit + ")"
	}
	if out := ok(t, sock, "version"); out != line+" "+want.Go+"\n" {
		t.Errorf("version = %q, want %q", out, line+" "+want.Go+"\n")
	}
	if got := okJSON[api.VersionInfo](t, sock, "version"); got != want {
		t.Errorf("version -o json = %+v, want %+v", got, want)
	}
}

// scanResult is `gpuherd inventory -o json`, as much of it as the tests read.
type scanResult struct {
	SysfsRoot string `json:"sysfs_root"`
	GPUs      []struct {
		Address string `json:"pci_address"`
		Model   string `json:"model"`
		Driver  string `json:"driver"`
		Group   int    `json:"iommu_group"`
		Viable  bool   `json:"viable"`
		Reason  string `json:"reason"`
		Members []struct {
			Address string `json:"pci_address"`
		} `json:"iommu_group_members"`
	} `json:"gpus"`
	NotOffered []json.RawMessage `json:"not_offered"`
}

func inventoryJSON(t *testing.T, args ...string) scanResult {
	t.Helper()
	r := gpuherd(t, "/nonexistent.sock", append(append([]string{"inventory"}, args...), "-o", "json")...)
	if r.code != exitOK {
		t.Fatalf("inventory %v: %s", args, r)
	}
	var rep scanResult
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("inventory %v -o json: %v", args, err)
	}
	return rep
}

// checkMixed checks the scan of the mixed profile: six GPUs, all ready but
// the L40S whose IOMMU group holds the host's NVMe drive.
func checkMixed(t *testing.T, rep scanResult) {
	t.Helper()
	if len(rep.GPUs) != 6 {
		t.Fatalf("%d GPUs, want 6: %+v", len(rep.GPUs), rep.GPUs)
	}
	for _, g := range rep.GPUs {
		if g.Address == "0000:e1:00.0" {
			if g.Viable || !strings.Contains(g.Reason, "0000:e2:00.0") || !strings.Contains(g.Reason, "144d:a808") || !strings.Contains(g.Reason, "nvme") {
				t.Errorf("GPU %s: viable %v, reason %q; want refused for the NVMe 144d:a808 on nvme", g.Address, g.Viable, g.Reason)
			}
			if len(g.Members) != 3 {
				t.Errorf("GPU %s: group members %+v, want the GPU, its audio function and the NVMe", g.Address, g.Members)
			}
			continue
		}
		if !g.Viable || g.Reason != "" {
			t.Errorf("GPU %s (%s): viable %v, reason %q; want ready", g.Address, g.Model, g.Viable, g.Reason)
		}
	}
	if len(rep.NotOffered) != 4 {
		t.Errorf("not_offered has %d entries, want the 4 audio functions", len(rep.NotOffered))
	}
}

func TestCLIInventory(t *testing.T) {
	t.Parallel()
	simRep := inventoryJSON(t, "--simulate", "mixed")
	if simRep.SysfsRoot != "simulated:mixed" {
		t.Errorf("sysfs_root = %q", simRep.SysfsRoot)
	}
	checkMixed(t, simRep)

	r := gpuherd(t, "/nonexistent.sock", "inventory", "--simulate", "mixed")
	if r.code != exitOK || !strings.HasPrefix(r.stdout, "6 NVIDIA GPU(s) in simulated:mixed, 5 ready for passthrough\n") ||
		!regexp.MustCompile(`(?m)^0000:e1:00\.0\s+NVIDIA L40S\s+1\s+\d+\s+nvidia\s+unusable$`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^  unusable: .*0000:e2:00\.0.*144d:a808`).MatchString(r.stdout) {
		t.Errorf("inventory --simulate mixed table: %s", r)
	}
	t.Logf("inventory --simulate mixed: 5 ready, 0000:e1:00.0 unusable for the NVMe 144d:a808")

	// The same machine written out as a directory tree scans the same.
	p, err := sim.Load("mixed")
	if err != nil {
		t.Fatal(err)
	}
	k, err := fakekernel.New(p.KernelConfig())
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "sys")
	if err := k.WriteTree(root); err != nil {
		t.Fatal(err)
	}
	tree := inventoryJSON(t, "--sysfs-root", root)
	if tree.SysfsRoot != root {
		t.Errorf("sysfs_root = %q, want %q", tree.SysfsRoot, root)
	}
	checkMixed(t, tree)
	tree.SysfsRoot = simRep.SysfsRoot
	if !reflect.DeepEqual(tree, simRep) {
		t.Errorf("scan of the tree differs from the scan of the simulation:\n%+v\n%+v", tree, simRep)
	}
	t.Logf("inventory --sysfs-root on the tree of fakekernel.Kernel.WriteTree: same report")

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"inventory", "--simulate", "no-such-profile"}, exitUsage, "--simulate"},
		{[]string{"inventory", "--allow-devices", "nvidia"}, exitUsage, "--allow-devices"},
		{[]string{"inventory", "--sysfs-root", filepath.Join(root, "absent")}, exitError, filepath.Join(root, "absent")},
	} {
		r := gpuherd(t, "/nonexistent.sock", tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%v: %s; want exit %d and one line naming %q", tc.args, r, tc.code, tc.want)
		}
	}
}

// TestCLIAgentRefusesBadConfig: the agent command checks its settings before
// it touches anything, and names the key.
func TestCLIAgentRefusesBadConfig(t *testing.T) {
	t.Parallel()
	dir := shortTempDir(t)
	cfgFile := filepath.Join(dir, "gpuherd.yaml")
	if err := os.WriteFile(cfgFile, []byte("node_name: a\nidle_drvier: nvidia\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"agent", "--simulate", "dgx-h100", "--data-dir", filepath.Join(dir, "data"), "--node-name", "bad"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--idle-driver", "nouveau"}, "config: idle_driver:"},
		{[]string{"--max-gpus-per-claim", "65"}, "config: max_gpus_per_claim:"},
		{[]string{"--log-level", "loud"}, "config: log_level:"},
		{[]string{"--bind-timeout", "1ms"}, "config: bind_timeout:"},
		{[]string{"--config", cfgFile}, "idle_drvier"},
	} {
		r := gpuherd(t, filepath.Join(dir, "api.sock"), append(slices.Clone(base), tc.args...)...)
		if r.code != exitError || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("agent %v: %s; want exit 1 naming %q", tc.args, r, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused agent created its data dir (stat: %v)", err)
	}
}
