package handoff

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

// fakeAgent answers UseClaim like the owner does for a server where claim
// vm-a holds 0000:18:00.0 and its audio function 0000:18:00.1.
type fakeAgent struct {
	used []string // claim IDs UseClaim was asked for
}

func (a *fakeAgent) UseClaim(_ context.Context, id string, req api.UseRequest) (api.Claim, error) {
	a.used = append(a.used, id)
	if id == "vm-a" {
		return api.Claim{ID: id}, nil
	}
	return api.Claim{}, &api.Error{Code: api.CodeNotClaimed, PCIAddresses: req.PCIAddresses, HeldBy: []string{"vm-a"},
		Message: api.NotClaimedMessage(id, req.PCIAddresses) + " (claim " + id + " is not held on gpu-17; they are held by claim vm-a: …)"}
}

func (a *fakeAgent) EndUse(context.Context, string, string, bool) (api.UseEnd, error) {
	return api.UseEnd{}, nil
}

type allManaged struct{}

func (allManaged) Managed(string) bool { return true }

func runHook(t *testing.T, a Agent, name string, xml []byte) error {
	t.Helper()
	h := &Hook{Agent: a, Devices: allManaged{}, Log: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)), Socket: "/run/gpuherd/gpuherd.sock"}
	return h.Run(context.Background(), []string{name, "prepare", "begin", "-"}, bytes.NewReader(xml))
}

// Every equivalent shape of the metadata starts the domain on the claim it
// names, whatever the domain's name.
func TestHookReadsEveryShapeOfMetadata(t *testing.T) {
	for _, file := range metadataFiles(t, "same-*.xml") {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			a := &fakeAgent{}
			if err := runHook(t, a, "guest-1", data); err != nil {
				t.Fatalf("refused: %v", err)
			}
			if len(a.used) != 1 || a.used[0] != "vm-a" {
				t.Fatalf("the hook asked for claims %v, want vm-a (the metadata's id)", a.used)
			}
		})
	}
}

// A domain that passes managed GPUs without gpuherd metadata is refused
// with what is missing and the commands that add it, naming the claim
// that holds its GPUs.
func TestHookRefusalNamesMissingMetadata(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "metadata", "not-other-namespace.xml"))
	if err != nil {
		t.Fatal(err)
	}
	err = runHook(t, &fakeAgent{}, "guest-1", data)
	if err == nil {
		t.Fatal("a domain without gpuherd metadata on another claim's GPUs started")
	}
	msg := err.Error()
	for _, want := range []string{
		"The following GPUs are not claimed by guest-1: 0000:18:00.0, 0000:18:00.1",
		"domain guest-1 passes this server's GPUs 0000:18:00.0, 0000:18:00.1 without gpuherd metadata",
		`virsh metadata guest-1 --config --uri ` + Namespace + ` --key gpuherd --set '<claim id="vm-a"/>'`,
		"`gpuherd get vm-a -o libvirt`",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("refusal is not one line: %q", msg)
	}
}

func TestHookRefusalNamesMissingMetadataOfBadName(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "metadata", "not-nested.xml"))
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAgent{}
	err = runHook(t, a, "my vm", bytes.Replace(data, []byte("<name>guest-1</name>"), []byte("<name>my vm</name>"), 1))
	if err == nil || len(a.used) != 0 {
		t.Fatalf("hook = %v, asked for %v; want a refusal without asking the agent", err, a.used)
	}
	for _, want := range []string{`not claimed by "my vm"`, "the domain's name is not a claim ID",
		`virsh metadata 'my vm' --config --uri ` + Namespace + ` --key gpuherd --set '<claim id="CLAIM"/>'`,
		"CLAIM is the ID the VM's GPUs were claimed under"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal lacks %q:\n%s", want, err)
		}
	}
}

func TestHookRefusesTwoClaimElements(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "metadata", "dup-two-prefixes.xml"))
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAgent{}
	err = runHook(t, a, "guest-1", data)
	if err == nil || !strings.HasPrefix(err.Error(), "domain guest-1 has 2 gpuherd claim elements") || len(a.used) != 0 {
		t.Fatalf("hook = %v, asked for %v; want the duplicate refused before any claim is asked", err, a.used)
	}
}

func TestHookRefusalOfADomainWithoutUUID(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "metadata", "same-prefix-on-element.xml"))
	if err != nil {
		t.Fatal(err)
	}
	noUUID := bytes.Replace(data, []byte("<uuid>0d7c5b52-7a1e-4d4b-9a55-3c1f0e6b2a11</uuid>"), nil, 1)
	a := &fakeAgent{}
	err = runHook(t, a, "guest-1", noUUID)
	if err == nil || !strings.HasPrefix(err.Error(), "domain guest-1 has no <uuid>") || !strings.Contains(err.Error(), "virsh define") || len(a.used) != 0 {
		t.Fatalf("hook = %v (asked for %v); want a refusal saying how to give it one", err, a.used)
	}
}
