package agent

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/names"
)

// namedAgents starts agents on profiles (named a, b, c, ...) that share
// one name registry, and waits until each sees all of them.
func namedAgents(t *testing.T, adjust func(*Config), profiles ...string) (*testCluster, *testNames, []*Agent) {
	t.Helper()
	tc := newTestCluster(t)
	n := tc.names
	tc.adjust = adjust
	var agents []*Agent
	for i, p := range profiles {
		agents = append(agents, tc.start(string(rune('a'+i)), p))
	}
	tc.converge("membership", func(x *Agent) bool { return len(x.targets()) == len(profiles) })
	return tc, n, agents
}

// ledgersFree counts the free GPUs of model in the agents' own ledgers
// (gossip may lag).
func ledgersFree(agents []*Agent, model string) int {
	free := 0
	for _, x := range agents {
		free += x.ledger.Totals(x.clk.Now())[model].Free
	}
	return free
}

// modelNamed returns the catalog name of the model whose name holds part.
func modelNamed(t *testing.T, a *Agent, part string) string {
	t.Helper()
	av, err := a.Availability(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range av.Models {
		if strings.Contains(m.Model, part) {
			return m.Model
		}
	}
	t.Fatalf("no model %q in the catalog", part)
	return ""
}

func nodeServers(g api.Group) []string {
	var out []string
	for _, c := range g.Claims {
		out = append(out, c.ID+"@"+c.Node)
	}
	return out
}

// Issue 11, point 5: the group record lived on the agent that created it.
// With that agent down the group must still be readable and deletable
// through another agent, and its name must not be creatable a second time
// under another request; once deleted, the name is free again.
func TestGroupOutlivesItsCreator(t *testing.T) {
	tc, _, ag := namedAgents(t, nil, "dgx-h100", "l40s-4", "l40s-4")
	a, b, c := ag[0], ag[1], ag[2]
	ctx := context.Background()
	l40s := []api.Item{{Model: "L40S", Count: 1}}
	g, err := a.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 2, GPUs: l40s})
	if err != nil || len(g.Claims) != 2 {
		t.Fatalf("create: %+v, %v", g, err)
	}
	tc.stop("a")
	tc.peers.Kill("a")

	got, err := b.GetGroup(ctx, "pool")
	if err != nil || !slices.Equal(nodeServers(got), nodeServers(g)) || got.Coordinator != "a" || !got.WithGPUs || got.Nodes != 2 {
		t.Fatalf("group through b while its creator is down: %+v, %v; want %v", got, err, nodeServers(g))
	}
	if _, err := c.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 3, GPUs: l40s}); apiErr(t, err).Code != api.CodeConflict {
		t.Fatalf("a second create of pool with another request: %v, want conflict", err)
	}
	// The same request again is a retry: the same group, nothing placed.
	again, err := c.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 2, GPUs: l40s})
	if err != nil || !slices.Equal(nodeServers(again), nodeServers(g)) {
		t.Fatalf("the same create again: %+v, %v; want the group %v", again, err, nodeServers(g))
	}
	if _, err := b.DeleteGroupClaims(ctx, "pool"); err != nil {
		t.Fatalf("delete through b while the creator is down: %v", err)
	}
	waitFor(t, "every L40S free", 10*time.Second, func() bool { return freeOf(b, "NVIDIA L40S") == 8 && freeOf(c, "NVIDIA L40S") == 8 })
	if g, err := c.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 3, GPUs: l40s}); err != nil || len(g.Claims) != 3 {
		t.Fatalf("pool created again after its delete: %+v, %v", g, err)
	}
}

// Issue 11, point 5: create is all or nothing, and the alternatives are
// for the whole group: three nodes of RTX:2 with four RTX free offer
// RTX:1 (four nodes' worth), never L40S:2 (two nodes' worth).
func TestGroupCreateAllOrNothingWithGroupAlternatives(t *testing.T) {
	_, n, ag := namedAgents(t, nil, "rtx6000pro-2", "l40s-4", "rtx6000pro-2")
	a := ag[0]
	ctx := context.Background()
	rtx := modelNamed(t, a, "RTX")
	_, err := a.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 3, GPUs: []api.Item{{Model: rtx, Count: 2}}})
	e := apiErr(t, err)
	if e.Code != api.CodeNotAvailable || !strings.Contains(e.Message, "The following GPUs are not available") {
		t.Fatalf("three nodes of RTX:2 with two servers of two: %+v", e)
	}
	var offered []string
	for _, alt := range e.Alternatives {
		offered = append(offered, api.DescribeItems(alt.GPUs))
	}
	if !slices.Contains(offered, api.DescribeItems([]api.Item{{Model: rtx, Count: 1}})) {
		t.Errorf("alternatives %v lack %s:1, which every node can get", offered, rtx)
	}
	for _, o := range offered {
		if strings.Contains(o, "L40S") {
			t.Errorf("alternative %s offered: only two nodes could get it", o)
		}
	}
	if f := ledgersFree(ag, rtx); f != 4 {
		t.Errorf("%d %s free after the refused group, want 4", f, rtx)
	}
	if _, err := n.Lookup(ctx, names.Group("pool"), names.Linearizable); !errors.Is(err, names.ErrNotFound) {
		t.Fatalf("the refused group's name: %v, want free", err)
	}
	if g, err := a.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 3, GPUs: []api.Item{{Model: rtx, Count: 1}}}); err != nil || len(g.Claims) != 3 {
		t.Fatalf("the alternative: %+v, %v", g, err)
	}
}

// Issue 11, point 5: a node claim released directly made its group
// unreadable and undeletable, and its name "already exists" for ever.
// It now shows as missing; repair places it again, and delete frees the
// name. Both with the registry and with a record file.
func TestGroupNodeReleasedDirectly(t *testing.T) {
	t.Run("registry", func(t *testing.T) {
		_, _, ag := namedAgents(t, nil, "l40s-4", "l40s-4")
		testNodeReleasedDirectly(t, ag[0], ag[1])
	})
	t.Run("file", func(t *testing.T) {
		_, a, b, _ := threeAgents(t, 0, "l40s-4", "l40s-4", "dgx-h100")
		testNodeReleasedDirectly(t, a, b)
	})
}

func testNodeReleasedDirectly(t *testing.T, a, b *Agent) {
	ctx := context.Background()
	two := []api.Item{{Model: "L40S", Count: 2}}
	if _, err := a.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 2, GPUs: two}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Release(ctx, "pool.node-1"); err != nil {
		t.Fatal(err)
	}
	g, err := b.GetGroup(ctx, "pool")
	if err != nil || len(g.Claims) != 1 || !slices.Equal(g.Missing, []string{"pool.node-1"}) || !api.SameItems(g.GPUs, []api.Item{{Model: "NVIDIA L40S", Count: 2}}) {
		t.Fatalf("group with a node released: %+v, %v", g, err)
	}
	g, err = b.RepairGroup(ctx, "pool")
	if err != nil || len(g.Claims) != 2 || len(g.Missing) != 0 {
		t.Fatalf("repair: %+v, %v", g, err)
	}
	if _, err := a.Release(ctx, "pool.node-0"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DeleteGroupClaims(ctx, "pool"); err != nil {
		t.Fatalf("delete with a node released: %v", err)
	}
	if _, err := a.GetGroup(ctx, "pool"); apiErr(t, err).Code != api.CodeNotFound ||
		!strings.Contains(err.Error(), "group pool not found") || !strings.Contains(err.Error(), "gpuherd group create pool --nodes N") {
		t.Fatalf("deleted group: %v, want not found, saying how to make one", err)
	}
	if g, err := b.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 1, GPUs: two}); err != nil || len(g.Claims) != 1 {
		t.Fatalf("the name again: %+v, %v", g, err)
	}
}

// claimsOf maps a group's node claims by ID.
func claimsOf(g api.Group) map[string]api.Claim {
	out := map[string]api.Claim{}
	for _, c := range g.Claims {
		out[c.ID] = c
	}
	return out
}

// sameNodes fails the test unless every node claim of after is the one of
// before: same server, same GPUs, never committed again.
func sameNodes(t *testing.T, before, after api.Group) {
	t.Helper()
	b, a := claimsOf(before), claimsOf(after)
	if len(a) != len(b) || len(after.Missing) != len(before.Missing) {
		t.Fatalf("nodes before %v, after %v (missing %v)", nodeServers(before), nodeServers(after), after.Missing)
	}
	for id, c := range b {
		n := a[id]
		if n.Node != c.Node || !reflect.DeepEqual(n.GPUs, c.GPUs) || !n.CommittedAt.Equal(c.CommittedAt) {
			t.Errorf("%s was %s %v committed %s, is %s %v committed %s", id, c.Node, c.GPUs, c.CommittedAt, n.Node, n.GPUs, n.CommittedAt)
		}
	}
}

// Issue 11, point 5: a group resize that cannot complete moved node-0 and
// left node-1 where it was. It now changes no node: every node can have
// the new GPUs at once or none is touched, and the alternatives are for
// the whole group.
func TestGroupResizeThatCannotCompleteChangesNothing(t *testing.T) {
	_, _, ag := namedAgents(t, nil, "l40s-4", "a100-pcie-4")
	a := ag[0]
	ctx := context.Background()
	if _, err := a.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 2, GPUs: []api.Item{{Model: "L40S", Count: 1}}}); err != nil {
		t.Fatal(err)
	}
	before, err := a.GetGroup(ctx, "pool")
	if err != nil {
		t.Fatal(err)
	}
	// Four A100 hold one node of A100:3, not two.
	_, err = a.ResizeGroup(ctx, "pool", api.ResizeRequest{GPUs: []api.Item{{Model: "A100 80GB", Count: 3}}})
	e := apiErr(t, err)
	if e.Code != api.CodeNotAvailable || !strings.Contains(e.Message, "The following GPUs are not available") {
		t.Fatalf("resize to A100:3 for two nodes: %+v", e)
	}
	var offered []string
	for _, alt := range e.Alternatives {
		offered = append(offered, api.DescribeItems(alt.GPUs))
	}
	if !slices.Contains(offered, api.DescribeItems([]api.Item{{Model: "NVIDIA A100 80GB", Count: 2}})) || slices.Contains(offered, api.DescribeItems([]api.Item{{Model: "NVIDIA L40S", Count: 3}})) {
		t.Errorf("alternatives %v: want 2 × A100 (both nodes), not 3 × L40S (one node)", offered)
	}
	after, err := a.GetGroup(ctx, "pool")
	if err != nil {
		t.Fatal(err)
	}
	sameNodes(t, before, after)
	if f := ledgersFree(ag, "NVIDIA A100 80GB"); f != 4 {
		t.Errorf("%d A100 free after the refused resize, want 4", f)
	}
}

// A resize that passes the group-wide check but fails on a node all the
// same (here a GPU that will not bind) puts back every node already
// changed and says that every node is as it was.
func TestGroupResizePutsBackNodesWhenOneFails(t *testing.T) {
	_, _, ag := namedAgents(t, func(c *Config) { c.BindTimeout = Duration(time.Second) }, "a100-pcie-4", "a100-pcie-4")
	a := ag[0]
	ctx := context.Background()
	if _, err := a.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 2, GPUs: []api.Item{{Model: "A100 80GB", Count: 3}}}); err != nil {
		t.Fatal(err)
	}
	before, err := a.GetGroup(ctx, "pool")
	if err != nil {
		t.Fatal(err)
	}
	c0, c1 := claimsOf(before)["pool.node-0"], claimsOf(before)["pool.node-1"]
	if c0.Node == c1.Node {
		t.Fatalf("both nodes on %s", c0.Node)
	}
	// The one free GPU of node-1's server hangs when it leaves nvidia for
	// vfio-pci: node-0 grows in place, node-1 cannot.
	second := map[string]*Agent{"a": ag[0], "b": ag[1]}[c1.Node]
	st, err := second.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var held string
	for _, g := range st.GPUs {
		if g.State == api.StateFree {
			held = g.PCIAddress
		}
	}
	if err := second.sim.Kernel.Hold(held); err != nil {
		t.Fatal(err)
	}
	defer func() {
		second.sim.Kernel.Unhold(held)
		if err := second.host.WaitUnstuck(ctx, held); err != nil {
			t.Error(err)
		}
	}()
	_, err = a.ResizeGroup(ctx, "pool", api.ResizeRequest{GPUs: []api.Item{{Model: "A100 80GB", Count: 4}}})
	if err == nil || !strings.Contains(err.Error(), "every node is as it was") || !strings.Contains(err.Error(), "pool.node-1") {
		t.Fatalf("resize with node-1's GPU stuck: %v", err)
	}
	after, err := a.GetGroup(ctx, "pool")
	if err != nil {
		t.Fatal(err)
	}
	for id, c := range claimsOf(before) {
		n := claimsOf(after)[id]
		if n.Node != c.Node || !api.SameItems(n.Items, c.Items) {
			t.Errorf("%s was %s on %s, is %s on %s", id, api.DescribeItems(c.Items), c.Node, api.DescribeItems(n.Items), n.Node)
		}
	}
}

// While the registry cannot answer, group operations say so (a retryable
// unavailable naming it) and place nothing.
func TestGroupWhileTheRegistryIsDown(t *testing.T) {
	_, n, ag := namedAgents(t, nil, "l40s-4", "l40s-4")
	a := ag[0]
	ctx := context.Background()
	l40s := []api.Item{{Model: "L40S", Count: 1}}
	if _, err := a.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 2, GPUs: l40s}); err != nil {
		t.Fatal(err)
	}
	n.SetDown(true)
	for what, call := range map[string]func() error{
		"get":    func() error { _, err := a.GetGroup(ctx, "pool"); return err },
		"delete": func() error { _, err := a.DeleteGroupClaims(ctx, "pool"); return err },
		"resize": func() error { _, err := a.ResizeGroup(ctx, "pool", api.ResizeRequest{GPUs: l40s}); return err },
		"create": func() error {
			_, err := a.CreateGroup(ctx, "other", api.GroupRequest{Nodes: 1, GPUs: l40s})
			return err
		},
	} {
		if e := apiErr(t, call()); e.Code != api.CodeUnavailable || !strings.Contains(e.Message, "registry") {
			t.Errorf("%s while the registry is down: %+v", what, e)
		}
	}
	n.SetDown(false)
	if free := ledgersFree(ag, "NVIDIA L40S"); free != 6 {
		t.Errorf("%d L40S free, want 6 (the group's two nodes only)", free)
	}
	if g, err := a.GetGroup(ctx, "pool"); err != nil || len(g.Claims) != 2 {
		t.Fatalf("the group after: %+v, %v", g, err)
	}
}

// After a resize the group's record names the new GPUs per node: with
// every node released directly, get still says what they had, and repair
// places them with those GPUs, not the ones the group was created with.
func TestGroupRecordFollowsResize(t *testing.T) {
	_, _, ag := namedAgents(t, nil, "l40s-4", "a100-pcie-4")
	a, b := ag[0], ag[1]
	ctx := context.Background()
	if _, err := a.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 2, GPUs: []api.Item{{Model: "L40S", Count: 1}}}); err != nil {
		t.Fatal(err)
	}
	a100 := []api.Item{{Model: "NVIDIA A100 80GB", Count: 1}}
	if g, err := b.ResizeGroup(ctx, "pool", api.ResizeRequest{GPUs: a100}); err != nil || !api.SameItems(g.GPUs, a100) {
		t.Fatalf("resize: %+v, %v", g, err)
	}
	for _, id := range []string{"pool.node-0", "pool.node-1"} {
		if _, err := a.Release(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	g, err := b.GetGroup(ctx, "pool")
	if err != nil || len(g.Missing) != 2 || !api.SameItems(g.GPUs, a100) {
		t.Fatalf("every node released: %+v, %v; want both missing, %v per node", g, err, a100)
	}
	g, err = a.RepairGroup(ctx, "pool")
	if err != nil || len(g.Claims) != 2 {
		t.Fatalf("repair: %+v, %v", g, err)
	}
	for _, c := range g.Claims {
		if c.Node != "b" || !api.SameItems(c.Items, a100) {
			t.Errorf("repaired %s: %s on %s, want %v on b", c.ID, api.DescribeItems(c.Items), c.Node, a100)
		}
	}
}

// A create whose check passes but whose last node fails all the same (a
// GPU that will not bind) releases the nodes it placed and the group's
// name, and answers not available.
func TestGroupCreateReleasesPlacedNodesWhenOneFails(t *testing.T) {
	_, n, ag := namedAgents(t, func(c *Config) { c.BindTimeout = Duration(time.Second) }, "a100-pcie-4", "a100-pcie-4")
	a, b := ag[0], ag[1]
	ctx := context.Background()
	st, err := b.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := st.GPUs[0].PCIAddress
	if err := b.sim.Kernel.Hold(held); err != nil {
		t.Fatal(err)
	}
	defer func() {
		b.sim.Kernel.Unhold(held)
		if err := b.host.WaitUnstuck(ctx, held); err != nil {
			t.Error(err)
		}
	}()
	// By the view two nodes of A100:4 fit, one on each server; b's held
	// GPU is fenced when bound, so only one node can be placed.
	_, err = a.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 2, GPUs: []api.Item{{Model: "A100 80GB", Count: 4}}})
	if e := apiErr(t, err); e.Code != api.CodeNotAvailable || !strings.Contains(e.Message, "group pool") || !strings.Contains(e.Message, "nothing was kept") {
		t.Fatalf("two nodes with one GPU fenced: %+v", e)
	}
	// The nodes were placed, not refused up front: the held GPU was tried.
	if g := gpuStatus(t, b, held); g.State != api.StateUnhealthy {
		t.Fatalf("held GPU %+v, want fenced by the placement", g)
	}
	for _, x := range ag {
		if cs, _ := x.List(ctx); len(cs) != 0 {
			t.Errorf("%s keeps %+v", x.cfg.NodeName, cs)
		}
	}
	if _, err := n.Lookup(ctx, names.Group("pool"), names.Linearizable); !errors.Is(err, names.ErrNotFound) {
		t.Fatalf("the failed group's name: %v, want free", err)
	}
}
