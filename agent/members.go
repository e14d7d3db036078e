package agent

import (
	"cmp"
	"context"
	"maps"
	"slices"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/gossip"
)

var _ api.CapacityReader = (*Agent)(nil)

// Availability lists every model of the platform — the offered ones and
// every model some server has — with what is free, as this agent sees it:
// its own ledger exactly, the other servers through gossip.
func (a *Agent) Availability(context.Context) (api.Availability, error) {
	targets := a.targets()
	by := map[string]*api.ModelAvailability{}
	get := func(m string) *api.ModelAvailability {
		if by[m] == nil {
			by[m] = &api.ModelAvailability{Model: m}
		}
		return by[m]
	}
	for _, m := range a.cfg.OfferedModels {
		get(m)
	}
	for _, t := range targets {
		for m, c := range t.Caps() {
			v := get(m)
			v.Total += c.Total
			v.Healthy += c.Healthy
			v.Unusable += c.Unusable
			if t.Drained() {
				continue // a cordoned server offers nothing
			}
			v.Free += c.Free
			v.MaxFreeOnOneServer = max(v.MaxFreeOnOneServer, c.Free)
		}
	}
	out := api.Availability{Node: a.cfg.NodeName, Servers: len(targets), Models: []api.ModelAvailability{}}
	for _, v := range by {
		v.Available = v.Free > 0
		out.Models = append(out.Models, *v)
	}
	slices.SortFunc(out.Models, func(x, y api.ModelAvailability) int { return cmp.Compare(x.Model, y.Model) })
	out.Unanswered = a.capacityGaps()
	out.Partial = len(out.Unanswered) > 0
	return out, nil
}

// capacityGaps are the servers whose capacity an aggregate of this
// agent's view lacks: before gossip joined, every other; then those whose
// summary cannot be read, those gossip holds suspect (not counted, though a
// claim asks them last), and those this agent has seen before that its
// gossip does not list now (knownmembers.go). A dead or departed server's
// GPUs are not available: it does not make the aggregate partial.
func (a *Agent) capacityGaps() []api.Unanswered {
	c := a.cluster
	if c == nil {
		return nil
	}
	var out []api.Unanswered
	if !c.joined.Load() {
		out = append(out, api.Unanswered{Node: api.NotJoinedNode, Reason: "gossip has not joined the cluster yet: no seed has answered"})
	}
	for _, m := range c.g.Members() {
		switch {
		case m.Self:
		case m.SummaryErr != nil && (m.State == gossip.StateAlive || m.State == gossip.StateSuspect):
			out = append(out, api.Unanswered{Node: m.Name, Reason: "its gossip summary cannot be read: " + m.SummaryErr.Error()})
		case m.State == gossip.StateSuspect:
			out = append(out, api.Unanswered{Node: m.Name, Reason: "gossip holds it suspect (its probes go unanswered): its GPUs are not counted; a claim asks it last"})
		}
	}
	for _, n := range c.unseenKnown() {
		out = append(out, api.Unanswered{Node: n, Reason: api.UnseenReason})
	}
	slices.SortFunc(out, func(x, y api.Unanswered) int { return cmp.Compare(x.Node, y.Node) })
	return out
}

// Members lists the servers of the platform with their state and free
// capacity; alone, just this one.
func (a *Agent) Members(context.Context) ([]api.Member, error) {
	out := []api.Member{a.self()}
	if a.cluster == nil {
		return out, nil
	}
	for _, m := range a.cluster.g.Members() {
		if m.Self {
			out[0].Addr, out[0].State = m.Addr, m.State
			continue
		}
		out = append(out, memberView(m))
	}
	// The servers this agent has seen before and its gossip does not list
	// now: a list without them would look complete.
	for _, n := range a.cluster.unseenKnown() {
		out = append(out, api.Member{Name: n, State: api.MemberUnknown, Models: []api.ModelAvailability{}})
	}
	slices.SortFunc(out, func(x, y api.Member) int { return cmp.Compare(x.Name, y.Name) })
	return out, nil
}

// memberView is another server as the members list shows it. A summary
// that did not decode says nothing: its error goes in SummaryError and no
// field of it is shown as if it were data.
func memberView(m gossip.Member) api.Member {
	v := api.Member{Name: m.Name, Addr: m.Addr, State: m.State, Models: []api.ModelAvailability{}}
	if m.SummaryErr != nil {
		v.SummaryError = m.SummaryErr.Error()
		return v
	}
	v.Drained, v.AgentVersion = m.Summary.Drained, m.Summary.AgentVersion
	v.NamesRole, v.NamesLeader = m.Summary.Names.Role, m.Summary.Names.Leader
	for _, mc := range m.Summary.Models {
		v.Models = append(v.Models, modelAvail(mc.Model, ledger.ModelTotals{Total: int(mc.Total), Free: int(mc.Free), Healthy: int(mc.Healthy), Unusable: int(mc.Unusable)}))
	}
	return v
}

// self is this server as a member.
func (a *Agent) self() api.Member {
	m := api.Member{Name: a.cfg.NodeName, State: "alive", Self: true, Drained: a.ServerDrained(),
		AgentVersion: Version, Models: []api.ModelAvailability{}}
	if rs := a.registry; rs != nil {
		info := rs.Info()
		m.NamesRole, m.NamesLeader = info.Role, info.Leader
	}
	totals := a.ledger.Totals(a.clk.Now())
	for _, name := range slices.Sorted(maps.Keys(totals)) {
		m.Models = append(m.Models, modelAvail(name, totals[name]))
	}
	return m
}

func modelAvail(model string, t ledger.ModelTotals) api.ModelAvailability {
	return api.ModelAvailability{Model: model, Available: t.Free > 0, Free: t.Free, Total: t.Total,
		Healthy: t.Healthy, Unusable: t.Unusable, MaxFreeOnOneServer: t.Free}
}
