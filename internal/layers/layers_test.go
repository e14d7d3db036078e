// Package layers checks the import direction of docs/design.md, "Layers":
// a package imports only packages of lower layers, so that an arrow back up
// fails `make lint` (and `make test`) instead of growing into a cycle.
package layers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/gpuherd/gpuherd"

// layers lists the module's packages from the bottom up; a package may
// import only packages of an earlier entry. Several packages on one line
// may not import each other. A new package must be placed here.
var layers = [][]string{
	{"internal/atomicfile", "internal/datasync", "internal/clock", "internal/keyedlock", "agent/events"}, // durable whole-file writes and appends; the clock seam; locks by key; the protocol's event vocabulary
	{"agent/api/peerwire"},                   // the peer API's calls framed on one mutual-TLS connection
	{"agent/api"},                            // wire types and the HTTP layer
	{"vfio"},                                 // hardware: sysfs
	{"vfio/fakekernel"},                      // hardware: the simulated kernel
	{"agent/inventory", "agent/sim"},         // hardware: what this server has, or simulates
	{"agent/placement"},                      // state: choosing and ranking
	{"agent/ledger"},                         // state: the owner's claims
	{"agent/host"},                           // the GPUs, their drivers and their users
	{"agent/status", "agent/drain"},          // the GPUs as the status API shows them; GPU and server drains
	{"agent/telemetry"},                      // NVML's readings and XID errors
	{"gossip/gossiptest", "agent/claimtest"}, // the in-memory networks for tests
	{"gossip", "agent/pki", "metrics", "systemd", "logging"}, // cluster view, certificates, exposition, init
	{"agent/dra/manifest"},         // the DRA driver's manifests, no Kubernetes package
	{"agent/handoff", "agent/dra"}, // a claim as a hypervisor or Kubernetes takes it; the libvirt hook, the DRA driver
	{"agent/names"},                // cluster: the name registry (raft)
	{"agent/registry"},             // cluster: the name registry run on this agent over gossip
	{"agent/home"},                 // the protocol: the home role, the claim directory's records
	{"agent/owner"},                // the protocol: the owner role, this server's claims
	{"agent/claim"},                // the protocol: the coordinator role, placing claims
	{"agent/groups"},               // the node groups, over the coordinator
	{"agent"},                      // the protocol and the wiring
	{"cmd/internal/cli"},           // what the binaries share: logger, configuration, usage errors, man pages
	{"cmd/gpuherd", "cmd/gpuherd-kubelet-plugin"}, // the binaries: the agent and its client; the DRA driver
	{"agent/host/hosttest"},                       // a host on a simulated machine, for the roles' tests and the simulation
	{"agent/internal/testdisk", "agent/internal/testmain", "agent/internal/dst", "packaging", "internal/layers", "internal/testport", "internal/srcconst"}, // tests and their helpers
}

// rolePackages are the packages of the claim protocol's roles
// (docs/design.md): every file of one is a protocol file, which speaks in
// error codes and Recorder events, never in HTTP statuses or metrics.
var rolePackages = []string{"agent/host", "agent/home", "agent/owner", "agent/claim", "agent/groups"}

// clockPackages are the packages whose code reads time only through
// internal/clock, so that tests and the simulation can drive it: agent,
// the name registry it runs, the status of its GPUs, the drains, NVML's
// readings, and every role package.
var clockPackages = append([]string{"agent", "agent/registry", "agent/status", "agent/drain", "agent/telemetry"}, rolePackages...)

// timeClockFuncs are the time package's functions that read or wait on the
// system clock.
var timeClockFuncs = []string{"Now", "Since", "Until", "After", "AfterFunc", "NewTimer", "NewTicker", "Tick", "Sleep"}

var protocolForbids = []string{"net/http", module + "/metrics"}

type pkg struct {
	ImportPath string
	Imports    []string
}

// rankOf maps a package, relative to the module, to its layer.
func rankOf() map[string]int {
	r := map[string]int{}
	for i, l := range layers {
		for _, p := range l {
			r[p] = i
		}
	}
	return r
}

// backArrows returns every import of pkgs that does not go down a layer,
// and every package that no layer holds.
func backArrows(pkgs []pkg, rank map[string]int) []string {
	var bad []string
	for _, p := range pkgs {
		from := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		rf, ok := rank[from]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s is in no layer: add it to layers in internal/layers and to docs/design.md", from))
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			to := strings.TrimPrefix(imp, module+"/")
			rt, ok := rank[to]
			if ok && rt < rf {
				continue
			}
			bad = append(bad, fmt.Sprintf("%s imports %s: an arrow back up the layers of docs/design.md", from, to))
		}
	}
	return bad
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-e", "-json=ImportPath,Imports", module+"/...").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v: %s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages; is the test running inside the module?", len(pkgs))
	}
	return pkgs
}

func TestImportsGoDownTheLayers(t *testing.T) {
	for _, b := range backArrows(listPackages(t), rankOf()) {
		t.Error(b)
	}
}

// The check itself: an arrow back up, a sideways arrow inside one layer
// and a package in no layer are each reported.
func TestBackArrowIsReported(t *testing.T) {
	rank := rankOf()
	for _, tc := range []struct {
		pkgs []pkg
		want string
	}{
		{[]pkg{{module + "/vfio", []string{module + "/agent"}}}, "vfio imports agent"},
		{[]pkg{{module + "/vfio", []string{module + "/vfio/fakekernel"}}}, "vfio imports vfio/fakekernel"},
		{[]pkg{{module + "/metrics", []string{module + "/gossip"}}}, "metrics imports gossip"},
		{[]pkg{{module + "/newthing", nil}}, "newthing is in no layer"},
	} {
		bad := backArrows(tc.pkgs, rank)
		if len(bad) != 1 || !strings.HasPrefix(bad[0], tc.want) {
			t.Errorf("backArrows(%v) = %q, want one report starting %q", tc.pkgs, bad, tc.want)
		}
	}
	if bad := backArrows([]pkg{{module + "/agent", []string{module + "/vfio", "net/http"}}}, rank); len(bad) != 0 {
		t.Errorf("a downward arrow was reported: %q", bad)
	}
}

// sources parses the non-test Go files of the module's package dir.
func sources(t *testing.T, fset *token.FileSet, dir string) map[string]*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join("..", "..", dir, "*.go"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	files := map[string]*ast.File{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Join(dir, filepath.Base(name))] = f
	}
	return files
}

// forbiddenImports lists the imports of f that protocol code may not have.
func forbiddenImports(f *ast.File) []string {
	var bad []string
	for _, imp := range f.Imports {
		if path := strings.Trim(imp.Path.Value, `"`); slices.Contains(protocolForbids, path) {
			bad = append(bad, path)
		}
	}
	return bad
}

// clockReads lists the calls (and references) in f of the time package's
// clock functions, as "time.Now at line N".
func clockReads(fset *token.FileSet, f *ast.File) []string {
	local := ""
	for _, imp := range f.Imports {
		if strings.Trim(imp.Path.Value, `"`) != "time" {
			continue
		}
		local = "time"
		if imp.Name != nil {
			local = imp.Name.Name
		}
	}
	if local == "" || local == "_" {
		return nil
	}
	var bad []string
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); ok && id.Name == local && slices.Contains(timeClockFuncs, sel.Sel.Name) {
			bad = append(bad, fmt.Sprintf("time.%s at line %d", sel.Sel.Name, fset.Position(sel.Pos()).Line))
		}
		return true
	})
	return bad
}

func TestProtocolKnowsNoHTTPOrMetrics(t *testing.T) {
	fset := token.NewFileSet()
	found := 0
	for _, dir := range rolePackages {
		for name, f := range sources(t, fset, dir) {
			found++
			for _, path := range forbiddenImports(f) {
				t.Errorf("%s imports %s: the protocol names error codes and Recorder events; HTTP statuses belong to agent/api, metrics to the wiring", name, path)
			}
		}
	}
	if found < 8 {
		t.Fatalf("only %d protocol files found in %v; did the roles move?", found, rolePackages)
	}
}

func TestProtocolReadsTimeThroughTheClock(t *testing.T) {
	fset := token.NewFileSet()
	for _, dir := range clockPackages {
		for name, f := range sources(t, fset, dir) {
			for _, read := range clockReads(fset, f) {
				t.Errorf("%s: %s: read time and wait through the agent's clock (internal/clock), so that tests and the simulation can drive it", name, read)
			}
		}
	}
}

// The checks themselves find what they look for.
func TestProtocolChecksReport(t *testing.T) {
	const src = `package agent

import (
	"net/http"
	tm "time"
)

func Reserve() { _ = tm.Now(); f := tm.After; _ = f; _ = http.StatusOK; _ = tm.Second }
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "owner.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := forbiddenImports(f); !slices.Equal(got, []string{"net/http"}) {
		t.Errorf("forbidden imports %q, want net/http", got)
	}
	if got := clockReads(fset, f); len(got) != 2 || !strings.HasPrefix(got[0], "time.Now") || !strings.HasPrefix(got[1], "time.After") {
		t.Errorf("clock reads %q, want time.Now and time.After (not time.Second)", got)
	}
}
