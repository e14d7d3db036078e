package metrics

// Source gives the state the gauges are built from. Snapshot is called once
// per scrape, possibly from concurrent scrapes, so it must be cheap and safe
// for concurrent use: a copy of state the agent already holds, not a fresh
// walk of sysfs or NVML.
type Source interface {
	Snapshot() Snapshot
}

// SourceFunc adapts a function to Source.
type SourceFunc func() Snapshot

// Snapshot calls f.
func (f SourceFunc) Snapshot() Snapshot { return f() }

// Snapshot is this agent's state at one scrape.
type Snapshot struct {
	Build   BuildInfo
	GPUs    []GPU
	Models  []ModelCapacity // this server, one entry per model it has
	Cluster []ClusterModelCapacity
	// Members counts cluster members by memberlist state ("alive",
	// "suspect", "dead", "left"); nil when this agent runs without a
	// cluster, and then no gossip_members series exist.
	Members map[string]int
	// GossipHealthScore is memberlist's awareness score (0 is healthy,
	// higher means this node is slow to answer probes); nil without a
	// cluster.
	GossipHealthScore *int
	Ledger            LedgerStats
}

// BuildInfo identifies the running binary.
type BuildInfo struct {
	Version   string
	Revision  string
	GoVersion string
}

// GPU states as the agent reports them; gpu_state has one series for each.
const (
	StateFree      = "free"
	StateReserved  = "reserved"
	StateClaimed   = "claimed"
	StateUnhealthy = "unhealthy"
	StateUnusable  = "unusable" // healthy, but its IOMMU group cannot be passed through now
	StateDrained   = "drained"
	// StateReturning: released, but a VM still holds its VFIO group open;
	// it goes to the idle driver once the VM lets go.
	StateReturning = "returning"
)

// states lists every GPU state in a fixed order, so that each GPU always has
// the same gpu_state series and a query for a state that no GPU is in still
// finds zeros rather than nothing.
var states = []string{StateFree, StateReserved, StateClaimed, StateUnhealthy, StateUnusable, StateDrained, StateReturning}

// GPU is one GPU of this server.
type GPU struct {
	PCIAddress string // identity: "0000:3b:00.0"
	Model      string // catalog name, or "10de:<device>"
	DeviceID   string // PCI device ID, four lower-case hex digits: "2330"
	UUID       string // "" when NVML never saw the card
	IOMMUGroup int    // -1 when the device has none
	NUMANode   int    // -1 when unknown
	Driver     string // "" when no driver is bound
	State      string // StateFree, StateReserved, ...
	Healthy    bool
	// UnusableReason is the code of the first problem that keeps the GPU
	// from passthrough (group_not_viable, no_iommu, ...); "" when it can be
	// passed through. BlockingDevice is the PCI address of the device that
	// blocks it, when one does.
	UnusableReason string
	BlockingDevice string
	// Telemetry is NVML's current reading; nil when NVML does not see the
	// card (on vfio-pci, or no driver), and then the card has no telemetry
	// series at all.
	Telemetry *Telemetry
}

// Telemetry is one GPU's NVML reading; a Has… flag false means the card did
// not give that reading, and then its series is left out.
type Telemetry struct {
	TemperatureCelsius float64
	PowerWatts         float64
	EnergyJoules       float64 // since the driver was last loaded
	MemoryUsedBytes    uint64
	MemoryTotalBytes   uint64
	Utilization        float64 // 0..1

	HasTemperature bool
	HasPower       bool
	HasEnergy      bool
	HasMemory      bool
	HasUtilization bool
}

// ModelCapacity counts the GPUs of one model.
type ModelCapacity struct {
	Model    string
	Total    int
	Free     int
	Healthy  int
	Unusable int // healthy but not passable through now; neither free nor healthy
}

// ClusterModelCapacity counts the GPUs of one model over the whole cluster,
// as this agent's gossip view has it.
type ClusterModelCapacity struct {
	ModelCapacity
	// MaxFreeOnOneServer is the most free GPUs of the model on any single
	// server: the largest request that can be placed, since a request is
	// never split across servers.
	MaxFreeOnOneServer int
}

// LedgerStats describes the local claims ledger.
type LedgerStats struct {
	Reserved  int   // claims holding a reservation that is not yet committed
	Committed int   // committed claims
	FileBytes int64 // size of the ledger file
}
