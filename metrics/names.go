package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// nameEvents are what the owner's anti-entropy pass between the name
// registry and the ledger found and did (docs/protocol.md, "Anti-entropy").
type nameEvents struct {
	duplicates prometheus.Gauge
	released   prometheus.Counter
	adopted    prometheus.Counter
	freed      prometheus.Counter
	skipped    prometheus.Counter
	settled    prometheus.Counter
	undone     prometheus.Counter
}

func newNameEvents() *nameEvents {
	return &nameEvents{
		duplicates: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "claim_duplicates",
			Help: "Copies of a claim ID this server holds that the name registry does not name (the registry's copy is on another server); an unused one is released by the pass after the one that found it, one a VM uses once the VM stops.",
		}),
		released: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "claim_duplicates_released_total",
			Help: "Duplicate copies of a claim ID this server released because no VM used them.",
		}),
		adopted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "claim_names_adopted_total",
			Help: "Committed claims of this server's ledger that had no name in the registry (an older version's ledger) and were given one.",
		}),
		freed: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "claim_names_freed_total",
			Help: "Names the registry held on this server with no claim in its ledger (a release that could not reach the registry), released by the anti-entropy pass.",
		}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "anti_entropy_skipped_total",
			Help: "Anti-entropy passes skipped because the name registry did not answer.",
		}),
		settled: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "claim_awaiting_name_settled_total",
			Help: "Claims committed ahead of their name by a commit that did not finish (a crash between the ledger's commit and the hold's answer) that the registry holds on this server: kept, under its token.",
		}),
		undone: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "claim_awaiting_name_undone_total",
			Help: "Claims committed ahead of their name by a commit that did not finish whose name the registry does not hold here: removed, their GPUs freed (no client was told of them).",
		}),
	}
}

func (e *nameEvents) collectors() []prometheus.Collector {
	return []prometheus.Collector{e.duplicates, e.released, e.adopted, e.freed, e.skipped, e.settled, e.undone}
}

// SetClaimDuplicates sets how many duplicate copies this server holds now.
func (m *Metrics) SetClaimDuplicates(n int) { m.names.duplicates.Set(float64(n)) }

// ClaimDuplicateReleased counts a duplicate copy released.
func (m *Metrics) ClaimDuplicateReleased() { m.names.released.Inc() }

// ClaimNameAdopted counts a ledger claim given its missing name.
func (m *Metrics) ClaimNameAdopted() { m.names.adopted.Inc() }

// ClaimNameFreed counts a name released because the ledger had no claim.
func (m *Metrics) ClaimNameFreed() { m.names.freed.Inc() }

// ClaimAwaitingDecided counts a claim committed ahead of its name decided
// from the registry: kept, or undone.
func (m *Metrics) ClaimAwaitingDecided(kept bool) {
	if kept {
		m.names.settled.Inc()
	} else {
		m.names.undone.Inc()
	}
}

// AntiEntropySkipped counts a pass skipped while the registry was down.
func (m *Metrics) AntiEntropySkipped() { m.names.skipped.Inc() }

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
