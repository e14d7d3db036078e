package main

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The gpuherd binary links no Kubernetes package. Go runs the
// initialisation of every package a binary links, in every process: with
// client-go, its API types and their scheme registrations linked in (for
// the kubelet plugin, which is gpuherd-kubelet-plugin now), a lone agent's
// resident memory was 65 MiB instead of 30 (docs/design.md, "The kubelet
// plugin's own binary"). The manifests gpuherd prints for Kubernetes are
// agent/dra/manifest's plain structs.
func TestBinaryLinksNoKubernetes(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command in PATH to list the binary's packages")
	}
	cmd := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", ".")
	// What the tests were built from, from the module cache alone.
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off", "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v: %s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	kube := func(p string) bool { return strings.HasPrefix(p, "k8s.io/") || strings.HasPrefix(p, "sigs.k8s.io/") }
	var pkgs, linked, arrows []string
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		pkgs = append(pkgs, f[0])
		if kube(f[0]) {
			linked = append(linked, f[0])
			continue
		}
		for _, imp := range f[1:] {
			if kube(imp) {
				arrows = append(arrows, f[0]+" imports "+imp)
			}
		}
	}
	if !slices.Contains(pkgs, "github.com/gpuherd/gpuherd/agent") {
		t.Fatalf("go list did not list the binary's packages:\n%s", out)
	}
	if len(linked) > 0 {
		t.Errorf("gpuherd links %d Kubernetes packages, through:\n  %s\nKubernetes code belongs in gpuherd-kubelet-plugin (agent/dra), manifests in agent/dra/manifest",
			len(linked), strings.Join(arrows, "\n  "))
	}
}
