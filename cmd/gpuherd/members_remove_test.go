package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

// removingAgent is a fake agent that answers members remove: node "gpu-d"
// is dead and held vm-1 and vm-2; "gpu-b" is alive.
type removingAgent struct {
	fakeAgent
	forced []bool
}

func (f *removingAgent) RemoveMember(_ context.Context, node string, force bool) (api.MemberRemoval, error) {
	f.forced = append(f.forced, force)
	switch {
	case node == "gpu-b" && !force:
		return api.MemberRemoval{}, &api.Error{Code: api.CodeConflict, Message: "gpu-b is alive in gossip: stop it first, or remove it anyway with --force"}
	case node == "gpu-b":
		return api.MemberRemoval{Node: node, State: "alive", Lost: []string{}}, nil
	case node == "gpu-d":
		return api.MemberRemoval{Node: node, State: "dead", Lost: []string{"vm-1", "vm-2"}, Dropped: []string{"vm-3"},
			RegistryServer: true, Warnings: []string{"gpu-d was a server of the name registry"}}, nil
	}
	return api.MemberRemoval{}, &api.Error{Code: api.CodeUnavailable, Message: "name registry unavailable; no answer from gpu-a"}
}

func TestCLIMembersRemove(t *testing.T) {
	t.Parallel()
	f := &removingAgent{}
	sock := serveFake(t, f)

	r := gpuherd(t, sock, "members", "remove", "gpu-d")
	if r.code != exitOK || !strings.Contains(r.stdout, "Removed gpu-d (it was dead in gossip)") ||
		!strings.Contains(r.stdout, "Lost claims (2): vm-1, vm-2") || !strings.Contains(r.stdout, "Placements dropped (1): vm-3") ||
		!strings.Contains(r.stdout, "name registry's servers") || !strings.Contains(r.stderr, "gpuherd: warning: gpu-d was a server") {
		t.Errorf("members remove gpu-d: %s", r)
	}
	r = gpuherd(t, sock, "members", "remove", "gpu-d", "-o", "json")
	var got api.MemberRemoval
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != exitOK || len(got.Lost) != 2 || got.Node != "gpu-d" {
		t.Errorf("members remove -o json: %s (%v)", r, err)
	}

	r = gpuherd(t, sock, "members", "remove", "gpu-b")
	if r.code != exitConflict || !strings.Contains(r.stderr, "--force") {
		t.Errorf("members remove of an alive server: %s; want exit 6 pointing at --force", r)
	}
	r = gpuherd(t, sock, "members", "remove", "gpu-b", "--force")
	if r.code != exitOK || !strings.Contains(r.stdout, "Lost claims (0): -") {
		t.Errorf("members remove --force: %s", r)
	}
	if len(f.forced) != 4 || f.forced[2] || !f.forced[3] {
		t.Errorf("force sent as %v, want only with --force", f.forced)
	}
	if r = gpuherd(t, sock, "members", "remove", "gpu-x"); r.code != exitUnavailable {
		t.Errorf("members remove with the registry down: %s; want exit 5", r)
	}
	if r = gpuherd(t, sock, "members", "remove"); r.code != exitUsage {
		t.Errorf("members remove without a node: %s; want exit 2", r)
	}
}

// lostAgent answers get of a lost claim, and lists claims with a lost one
// and a duplicate copy.
type lostAgent struct{ fakeAgent }

func (f *lostAgent) Get(_ context.Context, id string) (api.Claim, error) {
	return api.Claim{}, &api.Error{Status: http.StatusGone, Code: api.CodeLost,
		Message: "claim " + id + " was held on gpu-d, which was removed from the cluster for good (members remove); its GPUs went with that server. Release it (gpuherd release " + id + ") to free the ID"}
}

func TestCLILostAndDuplicateClaims(t *testing.T) {
	t.Parallel()
	f := &lostAgent{fakeAgent{claims: api.ClaimList{Claims: []api.Claim{
		{ID: "vm-1", Node: "gpu-d", State: api.StateLost, Items: []api.Item{}, GPUs: []api.ClaimGPU{}},
		{ID: "vm-2", Node: "gpu-a", State: api.StateClaimed},
		{ID: "vm-2", Node: "gpu-b", State: api.StateClaimed, Duplicate: true, KeptOn: "gpu-a"},
	}}}}
	sock := serveFake(t, f)
	r := gpuherd(t, sock, "get", "vm-1")
	if r.code != exitNotFound || !strings.Contains(r.stderr, "removed from the cluster") || !strings.Contains(r.stderr, "gpuherd release vm-1") {
		t.Errorf("get of a lost claim: %s; want exit 4 saying what happened", r)
	}
	out := ok(t, sock, "claims")
	for _, want := range []string{"vm-1  gpu-d  lost", "gpu-b  claimed (duplicate; kept on gpu-a)"} {
		if !strings.Contains(out, want) {
			t.Errorf("claims table lacks %q:\n%s", want, out)
		}
	}
}
