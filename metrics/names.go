package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// NamesState is this agent's part in the name registry, as the metrics
// show it.
type NamesState struct {
	// Role is voter, non-voter, standby or client.
	Role   string
	Leader bool
	// LastContact is how long ago a follower last heard from its leader;
	// HasContact is false on the leader, on a client, and before any.
	LastContact float64
	HasContact  bool
	Halted      bool
	// Registries is how many registry IDs this agent's gossip view shows:
	// more than one means two registries in one cluster.
	Registries int
}

// NamesRoles lists every role, so each has a series.
var NamesRoles = []string{"voter", "non-voter", "standby", "client"}

// NamesSource reads the registry's state at each scrape; false when this
// agent runs no registry (then no series exist).
type NamesSource func() (NamesState, bool)

// namesCollector exports gpuherd_names_*.
type namesCollector struct {
	src                                           NamesSource
	role, leader, lastContact, halted, registries *prometheus.Desc
}

// NewNamesCollector returns the collector of the name registry's metrics;
// the agent registers it once its registry runs.
func NewNamesCollector(src NamesSource) prometheus.Collector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(namespace+"_"+name, help, labels, nil)
	}
	return &namesCollector{
		src:         src,
		role:        desc("names_role", "This agent's role in the name registry: 1 for the current one of voter, non-voter, standby (runs raft, in no configuration yet) and client.", "role"),
		leader:      desc("names_leader", "1 when this agent leads the name registry, 0 when not."),
		lastContact: desc("names_last_contact_seconds", "Time since this registry follower last heard from its leader; absent on the leader and on clients."),
		halted:      desc("names_halted", "1 when this agent stopped applying the name registry's log (an entry it cannot read: upgrade it), 0 when not."),
		registries:  desc("names_registries", "Name registries this agent's gossip view shows; more than 1 means gossip islands founded one each (docs/names.md)."),
	}
}

func (c *namesCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.role, c.leader, c.lastContact, c.halted, c.registries} {
		ch <- d
	}
}

func (c *namesCollector) Collect(ch chan<- prometheus.Metric) {
	s, ok := c.src()
	if !ok {
		return
	}
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	for _, r := range NamesRoles {
		send(ch, c.role, prometheus.GaugeValue, b(r == s.Role), r)
	}
	send(ch, c.leader, prometheus.GaugeValue, b(s.Leader))
	if s.HasContact {
		send(ch, c.lastContact, prometheus.GaugeValue, s.LastContact)
	}
	send(ch, c.halted, prometheus.GaugeValue, b(s.Halted))
	send(ch, c.registries, prometheus.GaugeValue, float64(s.Registries))
}
