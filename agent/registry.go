package agent

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/registry"
	"github.com/gpuherd/gpuherd/gossip"
	"github.com/gpuherd/gpuherd/metrics"
)

// The name registry on this agent is agent/registry; this is what it is
// given of the agent.

// registryTiming is raft's timing in a real cluster; tests shorten it
// (agent's TestMain).
var registryTiming = names.LANTiming

// foundingSettle caps the founder's wait for a steady membership
// (registry.Config.FoundingSettle). A variable: tests of whole clusters on
// loopback shorten it (agent's TestMain).
var foundingSettle = registry.DefaultFoundingSettle

// openRegistry starts the name registry on this agent (start phase
// naming), once gossip runs and before the peer API serves, unless a test
// injected one (WithNames) or the peer API runs in memory (no sockets:
// such tests inject theirs).
func (a *Agent) openRegistry(c *clusterState) error {
	if a.names != nil || a.peerNet != nil {
		return nil
	}
	a.setPhase(phaseNaming)
	cfg := a.cfg
	ln := a.lns.names
	a.lns.names = nil // the registry closes it from now on
	rs, err := registry.Open(registry.Deps{
		Config: registry.Config{Node: cfg.NodeName, Voters: cfg.NamesVoters, Expect: cfg.namesExpect(), RunsRaft: cfg.runsRaft(),
			Dir: cfg.namesDir(), DirectorySettle: time.Duration(cfg.DirectorySettle), FoundingSettle: foundingSettle,
			Timing: registryTiming()},
		Gossip:   membersOnly{c.g},
		Joined:   c.joined.Load,
		Publish:  c.publish,
		Peer:     c.namesPeer,
		TLS:      c.files,
		PeerAddr: c.peerAddr,
		Listener: ln,
		StorageResult: func(part, op string, err error) {
			store := storeRegistryLog
			if part == names.StorageSnapshots {
				store = storeRegistrySnapshots
			}
			a.storageResult(store, op, err)
		},
		StorageTime: func(_, op string, d time.Duration) { a.storage.took(storeRegistryLog, op, d) },
		Clock:       a.clk,
		Log:         a.log,
	})
	if err != nil {
		return err
	}
	a.registry = rs
	a.names = rs.Names()
	c.names.Store(rs)
	rs.Start()
	a.metrics.Registry().MustRegister(newRegistryCollector(rs))
	return nil
}

// newRegistryService builds the registry's calls on the agent's APIs
// (ServeNames, RemoveMember) over what a reads when they come.
func newRegistryService(a *Agent) *registry.Service {
	return registry.NewService(registry.ServiceDeps{
		Node: a.cfg.NodeName,
		Names: func() registry.Authority {
			if a.names == nil {
				return nil
			}
			return a.names
		},
		Registry: func() *registry.Registry { return a.registry },
		Cluster: func() registry.Cluster {
			if a.cluster == nil {
				return nil
			}
			return a.cluster
		},
		Log: a.log,
	})
}

var (
	_ api.NameServer    = (*Agent)(nil)
	_ api.MemberRemover = (*Agent)(nil)
)

// newRegistryCollector exports the registry's state (gpuherd_names_*).
func newRegistryCollector(rs *registry.Registry) prometheus.Collector {
	return metrics.NewNamesCollector(func() (metrics.NamesState, bool) {
		reg := rs.Names()
		if reg == nil {
			return metrics.NamesState{}, false
		}
		st := reg.Status()
		return metrics.NamesState{
			Role:        st.Role,
			Leader:      reg.IsLeader(),
			LastContact: st.LastContact.Seconds(),
			HasContact:  st.LastContact > 0,
			Halted:      st.Halted != "",
			Registries:  rs.Registries(),
		}, true
	})
}

// membersOnly is the gossip view as the name registry follows it: its
// loop wakes on membership changes, not on the capacity changes every
// claim in the cluster makes.
type membersOnly struct{ *gossip.Cluster }

func (m membersOnly) Subscribe() (<-chan struct{}, func()) { return m.SubscribeMembers() }
