package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/groups"
	"github.com/gpuherd/gpuherd/agent/home"
	"github.com/gpuherd/gpuherd/agent/ledger"
)

// A VM stopped and started again (release, then claim of the same ID with
// no server named) goes back to the server it ran on, even when best fit
// would pick another; when that server is full, the answer is "not
// available" naming it, and nothing is placed; with any_node it goes
// elsewhere and the answer says so.
func TestClusterClaimGoesBackToTheServerItLastRanOn(t *testing.T) {
	_, a, b, c := threeAgents(t, 0, "dgx-h100", "dgx-h100", "dgx-h100")
	ctx := context.Background()
	one := api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}}
	id := "vm-restart"

	cl, err := a.Claim(ctx, id, api.ClaimRequest{GPUs: one.GPUs, PreferNode: "c"})
	if err != nil || cl.Node != "c" {
		t.Fatalf("first start: %+v, %v; want on c", cl, err)
	}
	// Best fit now prefers a and b: they have fewer GPUs free than c.
	for _, x := range []*Agent{a, b} {
		for _, other := range []string{"other-1", "other-2"} {
			oid := other + "-" + x.cfg.NodeName
			if got, err := x.Claim(ctx, oid, api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}, PreferNode: x.cfg.NodeName}); err != nil || got.Node != x.cfg.NodeName {
				t.Fatalf("claim %s: %+v, %v", oid, got, err)
			}
		}
	}
	if _, err := b.Release(ctx, id); err != nil {
		t.Fatalf("stop: %v", err)
	}
	home := home.Of(id, a.targets(), targetName).Name()
	homeAgent := map[string]*Agent{"a": a, "b": b, "c": c}[home]
	waitFor(t, "the home to learn where "+id+" was released", 5*time.Second, func() bool {
		return homeAgent.home.LastOwner(id) == "c"
	})
	if r, ok, err := c.ledger.Recall(id, c.clk.Now(), time.Hour); err != nil || !ok || len(r.Items) != 1 || r.Items[0] != (ledger.Item{Model: "NVIDIA H100 80GB", Count: 1}) {
		t.Fatalf("the owner's ledger remembers %+v, %v, %v", r, ok, err)
	}

	for i := range 5 { // ties between a and b are random: try a few times
		cl, err = a.Claim(ctx, id, one)
		if err != nil || cl.Node != "c" || len(cl.Warnings) != 0 {
			t.Fatalf("start %d without a preferred server: %+v, %v; want back on c, no warning", i+2, cl, err)
		}
		if _, err := a.Release(ctx, id); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the home to learn the release", 5*time.Second, func() bool {
			ans, err := homeAgent.LookupDirectory(ctx, id)
			return err == nil && ans.State == api.DirAbsent
		})
	}

	// c fills up meanwhile: the VM does not start elsewhere by itself. The
	// first reservation lands on a or b (best fit by the view), is dropped,
	// and the answer names c.
	if _, err := c.Claim(ctx, "filler", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 8}}, PreferNode: "c"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the view to see c full", 5*time.Second, func() bool { return freeOf(b, "NVIDIA H100 80GB") == 12 })
	_, err = b.Claim(ctx, id, one)
	e := apiErr(t, err)
	want := "The following GPUs are not available: 1x NVIDIA H100 80GB on c, the server claim vm-restart last ran on; claim it with --any-node (any_node) to place it on another server"
	if e.Code != api.CodeNotAvailable || e.Message != want || len(e.Alternatives) != 0 {
		t.Fatalf("start with c full: %s %q %+v, want not_available %q and no alternatives (c has nothing free)", e.Code, e.Message, e.Alternatives, want)
	}
	for _, x := range []*Agent{a, b, c} {
		if got, err := x.ledger.Get(id); err == nil {
			t.Errorf("%s holds %+v after the refused start, want nothing (the reservation dropped)", x.cfg.NodeName, got)
		}
	}
	// With any_node it starts elsewhere, with a warning.
	cl, err = b.Claim(ctx, id, api.ClaimRequest{GPUs: one.GPUs, AnyNode: true})
	if err != nil || cl.Node == "c" {
		t.Fatalf("start with c full and any_node: %+v, %v", cl, err)
	}
	want = "claim vm-restart last ran on c, which cannot hold 1x NVIDIA H100 80GB now; placed on " + cl.Node
	if len(cl.Warnings) != 1 || cl.Warnings[0] != want {
		t.Errorf("warnings = %q, want %q", cl.Warnings, want)
	}
	// A preferred server named by the caller wins over the memory.
	if _, err := a.Release(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, "filler"); err != nil {
		t.Fatal(err)
	}
	cl, err = a.Claim(ctx, id, api.ClaimRequest{GPUs: one.GPUs, PreferNode: "a"})
	if err != nil || cl.Node != "a" || len(cl.Warnings) != 0 {
		t.Fatalf("start with --prefer-node a: %+v, %v", cl, err)
	}
}

// A release through another agent reaches the owner's in-use rule, and a
// forced one carries its force to the owner.
func TestClusterReleaseOfAGPUInUseThroughAnotherAgent(t *testing.T) {
	_, a, b, c := threeAgents(t, 0, "dgx-h100", "dgx-h100", "dgx-h100")
	ctx := context.Background()
	cl, err := a.Claim(ctx, "vm-b", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}, PreferNode: "c"})
	if err != nil || cl.Node != "c" {
		t.Fatalf("claim: %+v, %v", cl, err)
	}
	g := cl.GPUs[0]
	stop, err := c.sim.Kernel.OpenGroup(g.IOMMUGroup, qemu(4242, "vm-b"))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	_, err = a.Release(ctx, "vm-b")
	if e := apiErr(t, err); e.Code != api.CodeInUse || e.HTTPStatus() != 409 || !strings.Contains(e.Message, "pid 4242 (qemu-system-x86, domain vm-b)") {
		t.Fatalf("release through a while the VM runs on c: %+v", e)
	}
	if _, err := b.Release(api.WithForce(ctx), "vm-b"); err != nil {
		t.Fatalf("forced release through b: %v", err)
	}
	if st := gpuStatus(t, c, g.PCIAddress); st.State != api.StateReturning {
		t.Fatalf("on c after the forced release: %+v, want returning", st)
	}
	stop()
	c.host.CheckReturning(ctx)
	if st := gpuStatus(t, c, g.PCIAddress); st.State != api.StateFree || st.Driver != "nvidia" {
		t.Fatalf("on c once the VM let go: %+v, want free on nvidia", st)
	}
}

// A VM that must restart where it ran (its disks are there) gets "not
// available" with what that server can hold when it is full, and is never
// placed elsewhere: by default, and with same_node (a synonym without
// prefer_node). any_node lets it move.
func TestClusterRestartOffersAlternativesInsteadOfMoving(t *testing.T) {
	_, a, b, c := threeAgents(t, 0, "dgx-h100", "dgx-h100", "dgx-h100")
	ctx := context.Background()
	two := []api.Item{{Model: "H100 80GB", Count: 2}}
	if cl, err := a.Claim(ctx, "vm-s", api.ClaimRequest{GPUs: two, PreferNode: "c"}); err != nil || cl.Node != "c" {
		t.Fatalf("first start: %+v, %v", cl, err)
	}
	if _, err := a.Release(ctx, "vm-s"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Claim(ctx, "filler", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 7}}, PreferNode: "c"}); err != nil {
		t.Fatal(err)
	}
	home := map[string]*Agent{"a": a, "b": b, "c": c}[home.Of("vm-s", a.targets(), targetName).Name()]
	waitFor(t, "the home to learn the release", 5*time.Second, func() bool {
		ans, err := home.LookupDirectory(ctx, "vm-s")
		return err == nil && ans.LastOwner == "c"
	})

	for _, req := range []api.ClaimRequest{{GPUs: two}, {GPUs: two, SameNode: true}} {
		_, err := b.Claim(ctx, "vm-s", req)
		e := apiErr(t, err)
		want := "The following GPUs are not available: 2x NVIDIA H100 80GB on c, the server claim vm-s last ran on; claim it with --any-node (any_node) to place it on another server"
		if e.Code != api.CodeNotAvailable || e.Message != want {
			t.Fatalf("claim (same_node %v) with c full: %s %q, want not_available %q", req.SameNode, e.Code, e.Message, want)
		}
		if len(e.Alternatives) != 1 || api.DescribeItems(e.Alternatives[0].GPUs) != "1x NVIDIA H100 80GB" {
			t.Errorf("alternatives = %+v, want what c can hold: 1x NVIDIA H100 80GB", e.Alternatives)
		}
		if _, err := a.Get(ctx, "vm-s"); !api.IsCode(err, api.CodeNotFound) {
			t.Errorf("vm-s after the refused claim: %v, want not found anywhere", err)
		}
	}
	if _, err := b.Claim(ctx, "vm-s", api.ClaimRequest{GPUs: two, SameNode: true, AnyNode: true}); apiErr(t, err).Code != api.CodeInvalid {
		t.Errorf("same_node with any_node: %v, want invalid", err)
	}
	// With any_node it moves, with a warning.
	if cl, err := b.Claim(ctx, "vm-s", api.ClaimRequest{GPUs: two, AnyNode: true}); err != nil || cl.Node == "c" || len(cl.Warnings) != 1 {
		t.Fatalf("claim with any_node: %+v, %v", cl, err)
	}
	if _, err := b.Release(ctx, "vm-s"); err != nil {
		t.Fatal(err)
	}
	// A server named with same_node: stay there, whatever is remembered.
	_, err := a.Claim(ctx, "vm-s", api.ClaimRequest{GPUs: two, PreferNode: "c", SameNode: true})
	if e := apiErr(t, err); e.Code != api.CodeNotAvailable || e.Message != "The following GPUs are not available: 2x NVIDIA H100 80GB on c, where claim vm-s must stay" {
		t.Fatalf("same-node claim on c, full: %s %q", e.Code, e.Message)
	}
	// With room on c again, same_node puts it there.
	if _, err := c.Release(ctx, "filler"); err != nil {
		t.Fatal(err)
	}
	if cl, err := a.Claim(ctx, "vm-s", api.ClaimRequest{GPUs: two, PreferNode: "c", SameNode: true}); err != nil || cl.Node != "c" {
		t.Fatalf("same-node claim with room on c: %+v, %v", cl, err)
	}
}

// A node group created again under an earlier group's name is not pinned
// to the servers the earlier nodes ran on: its claims pass any_node.
func TestClusterGroupIgnoresRememberedNodes(t *testing.T) {
	_, a, b, c := threeAgents(t, 0, "dgx-h100", "dgx-h100", "dgx-h100")
	ctx := context.Background()
	two := []api.Item{{Model: "H100 80GB", Count: 2}}
	id := groups.NodeClaimID("pool", 0)
	if cl, err := a.Claim(ctx, id, api.ClaimRequest{GPUs: two, PreferNode: "c"}); err != nil || cl.Node != "c" {
		t.Fatalf("the earlier group's node: %+v, %v", cl, err)
	}
	if _, err := a.Release(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Claim(ctx, "filler", api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 7}}, PreferNode: "c"}); err != nil {
		t.Fatal(err)
	}
	home := map[string]*Agent{"a": a, "b": b, "c": c}[home.Of(id, a.targets(), targetName).Name()]
	waitFor(t, "the home to learn the release", 5*time.Second, func() bool {
		ans, err := home.LookupDirectory(ctx, id)
		return err == nil && ans.LastOwner == "c"
	})
	if _, err := b.Claim(ctx, id, api.ClaimRequest{GPUs: two}); apiErr(t, err).Code != api.CodeNotAvailable {
		t.Fatalf("a plain claim of %s: %v, want not available (c is full)", id, err)
	}
	g, err := b.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 1, GPUs: two})
	if err != nil || len(g.Claims) != 1 || g.Claims[0].Node == "c" {
		t.Fatalf("group pool again: %+v, %v; want its node on a or b", g, err)
	}
}

// A claim of an ID remembered on a server this agent no longer sees (down,
// cut off, removed) is placed wherever it fits: the VM cannot restart on a
// server that is gone, and "unavailable" would have a retrying client loop
// for a claim that holds nothing anywhere.
func TestClusterRestartWhenTheLastServerIsGone(t *testing.T) {
	_, a, _, _ := threeAgents(t, 0, "dgx-h100", "dgx-h100", "dgx-h100")
	ctx := context.Background()
	req := api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}}
	cl, err := a.ClaimOn(ctx, "vm-gone", req, "gone", true)
	if err != nil {
		t.Fatalf("claim remembered on a server nobody sees: %v; want placed elsewhere", err)
	}
	if cl.Node == "gone" || cl.Node == "" {
		t.Fatalf("placed on %q", cl.Node)
	}
	// Not remembered but named with same_node: the caller asked for that
	// server alone, so the answer stays a retryable unavailable.
	_, err = a.ClaimOn(ctx, "vm-pinned", req, "gone", false)
	if e := apiErr(t, err); e.Code != api.CodeUnavailable || !strings.Contains(e.Message, "gone") {
		t.Fatalf("same_node on an unseen server: %v; want unavailable naming it", err)
	}
}

// Where a released claim ID last ran is kept by the name registry, with
// the release: a claim of it without any_node goes back there without
// asking its home (no directory request on the claim path), even when
// every home has forgotten (their memory is lost with a restart), and the
// owner a claim lands on first sends it back (go_back) instead of
// committing it.
func TestClusterNamedClaimGoesBackWithoutItsHome(t *testing.T) {
	tc, a, b, c := threeAgents(t, 0, "dgx-h100", "dgx-h100", "dgx-h100")
	ctx := context.Background()
	one := api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}}
	id := "vm-home-lost"
	if cl, err := a.Claim(ctx, id, api.ClaimRequest{GPUs: one.GPUs, PreferNode: "c"}); err != nil || cl.Node != "c" {
		t.Fatalf("first start: %+v, %v; want on c", cl, err)
	}
	// Best fit now prefers a and b.
	for _, x := range []*Agent{a, b} {
		oid := "other-" + x.cfg.NodeName
		if _, err := x.Claim(ctx, oid, api.ClaimRequest{GPUs: one.GPUs, PreferNode: x.cfg.NodeName}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Release(ctx, id); err != nil {
		t.Fatal(err)
	}
	for _, x := range []*Agent{a, b, c} {
		x.home.ForgetReleases()
	}
	before := len(tc.peers.Requests("a", "a")) + len(tc.peers.Requests("a", "b")) + len(tc.peers.Requests("a", "c"))
	cl, err := a.Claim(ctx, id, one)
	if err != nil || cl.Node != "c" {
		t.Fatalf("start again: %+v, %v; want back on c", cl, err)
	}
	var sent []string
	for _, to := range []string{"a", "b", "c"} {
		sent = append(sent, tc.peers.Requests("a", to)...)
	}
	for _, r := range sent[before:] {
		if strings.Contains(r, "/directory") {
			t.Errorf("the claim asked the home: %s", r)
		}
	}
	for _, x := range []*Agent{a, b} {
		if got, err := x.ledger.Get(id); err == nil {
			t.Errorf("%s holds %+v; want nothing (a reservation sent back is dropped)", x.cfg.NodeName, got)
		}
	}
}
