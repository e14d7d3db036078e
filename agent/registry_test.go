package agent

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/registry"
)

// registryOf is the registry an agent runs; it fails the test when none.
func registryOf(t testing.TB, a *Agent) *names.Registry {
	t.Helper()
	if a.registry == nil {
		t.Fatalf("%s runs no name registry", a.cfg.NodeName)
	}
	return a.registry.Names()
}

// waitRegistry waits until every agent of agents sees one leader among
// them, those of them that want lists are voters that know the registry's
// ID, and the leader's configuration has len(want) voters (dead ones
// count); it returns the leader's name.
func waitRegistry(t testing.TB, agents []*Agent, want []string, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		leader, ok := "", true
		for _, a := range agents {
			st := registryOf(t, a).Status()
			switch {
			case st.Leader == "" || (leader != "" && st.Leader != leader):
				ok = false
			case slices.Contains(want, a.cfg.NodeName) && (st.Role != names.StatusVoter || st.Registry == ""):
				ok = false
			default:
				leader = st.Leader
			}
		}
		if l := byName(agents, leader); ok && l != nil && len(registryOf(t, l).Voters()) == len(want) {
			return leader
		}
		if time.Now().After(deadline) {
			var states []string
			for _, a := range agents {
				st := registryOf(t, a).Status()
				states = append(states, a.cfg.NodeName+": "+st.Role+" leader="+st.Leader+" voters="+strings.Join(st.Voters, ",")+" registry="+st.Registry)
			}
			t.Fatalf("no registry with voters %v and one leader within %s:\n%s", want, within, strings.Join(states, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// acquire takes a claim name through an agent's own registry handle, as
// the claim path does, retrying while the registry elects a leader.
func acquire(t testing.TB, a *Agent, id string) names.Grant {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		g, err := a.names.Acquire(ctx, names.Claim(id), a.cfg.NodeName, "", "digest-"+id, nil)
		if err == nil {
			return g
		}
		if !names.IsUnavailable(err) || ctx.Err() != nil {
			t.Fatalf("acquire %s through %s: %v", id, a.cfg.NodeName, err)
		}
	}
}

func others(agents []*Agent, not string) []*Agent {
	return slices.DeleteFunc(slices.Clone(agents), func(a *Agent) bool { return a.cfg.NodeName == not })
}

func byName(agents []*Agent, name string) *Agent {
	for _, a := range agents {
		if a.cfg.NodeName == name {
			return a
		}
	}
	return nil
}

// TestIntegrationRegistryFormsByItself: three agents with an existing
// cluster configuration (no names_* key) on loopback, raft over mutual
// TLS: the registry founds itself and grows to three voters; a fourth
// agent stays standby and founds nothing; names are acquired through the
// standby and through a follower (forwarded over the peer API); when the
// leader dies without handing over, the two others elect a leader that
// still knows the names, and once the dead voter is removed the standby
// replaces it.
func TestIntegrationRegistryFormsByItself(t *testing.T) {
	tc := newSocketCluster(t)
	tc.adjust = func(c *Config) { c.DirectorySettle = Duration(100 * time.Millisecond) }
	start := time.Now()
	agents := []*Agent{tc.start("gpu-a", "l40s-4"), tc.start("gpu-b", "l40s-4"), tc.start("gpu-c", "l40s-4")}
	for _, a := range agents {
		if a.cfg.NamesAddr != "" || len(a.cfg.NamesVoters) != 0 {
			t.Fatal("the test must run without names_* keys")
		}
	}
	all := []string{"gpu-a", "gpu-b", "gpu-c"}
	leader := waitRegistry(t, agents, all, 20*time.Second)
	t.Logf("registry of 3 voters, leader %s, %s after the first agent started", leader, time.Since(start).Round(time.Millisecond))
	ids := map[string]bool{}
	for _, a := range agents {
		st := registryOf(t, a).Status()
		if st.Role != names.StatusVoter {
			t.Errorf("%s is %s, want voter", a.cfg.NodeName, st.Role)
		}
		ids[st.Registry] = true
	}
	if len(ids) != 1 || ids[""] {
		t.Errorf("registry IDs %v, want one", ids)
	}

	// A fourth agent joins a cluster that has its registry: it founds
	// none and stays standby (three voters are enough), and names acquired
	// through it go to the leader.
	d := tc.start("gpu-d", "l40s-4")
	g := acquire(t, d, "vm-1")
	if g.Record.Caller != "gpu-d" || g.Record.Token == 0 {
		t.Fatalf("grant through the standby: %+v", g.Record)
	}
	// The leader times its raft log's appends where an operator looks.
	appends := map[string]string{"store": storeRegistryLog, "op": "append"}
	if n, ok := sample(t, byName(agents, leader).metrics.Registry(), "gpuherd_storage_write_duration_seconds", appends); !ok || n == 0 {
		t.Errorf("the leader's gpuherd_storage_write_duration_seconds{store=registry_log,op=append} counts %v appends (%v), want some", n, ok)
	}
	time.Sleep(3 * registry.Tick) // time to found a registry, if it would
	if st := registryOf(t, d).Status(); st.Role != names.StatusStandby || st.HasState || d.registry.Registries() != 1 {
		t.Fatalf("gpu-d after joining: %+v, registries seen %d; want a standby of the one registry", st, d.registry.Registries())
	}
	via := others(agents, leader)[0]
	if g2 := acquire(t, via, "vm-1b"); g2.Record.Caller != via.cfg.NodeName {
		t.Fatalf("grant through a follower: %+v", g2.Record)
	}

	// Kill the leader's raft without a hand-over, then the agent.
	dead := byName(agents, leader)
	if err := registryOf(t, dead).Raft().Shutdown().Error(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	tc.stop(leader)
	// A request to an agent that is gone certainly never reached it: the
	// registry may send a write elsewhere without doubt.
	for _, to := range []string{leader, "gpu-never-seen"} {
		if _, err := d.registry.Forward(context.Background(), to, names.Request{Op: names.OpPing}); !errors.Is(err, names.ErrNotDelivered) {
			t.Errorf("forward to %s: %v, want ErrNotDelivered", to, err)
		}
	}
	rest := others(agents, leader)
	next := waitRegistry(t, rest, all, 20*time.Second)
	if next == leader {
		t.Fatalf("%s still leads after it died", leader)
	}
	t.Logf("new leader %s %s after the old one died", next, time.Since(killed).Round(time.Millisecond))
	for _, a := range rest {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rec, err := a.names.Lookup(ctx, names.Claim("vm-1"), names.Linearizable)
		cancel()
		if err != nil || rec.Token != g.Record.Token {
			t.Errorf("lookup through %s after the leader died: %+v, %v", a.cfg.NodeName, rec, err)
		}
	}
	// The same request again is the same grant; another is a conflict.
	if again := acquire(t, rest[1], "vm-2"); again.Record.Token == 0 {
		t.Errorf("no new name after the election: %+v", again)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rest[0].names.Acquire(ctx, names.Claim("vm-1"), rest[0].cfg.NodeName, "", "another-request", nil); !errors.Is(err, names.ErrConflict) {
		t.Errorf("vm-1 for another request after the election: %v, want a conflict", err)
	}
	// An operator removes the dead voter (members remove), through an
	// agent that does not lead: the leader replaces it with the standby.
	follower := others(rest, next)[0]
	if was, err := follower.registry.RemoveVoter(ctx, leader); err != nil || !was {
		t.Fatalf("removing voter %s through %s: %v", leader, follower.cfg.NodeName, err)
	}
	waitRegistry(t, append(rest, d), []string{rest[0].cfg.NodeName, rest[1].cfg.NodeName, "gpu-d"}, 10*time.Second)
}

// TestIntegrationRegistryExplicitVoters: with names_voters the listed
// agents bootstrap with exactly that list and the others are clients that
// run no raft and forward; a client's acquire is made as itself, whatever
// it claims to be.
func TestIntegrationRegistryExplicitVoters(t *testing.T) {
	tc := newSocketCluster(t)
	voters := []string{"gpu-a", "gpu-b", "gpu-c"}
	tc.adjust = func(c *Config) { c.NamesVoters = voters }
	agents := []*Agent{tc.start("gpu-a", "l40s-4"), tc.start("gpu-b", "l40s-4"), tc.start("gpu-c", "l40s-4"), tc.start("gpu-d", "l40s-4")}
	leader := waitRegistry(t, agents[:3], voters, 20*time.Second)
	client := agents[3]
	reg := registryOf(t, client)
	if st := reg.Status(); st.Role != names.StatusClient || reg.Raft() != nil {
		t.Fatalf("gpu-d: %+v, want a client without raft", st)
	}
	if client.lns.names != nil {
		t.Error("a client bound a raft listener")
	}
	if got := registryOf(t, byName(agents, leader)).Voters(); len(got) != 3 {
		t.Errorf("voters %+v", got)
	}
	g := acquire(t, client, "vm-d")
	if g.Record.Caller != "gpu-d" {
		t.Errorf("grant %+v", g.Record)
	}
	// A client that names another node as the caller still acquires as
	// itself: the peer route takes the caller from its certificate.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g2, err := client.names.Acquire(ctx, names.Claim("vm-e"), "gpu-a", "", "digest-e", nil)
	if err != nil || g2.Record.Caller != "gpu-d" {
		t.Errorf("acquire as gpu-a through gpu-d: %+v, %v; want caller gpu-d", g2.Record, err)
	}
	// Nor can it release a name held by another as that node.
	if _, err := client.names.Release(ctx, names.Claim("vm-e"), 0, "gpu-a"); err != nil {
		t.Fatalf("release as itself: %v", err)
	}
	ga := acquire(t, byName(agents, "gpu-b"), "vm-b")
	if _, err := client.names.Release(ctx, names.Claim("vm-b"), 0, "gpu-b"); !errors.Is(err, names.ErrConflict) {
		t.Errorf("gpu-d released gpu-b's pending name (token %d): %v, want a conflict", ga.Record.Token, err)
	}
}

// waitGauge waits until the agent's unlabelled gauge name reads want.
func waitGauge(t testing.TB, a *Agent, name string, want float64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		v, ok := namesGauge(t, a, name, "")
		if ok && v == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s on %s: %v (exported: %v) after %s; want %v", name, a.cfg.NodeName, v, ok, within, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// namesGauge reads one sample of the agent's metrics: the series of name whose
// labels include label (k=v, or "" for any).
func namesGauge(t testing.TB, a *Agent, name, label string) (float64, bool) {
	t.Helper()
	mfs, err := a.metrics.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if label == l.GetName()+"="+l.GetValue() {
					return m.GetGauge().GetValue(), true
				}
			}
			if label == "" {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// TestIntegrationRegistrySplitIsReported: two agents that never met each
// found a registry; when they meet, each logs the split and exports two
// registries, and each keeps its own (a restart keeps its state and ID).
func TestIntegrationRegistrySplitIsReported(t *testing.T) {
	tc := newSocketCluster(t)
	tc.adjust = func(c *Config) {
		c.DirectorySettle = Duration(100 * time.Millisecond)
		c.NamesBootstrapExpect = 1
	}
	a := tc.start("gpu-a", "l40s-4")
	seedA := tc.seed
	tc.seed = "" // gpu-b starts an island of its own
	b := tc.start("gpu-b", "l40s-4")
	waitRegistry(t, []*Agent{a}, []string{"gpu-a"}, 20*time.Second)
	waitRegistry(t, []*Agent{b}, []string{"gpu-b"}, 20*time.Second)
	idB := registryOf(t, b).ID()
	// The count comes from the agent's periodic look at gossip, which may
	// not have run since its registry elected itself.
	waitGauge(t, a, "gpuherd_names_registries", 1, 10*time.Second)
	if v, ok := namesGauge(t, a, "gpuherd_names_leader", ""); !ok || v != 1 {
		t.Errorf("gpuherd_names_leader on a lone leader: %v, %v", v, ok)
	}
	if v, ok := namesGauge(t, a, "gpuherd_names_role", "role=voter"); !ok || v != 1 {
		t.Errorf("gpuherd_names_role{role=voter}: %v, %v", v, ok)
	}

	tc.stop("gpu-b")
	b = tc.startWith("gpu-b", "l40s-4", func(c *Config) { c.Join = []string{seedA} })
	if got := registryOf(t, b).ID(); got != idB {
		t.Fatalf("gpu-b restarted in registry %q, want its own %q", got, idB)
	}
	waitGauge(t, a, "gpuherd_names_registries", 2, 15*time.Second)
	waitGauge(t, b, "gpuherd_names_registries", 2, 15*time.Second)
	if registryOf(t, a).ID() == registryOf(t, b).ID() {
		t.Error("the two registries share an ID")
	}
}
