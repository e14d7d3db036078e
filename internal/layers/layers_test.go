// Package layers checks the import direction of docs/design.md, "Layers":
// a package imports only packages of lower layers, so that an arrow back up
// fails `make lint` (and `make test`) instead of growing into a cycle.
package layers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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
	{"internal/atomicfile", "agent/events"},  // durable whole-file writes; the protocol's event vocabulary
	{"agent/api"},                            // wire types and the HTTP layer
	{"vfio"},                                 // hardware: sysfs
	{"vfio/fakekernel"},                      // hardware: the simulated kernel
	{"agent/inventory", "agent/sim"},         // hardware: what this server has, or simulates
	{"agent/placement"},                      // state: choosing and ranking
	{"agent/ledger"},                         // state: the owner's claims
	{"gossip/gossiptest", "agent/claimtest"}, // the in-memory networks for tests
	{"gossip", "agent/pki", "metrics", "systemd", "logging"}, // cluster view, certificates, exposition, init
	{"agent/handoff", "agent/dra"},                           // a claim as a hypervisor or Kubernetes takes it; the libvirt hook, the DRA driver
	{"agent/names"},                                          // cluster: the name registry (raft)
	{"agent"},                                                // the protocol and the wiring
	{"cmd/gpuherd"},                                          // the binary
	{"agent/internal/testdisk", "agent/internal/testmain", "agent/internal/dst", "packaging", "internal/layers", "internal/testport"}, // tests and their helpers
}

// protocolFiles are the files of package agent that hold the claim
// protocol (its roles: coordinator, attempt, owner, home); they speak in
// error codes and Recorder events, never in HTTP statuses or metrics.
var protocolFiles = []string{
	"attempt.go", "coordinator.go", "directory.go", "errors.go", "home.go",
	"lookup.go", "notices.go", "owner.go", "owner_readiness.go", "recorder.go", "request.go", "view.go",
}

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

func TestProtocolKnowsNoHTTPOrMetrics(t *testing.T) {
	fset := token.NewFileSet()
	for _, name := range protocolFiles {
		f, err := parser.ParseFile(fset, filepath.Join("..", "..", "agent", name), nil, parser.ImportsOnly)
		if err != nil {
			t.Fatalf("%v (a protocol file moved? update protocolFiles)", err)
		}
		for _, imp := range f.Imports {
			path := strings.Trim(imp.Path.Value, `"`)
			if slices.Contains(protocolForbids, path) {
				t.Errorf("agent/%s imports %s: the protocol names error codes and Recorder events; HTTP statuses belong to agent/api, metrics to the wiring", name, path)
			}
		}
	}
}
