package metrics

import "github.com/prometheus/client_golang/prometheus"

// vmEvents are what the agent saw of the VMs using its GPUs.
type vmEvents struct {
	unexpected *prometheus.CounterVec
	adopted    prometheus.Counter
	refused    prometheus.Counter
}

func newVMEvents() *vmEvents {
	return &vmEvents{
		unexpected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "driver_changes_unexpected_total",
			Help: "GPUs found on a driver the ledger does not expect (rebound behind gpuherd, e.g. by libvirt's managed='yes' at VM stop), by the driver found; each was put back or fenced.",
		}, []string{"pci_address", "driver"}),
		adopted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "claims_adopted_total",
			Help: "Claims the agent created for GPUs a running VM held open while no claim did (IDs adopted-<node>-<domain or pid>).",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "releases_refused_in_use_total",
			Help: "Releases refused because a VM held the claim's GPUs open (409 in_use).",
		}),
	}
}

func (e *vmEvents) collectors() []prometheus.Collector {
	return []prometheus.Collector{e.unexpected, e.adopted, e.refused}
}

// DriverChangeUnexpected counts a GPU found on driver against the ledger.
func (m *Metrics) DriverChangeUnexpected(pciAddress, driver string) {
	if driver == "" {
		driver = "none"
	}
	if c, err := m.vm.unexpected.GetMetricWithLabelValues(pciAddress, driver); err == nil {
		c.Inc()
	}
}

// ClaimAdopted counts a claim adopted from a running VM.
func (m *Metrics) ClaimAdopted() { m.vm.adopted.Inc() }

// ReleaseRefusedInUse counts a release refused because a VM used the GPUs.
func (m *Metrics) ReleaseRefusedInUse() { m.vm.refused.Inc() }
