package agent

import (
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/home"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/owner"
	"github.com/gpuherd/gpuherd/agent/placement"
)

// target is a server a coordinator may ask: this agent or a peer.
type target struct {
	name   string
	self   bool
	owner  api.Owner
	server placement.Server
	caps   map[string]ledger.ModelTotals
}

// targets is this agent's view of the servers: itself, exactly, from its
// ledger, and the peers from gossip.
func (a *Agent) targets() []target {
	now := a.clk.Now()
	caps := a.ledger.Totals(now)
	free := make(map[string]int, len(caps))
	for m, c := range caps {
		free[m] = c.Free
	}
	self := target{
		name:   a.cfg.NodeName,
		self:   true,
		owner:  a,
		server: placement.Server{Name: a.cfg.NodeName, Free: free, Drained: a.serverDrained()},
		caps:   caps,
	}
	out := []target{self}
	if a.cluster != nil {
		out = append(out, a.cluster.peers()...)
	}
	return out
}

func targetNamed(targets []target, name string) (target, bool) {
	for _, t := range targets {
		if t.name == name {
			return t, true
		}
	}
	return target{}, false
}

// targetName is t's node name, by which home.Of chooses an ID's home.
func targetName(t target) string { return t.name }

// peers is the view as the owner tells and asks it: the same servers, in
// the same order, as targets.
func (a *Agent) peers() []owner.Peer {
	ts := a.targets()
	out := make([]owner.Peer, len(ts))
	for i, t := range ts {
		out[i] = owner.Peer{Name: t.name, Owner: t.owner}
	}
	return out
}

// ownerNames is the name authority now, as the owner uses it; nil while
// there is none.
func (a *Agent) ownerNames() owner.Names {
	if a.names == nil {
		return nil
	}
	return a.names
}

// ownerCluster is the membership the owner follows; nil while this server
// runs alone.
func (a *Agent) ownerCluster() owner.Cluster {
	if a.cluster == nil {
		return nil
	}
	return gossipMembership{a.cluster}
}

// gossipMembership is the cluster's membership as the owner follows it.
type gossipMembership struct{ c *clusterState }

func (m gossipMembership) Subscribe() (<-chan struct{}, func()) { return m.c.g.Subscribe() }

func (m gossipMembership) Usable() []home.Member {
	var usable []home.Member
	for _, mb := range m.c.g.Members() {
		if mb.Usable() {
			usable = append(usable, home.Member{Name: mb.Name, Boot: mb.Summary.Boot})
		}
	}
	return usable
}
