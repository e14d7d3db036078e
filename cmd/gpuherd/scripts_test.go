package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gpuherd/gpuherd/agent/api"
)

// fakeAgent serves the real API handler over a unix socket with answers a
// test chooses: what a hostile or broken cluster could send the CLI.
type fakeAgent struct {
	api.Service // nil: a method the test did not set panics
	members     []api.Member
	avail       api.Availability
	claims      api.ClaimList
	status      api.Status
}

func (f *fakeAgent) Status(context.Context) (api.Status, error) { return f.status, nil }

func (f *fakeAgent) Members(context.Context) ([]api.Member, error)          { return f.members, nil }
func (f *fakeAgent) Availability(context.Context) (api.Availability, error) { return f.avail, nil }
func (f *fakeAgent) ListClaims(context.Context) (api.ClaimList, error)      { return f.claims, nil }
func (f *fakeAgent) Get(_ context.Context, id string) (api.Claim, error) {
	for _, c := range f.claims.Claims {
		if c.ID == id {
			return c, nil
		}
	}
	return api.Claim{}, &api.Error{Status: http.StatusNotFound, Code: api.CodeNotFound, Message: "claim " + id + " not found"}
}

func serveFake(t *testing.T, f api.Service) string {
	t.Helper()
	sock := filepath.Join(shortTempDir(t), "fake.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: api.NewHandler(f, slog.New(slog.DiscardHandler))}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return sock
}

// hostile is a name as a broken or malicious server could gossip it.
const hostile = "L40S\x1b[2J\x1b]0;pwned\x07\nfake line\t\u202e"

// TestCLIEscapesControlCharacters: names from gossip and from other servers
// reach a terminal with every control character escaped, in every table
// and on stderr; JSON keeps the exact value, escaped as JSON does.
func TestCLIEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	claim := api.Claim{ID: "vm-1", Node: "gpu-\x1b[31m1", State: "claimed", Items: []api.Item{{Model: hostile, Count: 1}},
		GPUs: []api.ClaimGPU{{PCIAddress: "0000:18:00.0", Model: hostile, IOMMUGroup: 3}}, Labels: map[string]string{"k": "v\x1b[0m"}}
	f := &fakeAgent{
		members: []api.Member{{Name: "gpu-\x1b[31m1", State: "alive", AgentVersion: "1.0\x1b[2J",
			Models: []api.ModelAvailability{{Model: hostile, Free: 1, Total: 1}}}},
		avail:  api.Availability{Node: "gpu-1\r", Servers: 1, Models: []api.ModelAvailability{{Model: hostile, Available: true, Free: 1, Total: 1}}},
		claims: api.ClaimList{Claims: []api.Claim{claim}},
	}
	sock := serveFake(t, f)
	for _, args := range [][]string{{"members"}, {"members", "-o", "wide"}, {"availability"}, {"availability", "-o", "wide"},
		{"claims"}, {"claims", "-o", "wide"}, {"get", "vm-1"}, {"get", "vm-1", "-o", "wide"}} {
		out := ok(t, sock, args...)
		for _, bad := range []string{"\x1b", "\x07", "\r", "\u202e", "fake line\n"} {
			if strings.Contains(out, bad) {
				t.Errorf("%s prints %q raw:\n%s", strings.Join(args, " "), bad, out)
			}
		}
		if !strings.Contains(out, `\x1b[2J`) {
			t.Errorf("%s does not show the escaped name:\n%s", strings.Join(args, " "), out)
		}
	}
	av := okJSON[api.Availability](t, sock, "availability")
	if av.Models[0].Model != hostile {
		t.Errorf("availability -o json = %q, want the exact name %q", av.Models[0].Model, hostile)
	}
	// An agent's error message quoting a name is escaped on stderr too.
	r := gpuherd(t, sock, "get", "vm-2")
	if r.code != exitNotFound || strings.ContainsAny(r.stderr, "\x1b\x07") {
		t.Errorf("get vm-2: %s", r)
	}
	t.Logf("members, availability, claims, get: %q shown as %q", "\x1b[2J", `\x1b[2J`)
}

// TestCLIClaimsPartial: when a server did not answer, `claims` says so:
// a warning naming it on stderr, "partial" in JSON, and exit 5.
func TestCLIClaimsPartial(t *testing.T) {
	t.Parallel()
	f := &fakeAgent{claims: api.ClaimList{
		Claims:     []api.Claim{{ID: "vm-1", Node: "gpu-1", State: "claimed"}},
		Partial:    true,
		Unanswered: []api.Unanswered{{Node: "gpu-2", Reason: "agent not reachable at 10.0.0.2:7947"}},
	}}
	sock := serveFake(t, f)
	r := gpuherd(t, sock, "claims")
	if r.code != exitUnavailable || !strings.Contains(r.stdout, "vm-1") ||
		!strings.Contains(r.stderr, "gpuherd: warning: gpu-2 did not answer: agent not reachable at 10.0.0.2:7947") ||
		!strings.Contains(r.stderr, "partial list: 1 server(s) did not answer (gpu-2)") {
		t.Errorf("claims with gpu-2 down: %s; want the list, a warning naming gpu-2 and exit 5", r)
	}
	r = gpuherd(t, sock, "claims", "-o", "json")
	var l api.ClaimList
	if err := json.Unmarshal([]byte(r.stdout), &l); err != nil || !reflect.DeepEqual(l, f.claims) || r.code != exitUnavailable {
		t.Errorf("claims -o json: %s (%v); want the partial list and exit 5", r, err)
	}
	var eb api.ErrorBody
	if err := json.Unmarshal([]byte(r.stderr), &eb); err != nil || eb.Error == nil || eb.Error.Code != api.CodeUnavailable {
		t.Errorf("claims -o json stderr %q (%v): want an unavailable error", r.stderr, err)
	}
	t.Logf("partial: exit 5, warning %q", strings.SplitN(r.stderr, "\n", 2)[0])
}

// TestCLIAggregatesPartial: availability and members that lack a server
// say so as claims does: a warning naming it, the JSON marking it, exit
// 5; complete ones exit 0.
func TestCLIAggregatesPartial(t *testing.T) {
	t.Parallel()
	f := &fakeAgent{
		avail: api.Availability{Node: "gpu-1", Servers: 1, Models: []api.ModelAvailability{{Model: "NVIDIA L40S", Available: true, Free: 1, Total: 4}},
			Partial: true, Unanswered: []api.Unanswered{{Node: "gpu-2", Reason: "not heard of since this agent started"}}},
		members: []api.Member{{Name: "gpu-1", State: "alive", Self: true, Models: []api.ModelAvailability{}},
			{Name: "gpu-2", State: api.MemberUnknown, Models: []api.ModelAvailability{}}},
	}
	sock := serveFake(t, f)
	r := gpuherd(t, sock, "availability")
	if r.code != exitUnavailable || !strings.Contains(r.stdout, "NVIDIA L40S") ||
		!strings.Contains(r.stderr, "gpuherd: warning: gpu-2 did not answer: not heard of since this agent started") ||
		!strings.Contains(r.stderr, "partial availability: 1 server(s) did not answer (gpu-2); their GPUs are not counted") {
		t.Errorf("availability lacking gpu-2: %s; want the table, a warning naming gpu-2 and exit 5", r)
	}
	r = gpuherd(t, sock, "availability", "-o", "json")
	var av api.Availability
	if err := json.Unmarshal([]byte(r.stdout), &av); err != nil || !reflect.DeepEqual(av, f.avail) || r.code != exitUnavailable {
		t.Errorf("availability -o json: %s (%v); want the partial answer and exit 5", r, err)
	}
	r = gpuherd(t, sock, "members")
	if r.code != exitUnavailable || !strings.Contains(r.stdout, "unknown") ||
		!strings.Contains(r.stderr, "partial member list: 1 server(s) did not answer (gpu-2)") {
		t.Errorf("members with gpu-2 unknown: %s; want gpu-2 listed unknown, a warning and exit 5", r)
	}
	f.avail.Partial, f.avail.Unanswered = false, nil
	f.members = f.members[:1]
	for _, args := range [][]string{{"availability"}, {"members"}, {"availability", "-o", "json"}} {
		if r := gpuherd(t, sock, args...); r.code != exitOK || r.stderr != "" {
			t.Errorf("%s, complete: %s; want exit 0, nothing on stderr", strings.Join(args, " "), r)
		}
	}
}

// TestCLIStatusShowsStorageFailures: a failing store is a warning line of
// status, with the store, since when, the cause and what to do, and the
// "storage" list in JSON.
func TestCLIStatusShowsStorageFailures(t *testing.T) {
	t.Parallel()
	since := time.Date(2026, 12, 4, 19, 0, 0, 0, time.UTC)
	f := &fakeAgent{status: api.Status{Node: "gpu-1", Version: "test", GPUs: []api.GPU{},
		Storage: []api.StorageProblem{{Store: "registry_log", Op: "append", Error: "write names-log/1.seg: no space left on device",
			Cause: "no space left on device", Since: since, Action: "free space on the data directory's file system"}}}}
	sock := serveFake(t, f)
	r := gpuherd(t, sock, "status")
	want := "warning: storage registry_log failing since 2026-12-04T19:00:00Z (append: no space left on device): free space on the data directory's file system"
	if r.code != exitOK || !strings.Contains(r.stdout, want) {
		t.Errorf("status with the registry log failing: %s; want the line %q", r, want)
	}
	r = gpuherd(t, sock, "status", "-o", "json")
	var st api.Status
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || !reflect.DeepEqual(st.Storage, f.status.Storage) {
		t.Errorf("status -o json: %s (%v); want the storage problem", r, err)
	}
	f.status.Storage = nil
	if r := gpuherd(t, sock, "status"); strings.Contains(r.stdout, "storage") {
		t.Errorf("status with every store writing: %s; want no storage line", r)
	}
}

// TestCLIJSONVocabulary: every command's JSON uses one vocabulary:
// pci_address (never address) and PCI IDs as hex strings.
func TestCLIJSONVocabulary(t *testing.T) {
	t.Parallel()
	sock := startAgent(t)
	ok(t, sock, "claim", "vm-1", "--gpu", "H100 80GB:2")
	for _, args := range [][]string{{"status"}, {"get", "vm-1"}, {"claims"}, {"availability"}, {"members"},
		{"inventory", "--simulate", "mixed"}, {"release", "vm-1"}} {
		out := ok(t, sock, append(args, "-o", "json")...)
		var v any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("%s -o json: %v", strings.Join(args, " "), err)
		}
		walkJSON(v, "", func(path, key string, val any) {
			if key == "address" {
				t.Errorf("%s -o json: %s is named address; want pci_address", strings.Join(args, " "), path)
			}
			switch key {
			case "vendor", "device", "vendor_id", "device_id", "subsystem_vendor", "subsystem_device",
				"subsystem_vendor_id", "subsystem_device_id", "class":
				if s, isStr := val.(string); !isStr || strings.ToLower(s) != s || len(s)%2 != 0 {
					t.Errorf("%s -o json: %s = %v; want a lower-case hex string", strings.Join(args, " "), path, val)
				}
			}
		})
	}
	rel := okJSON[api.Claim](t, sock, "claim", "vm-2", "--gpu", "H100 80GB")
	if rel = okJSON[api.Claim](t, sock, "release", "vm-2"); rel.State != api.StateReleased {
		t.Errorf("release -o json state = %q, want released", rel.State)
	}
}

func walkJSON(v any, path string, visit func(path, key string, val any)) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			visit(path+"."+k, k, e)
			walkJSON(e, path+"."+k, visit)
		}
	case []any:
		for _, e := range x {
			walkJSON(e, path+"[]", visit)
		}
	}
}

// TestCLIOutputFormats: -o yaml carries what -o json does, under the same
// names; -o wide adds columns to the table.
func TestCLIOutputFormats(t *testing.T) {
	t.Parallel()
	sock := startAgent(t)
	ok(t, sock, "claim", "vm-1", "--gpu", "H100 80GB:2", "--label", "tenant=t-1")
	for _, args := range [][]string{{"status"}, {"get", "vm-1"}, {"claims"}, {"availability"}, {"members"}} {
		var fromJSON, fromYAML any
		if err := json.Unmarshal([]byte(ok(t, sock, append(args, "-o", "json")...)), &fromJSON); err != nil {
			t.Fatal(err)
		}
		y := ok(t, sock, append(args, "-o", "yaml")...)
		if err := yaml.Unmarshal([]byte(y), &fromYAML); err != nil {
			t.Fatalf("%s -o yaml: %v\n%s", strings.Join(args, " "), err, y)
		}
		// YAML reads numbers as int, JSON as float64, and times as strings
		// in both: compare through JSON.
		b, _ := json.Marshal(fromYAML)
		var back any
		_ = json.Unmarshal(b, &back)
		if !reflect.DeepEqual(back, fromJSON) {
			t.Errorf("%s: -o yaml\n%s\ndiffers from -o json", strings.Join(args, " "), y)
		}
	}
	for _, tc := range []struct {
		args []string
		col  string
	}{
		{[]string{"status"}, "UUID"}, {[]string{"claims"}, "PCI ADDRESSES"}, {[]string{"members"}, "ADDRESS"},
		{[]string{"availability"}, "HEALTHY"}, {[]string{"get", "vm-1"}, "Labels: tenant=t-1"},
	} {
		narrow, wide := ok(t, sock, tc.args...), ok(t, sock, append(tc.args, "-o", "wide")...)
		if strings.Contains(narrow, tc.col) || !strings.Contains(wide, tc.col) {
			t.Errorf("%s -o wide does not add %q:\n%s", strings.Join(tc.args, " "), tc.col, wide)
		}
	}
	r := gpuherd(t, sock, "get", "vm-9", "-o", "yaml")
	var eb struct {
		Error struct{ Code, Message string }
	}
	if err := yaml.Unmarshal([]byte(r.stderr), &eb); err != nil || r.code != exitNotFound || eb.Error.Code != api.CodeNotFound {
		t.Errorf("get vm-9 -o yaml: %s; want exit 4 and error.code not_found in YAML on stderr", r)
	}
}

// TestCLICompletion: the shell completes claim IDs, models, servers and
// PCI addresses from the agent, and gets nothing, at once, without one.
func TestCLICompletion(t *testing.T) {
	t.Parallel()
	sock := startAgent(t)
	ok(t, sock, "claim", "vm-1", "--gpu", "H100 80GB")
	complete := func(sock string, args ...string) []string {
		r := gpuherd(t, sock, append([]string{"__complete"}, args...)...)
		if r.code != exitOK {
			t.Fatalf("__complete %q: %s", args, r)
		}
		return strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"get", ""}, "vm-1"},
		{[]string{"release", "vm"}, "vm-1"},
		{[]string{"resize", ""}, "vm-1"},
		{[]string{"claim", "vm-2", "--gpu", "NVIDIA L"}, "NVIDIA L40S"},
		{[]string{"claim", "vm-2", "--prefer-node", ""}, "test"},
		{[]string{"drain", "0000:18"}, "0000:18:00.0"},
	} {
		got := complete(sock, tc.args...)
		if !slicesContains(got, tc.want) || got[len(got)-1] != ":4" {
			t.Errorf("complete %q = %q, want %q and no file names (:4)", tc.args, got, tc.want)
		}
	}
	if got := complete(sock, "get", "zz"); len(got) != 1 {
		t.Errorf("complete get zz = %q, want nothing", got)
	}
	start := time.Now()
	got := complete(filepath.Join(shortTempDir(t), "missing.sock"), "get", "")
	if took := time.Since(start); len(got) != 1 || got[0] != ":5" || took > time.Second {
		t.Errorf("complete without an agent = %q after %s; want only :5 (error, no files), at once", got, took)
	}
}

func slicesContains(s []string, v string) bool {
	for _, e := range s {
		if e == v || strings.HasPrefix(e, v+"\t") {
			return true
		}
	}
	return false
}
