package metrics

import (
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Gossip member states, pre-set so that a dead count of 0 is a sample, not
// a missing series that an alert cannot tell from a missing cluster.
var memberStates = []string{"alive", "suspect", "dead", "left"}

var gpuLabels = []string{"pci_address", "model"}

// snapshotCollector turns one Snapshot into const metrics at each scrape.
// Const metrics rather than gauges set by the agent: a GPU that leaves the
// server, or a model that is no longer on offer, then vanishes from the next
// scrape by itself, with no stale series to delete.
type snapshotCollector struct {
	src Source

	buildInfo *prometheus.Desc

	gpuInfo       *prometheus.Desc
	gpuState      *prometheus.Desc
	gpuDriverInfo *prometheus.Desc
	gpuHealthy    *prometheus.Desc
	gpuUnusable   *prometheus.Desc

	temperature *prometheus.Desc
	power       *prometheus.Desc
	energy      *prometheus.Desc
	memoryUsed  *prometheus.Desc
	memoryTotal *prometheus.Desc
	utilization *prometheus.Desc

	modelGPUs       *prometheus.Desc
	modelFree       *prometheus.Desc
	modelHealthy    *prometheus.Desc
	modelUnusable   *prometheus.Desc
	clusterGPUs     *prometheus.Desc
	clusterFree     *prometheus.Desc
	clusterHealthy  *prometheus.Desc
	clusterUnusable *prometheus.Desc
	clusterMaxFree  *prometheus.Desc
	gossipMembers   *prometheus.Desc
	gossipHealth    *prometheus.Desc
	ledgerClaims    *prometheus.Desc
	ledgerFileBytes *prometheus.Desc
}

func newSnapshotCollector(src Source) *snapshotCollector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(namespace+"_"+name, help, labels, nil)
	}
	gpu := func(name, help string, extra ...string) *prometheus.Desc {
		return desc(name, help, append(append([]string{}, gpuLabels...), extra...)...)
	}
	return &snapshotCollector{
		src:       src,
		buildInfo: desc("build_info", "The running gpuherd binary; always 1.", "version", "revision", "goversion"),

		gpuInfo:       desc("gpu_info", "A GPU of this server and what identifies it; always 1.", "pci_address", "model", "device_id", "iommu_group", "numa_node", "uuid"),
		gpuState:      gpu("gpu_state", "1 for the GPU's current state, 0 for the others.", "state"),
		gpuDriverInfo: gpu("gpu_driver_info", "The kernel driver bound to the GPU (none when unbound); always 1.", "driver"),
		gpuHealthy:    gpu("gpu_healthy", "1 when the GPU is healthy, 0 when it is not."),
		gpuUnusable: gpu("gpu_unusable_info", "Why a GPU cannot be passed through now (state unusable): the problem's code and the PCI address of the device that blocks it; always 1, only for such GPUs.",
			"reason", "blocking_device"),

		temperature: gpu("gpu_temperature_celsius", "GPU core temperature, as NVML reports it."),
		power:       gpu("gpu_power_watts", "Board power draw, as NVML reports it."),
		energy:      gpu("gpu_energy_joules_total", "Energy the GPU used since the nvidia driver was loaded, as NVML reports it."),
		memoryUsed:  gpu("gpu_memory_used_bytes", "Framebuffer memory in use, as NVML reports it."),
		memoryTotal: gpu("gpu_memory_total_bytes", "Framebuffer memory size, as NVML reports it."),
		utilization: gpu("gpu_utilization_ratio", "Share of the last sample period in which a kernel ran on the GPU (0 to 1), as NVML reports it."),

		modelGPUs:       desc("model_gpus", "GPUs of the model on this server.", "model"),
		modelFree:       desc("model_gpus_free", "GPUs of the model on this server that a new claim can take.", "model"),
		modelHealthy:    desc("model_gpus_healthy", "Healthy GPUs of the model on this server.", "model"),
		modelUnusable:   desc("model_gpus_unusable", "GPUs of the model on this server that are healthy but cannot be passed through now.", "model"),
		clusterGPUs:     desc("cluster_model_gpus", "GPUs of the model in the cluster, as this agent's gossip view has it.", "model"),
		clusterFree:     desc("cluster_model_gpus_free", "Free GPUs of the model in the cluster, as this agent's gossip view has it.", "model"),
		clusterHealthy:  desc("cluster_model_gpus_healthy", "Healthy GPUs of the model in the cluster, as this agent's gossip view has it.", "model"),
		clusterUnusable: desc("cluster_model_gpus_unusable", "GPUs of the model in the cluster that cannot be passed through now, as this agent's gossip view has it.", "model"),
		clusterMaxFree:  desc("cluster_model_max_free_per_server", "Most free GPUs of the model on any one server: the largest request that can be placed.", "model"),
		gossipMembers:   desc("gossip_members", "Cluster members by memberlist state, as this agent sees them.", "state"),
		gossipHealth:    desc("gossip_health_score", "memberlist's awareness score of this agent: 0 is healthy, higher means it answers probes late."),
		ledgerClaims:    desc("ledger_claims", "Claims in the local ledger by state.", "state"),
		ledgerFileBytes: desc("ledger_file_size_bytes", "Size of the local ledger file."),
	}
}

// Describe implements prometheus.Collector. Every descriptor is sent, so the
// registry checks names and label sets once, at registration.
func (c *snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.buildInfo, c.gpuInfo, c.gpuState, c.gpuDriverInfo, c.gpuHealthy, c.gpuUnusable,
		c.temperature, c.power, c.energy, c.memoryUsed, c.memoryTotal, c.utilization,
		c.modelGPUs, c.modelFree, c.modelHealthy, c.modelUnusable,
		c.clusterGPUs, c.clusterFree, c.clusterHealthy, c.clusterUnusable, c.clusterMaxFree,
		c.gossipMembers, c.gossipHealth, c.ledgerClaims, c.ledgerFileBytes,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: one Snapshot per scrape.
func (c *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Snapshot()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		send(ch, d, prometheus.GaugeValue, v, labels...)
	}

	gauge(c.buildInfo, 1, s.Build.Version, s.Build.Revision, s.Build.GoVersion)
	for _, g := range s.GPUs {
		c.collectGPU(ch, g)
	}
	for _, m := range s.Models {
		gauge(c.modelGPUs, float64(m.Total), m.Model)
		gauge(c.modelFree, float64(m.Free), m.Model)
		gauge(c.modelHealthy, float64(m.Healthy), m.Model)
		gauge(c.modelUnusable, float64(m.Unusable), m.Model)
	}
	for _, m := range s.Cluster {
		gauge(c.clusterGPUs, float64(m.Total), m.Model)
		gauge(c.clusterFree, float64(m.Free), m.Model)
		gauge(c.clusterHealthy, float64(m.Healthy), m.Model)
		gauge(c.clusterUnusable, float64(m.Unusable), m.Model)
		gauge(c.clusterMaxFree, float64(m.MaxFreeOnOneServer), m.Model)
	}
	if s.Members != nil {
		for _, st := range memberStates {
			gauge(c.gossipMembers, float64(s.Members[st]), st)
		}
		for st, n := range s.Members {
			if !slices.Contains(memberStates, st) {
				gauge(c.gossipMembers, float64(n), st)
			}
		}
	}
	if s.GossipHealthScore != nil {
		gauge(c.gossipHealth, float64(*s.GossipHealthScore))
	}
	gauge(c.ledgerClaims, float64(s.Ledger.Reserved), "reserved")
	gauge(c.ledgerClaims, float64(s.Ledger.Committed), "committed")
	gauge(c.ledgerFileBytes, float64(s.Ledger.FileBytes))
}

func (c *snapshotCollector) collectGPU(ch chan<- prometheus.Metric, g GPU) {
	gauge := func(d *prometheus.Desc, v float64, extra ...string) {
		send(ch, d, prometheus.GaugeValue, v, append([]string{g.PCIAddress, g.Model}, extra...)...)
	}

	send(ch, c.gpuInfo, prometheus.GaugeValue, 1,
		g.PCIAddress, g.Model, g.DeviceID, optionalIndex(g.IOMMUGroup), optionalIndex(g.NUMANode), g.UUID)
	known := false
	for _, st := range states {
		gauge(c.gpuState, boolValue(g.State == st), st)
		known = known || g.State == st
	}
	if !known {
		// A state this package does not know yet still shows, rather than
		// leaving the GPU with every known state at 0 and no explanation.
		gauge(c.gpuState, 1, g.State)
	}
	driver := g.Driver
	if driver == "" {
		driver = "none"
	}
	gauge(c.gpuDriverInfo, 1, driver)
	gauge(c.gpuHealthy, boolValue(g.Healthy))
	if g.UnusableReason != "" {
		gauge(c.gpuUnusable, 1, g.UnusableReason, g.BlockingDevice)
	}

	t := g.Telemetry
	if t == nil {
		return
	}
	if t.HasTemperature {
		gauge(c.temperature, t.TemperatureCelsius)
	}
	if t.HasPower {
		gauge(c.power, t.PowerWatts)
	}
	if t.HasEnergy {
		send(ch, c.energy, prometheus.CounterValue, t.EnergyJoules, g.PCIAddress, g.Model)
	}
	if t.HasMemory {
		gauge(c.memoryUsed, float64(t.MemoryUsedBytes))
		gauge(c.memoryTotal, float64(t.MemoryTotalBytes))
	}
	if t.HasUtilization {
		gauge(c.utilization, t.Utilization)
	}
}

// send emits one const metric. A label value the exposition cannot carry
// (invalid UTF-8 from a driver string) becomes an invalid metric, which the
// registry reports as that one series' error, rather than a panic that would
// take the agent down in the middle of a scrape.
func send(ch chan<- prometheus.Metric, d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
	m, err := prometheus.NewConstMetric(d, t, v, labels...)
	if err != nil {
		m = prometheus.NewInvalidMetric(d, err)
	}
	ch <- m
}

// optionalIndex writes an IOMMU group or NUMA node as a label value, empty
// when unknown (-1): a label set that stays fixed, and no sentinel number
// that a query could mistake for node -1.
func optionalIndex(i int) string {
	if i < 0 {
		return ""
	}
	return strconv.Itoa(i)
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
