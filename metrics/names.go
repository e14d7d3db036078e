package metrics

import "github.com/prometheus/client_golang/prometheus"

// nameEvents are what the owner's anti-entropy pass between the name
// registry and the ledger found and did (docs/protocol.md, "Anti-entropy").
type nameEvents struct {
	duplicates prometheus.Gauge
	released   prometheus.Counter
	adopted    prometheus.Counter
	freed      prometheus.Counter
	skipped    prometheus.Counter
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
	}
}

func (e *nameEvents) collectors() []prometheus.Collector {
	return []prometheus.Collector{e.duplicates, e.released, e.adopted, e.freed, e.skipped}
}

// SetClaimDuplicates sets how many duplicate copies this server holds now.
func (m *Metrics) SetClaimDuplicates(n int) { m.names.duplicates.Set(float64(n)) }

// ClaimDuplicateReleased counts a duplicate copy released.
func (m *Metrics) ClaimDuplicateReleased() { m.names.released.Inc() }

// ClaimNameAdopted counts a ledger claim given its missing name.
func (m *Metrics) ClaimNameAdopted() { m.names.adopted.Inc() }

// ClaimNameFreed counts a name released because the ledger had no claim.
func (m *Metrics) ClaimNameFreed() { m.names.freed.Inc() }

// AntiEntropySkipped counts a pass skipped while the registry was down.
func (m *Metrics) AntiEntropySkipped() { m.names.skipped.Inc() }
