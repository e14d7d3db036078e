package agent

import (
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
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
