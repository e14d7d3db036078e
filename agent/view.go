package agent

import (
	"context"
	"slices"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/claim"
	"github.com/gpuherd/gpuherd/agent/home"
	"github.com/gpuherd/gpuherd/agent/owner"
)

// targets is this agent's view of the servers: itself, exactly, from its
// ledger, and the peers from gossip.
func (a *Agent) targets() []claim.Target {
	out := []claim.Target{a.selfTarget()}
	if a.cluster != nil {
		out = append(out, a.cluster.peers()...)
	}
	return out
}

// selfTarget is this server as a coordinator ranks it: exactly, from its
// ledger.
func (a *Agent) selfTarget() claim.Target {
	caps := a.ledger.Totals(a.clk.Now())
	free := make(map[string]int, len(caps))
	for m, c := range caps {
		free[m] = c.Free
	}
	return claim.NewTarget(a.cfg.NodeName, true, a, free, a.ServerDrained(), caps)
}

// peers is the view as the owner tells and asks it: the same servers, in
// the same order, as targets, without their capacity (the owner's notices
// look for a claim ID's home on every batch).
func (a *Agent) peers() []owner.Peer {
	out := []owner.Peer{{Name: a.cfg.NodeName, Owner: a}}
	if c := a.cluster; c != nil {
		ms := c.g.Members()
		out = slices.Grow(out, len(ms))
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, m := range ms {
			if askable(m) {
				out = append(out, owner.Peer{Name: m.Name, Owner: c.clientLocked(m.Name, m.Summary.PeerAddr)})
			}
		}
	}
	return out
}

// gossipMembership is the cluster's membership as the owner follows it.
type gossipMembership struct{ c *clusterState }

func (m gossipMembership) Subscribe() (<-chan struct{}, func()) { return m.c.g.SubscribeMembers() }

func (m gossipMembership) Usable() []home.Member {
	var usable []home.Member
	for _, mb := range m.c.g.Members() {
		if mb.Usable() {
			usable = append(usable, home.Member{Name: mb.Name, Boot: mb.Summary.Boot})
		}
	}
	return usable
}

// namesFor is the agent's name authority as a role reads it, when it reads
// it: nil while there is none (alone, or before the cluster started).
func namesFor[T any](a *Agent) func() T {
	return func() T {
		var none T
		if a.names == nil {
			return none
		}
		return a.names.(T)
	}
}

// ownerServer is the agent as its owner reads it (owner.Server).
type ownerServer struct{ a *Agent }

// Cluster is the membership the owner follows; nil while this server runs
// alone.
func (s ownerServer) Cluster() owner.Cluster {
	if s.a.cluster == nil {
		return nil
	}
	return gossipMembership{s.a.cluster}
}

func (s ownerServer) Peers() []owner.Peer { return s.a.peers() }
func (s ownerServer) Drained() bool       { return s.a.ServerDrained() }
func (s ownerServer) Changed()            { s.a.changed() }

// agentView is the agent's view of the servers as the coordinator reads it.
type agentView struct{ a *Agent }

func (v agentView) Targets() []claim.Target { return v.a.targets() }
func (v agentView) Self() claim.Target      { return v.a.selfTarget() }
func (v agentView) Clustered() bool         { return v.a.cluster != nil }
func (v agentView) Joined() bool            { return v.a.cluster != nil && v.a.cluster.joined.Load() }

func (v agentView) Suspects() []claim.Target {
	if v.a.cluster == nil {
		return nil
	}
	return v.a.cluster.suspects()
}

func (v agentView) Unasked(asked []string) []string {
	if v.a.cluster == nil {
		return nil
	}
	return v.a.cluster.unasked(asked)
}

func (v agentView) Refresh(name string, summary []byte) {
	c := v.a.cluster
	switch {
	case c == nil:
	case len(summary) > 0:
		// The owner's own figures, as of its answer: nothing newer to
		// fetch. When the view does not take them it holds as new ones
		// already, or gossip knows better (a restart behind the name).
		c.g.Learn(name, summary)
	default:
		c.g.Refresh(name) // an agent that sends no summary
	}
}

func (v agentView) RankAvoidedLast(ranked []string) []string { return v.a.rankAvoidedLast(ranked) }

func (v agentView) Members(ctx context.Context) ([]api.Member, error) { return v.a.Members(ctx) }

// MemberStates is the gossip view in one line, for logs.
func (v agentView) MemberStates() string {
	if v.a.cluster == nil {
		return ""
	}
	var parts []string
	for _, m := range v.a.cluster.g.Members() {
		p := m.Name + "=" + m.State
		if m.SummaryErr != nil {
			p += "(summary unusable: " + m.SummaryErr.Error() + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " ")
}

// agentRegistry is the registry this agent runs, as the coordinator reads
// it.
type agentRegistry struct{ a *Agent }

func (r agentRegistry) AwaitFounding(ctx context.Context) { r.a.registry.AwaitFounding(ctx) }
func (r agentRegistry) Leaderless() bool                  { return r.a.registry.Leaderless() }
