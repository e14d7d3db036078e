// Package api is the agent's HTTP+JSON API: the wire types, the server's
// routing and request decoding, and a client.
package api

import (
	"fmt"
	"maps"
	"strings"
	"time"
)

// Version is the API's path prefix.
const Version = "v1"

// GPU is one GPU of a server as `gpuherd status` shows it.
type GPU struct {
	PCIAddress  string `json:"pci_address"`
	Model       string `json:"model"`
	MemoryBytes uint64 `json:"memory_bytes"` // the model's marketed memory
	// NVMLMemoryBytes is what NVML last reported as the card's total; 0 never seen.
	NVMLMemoryBytes uint64 `json:"nvml_memory_bytes,omitempty"`
	NUMANode        int    `json:"numa_node"`
	// PCIeRoot is the PCI root complex of the GPU ("pci0000:3a"); absent
	// when sysfs does not say.
	PCIeRoot   string `json:"pcie_root,omitempty"`
	IOMMUGroup int    `json:"iommu_group"`
	Driver     string `json:"driver"`
	State      string `json:"state"` // free, reserved, claimed, unhealthy, unusable, drained, returning
	Claim      string `json:"claim"`
	// ClaimLabels are the holder labels of the claim holding the GPU: who
	// it is for (a Kubernetes ResourceClaim, a KubeVirt VM claimed first).
	ClaimLabels map[string]string `json:"claim_labels,omitempty"`
	Health      string            `json:"health,omitempty"` // why it is unhealthy, or unusable
	DrainReason string            `json:"drain_reason,omitempty"`
	UUID        string            `json:"uuid,omitempty"`
	Companions  []string          `json:"companions,omitempty"`
	InUseBy     *InUse            `json:"in_use_by,omitempty"` // the VM holding its VFIO group open
	// Readiness is the passthrough verdict; nil when not taken (a GPU
	// that cannot be read).
	Readiness *Readiness `json:"readiness,omitempty"`
	// DriverError says why the device could not be read; driver is then
	// empty.
	DriverError string `json:"driver_error,omitempty"`
}

// GPU states.
const (
	StateFree      = "free"
	StateReserved  = "reserved"
	StateClaimed   = "claimed"
	StateUnhealthy = "unhealthy"
	StateDrained   = "drained"
	// StateReleased is a claim's state in the answer to its release: the
	// GPUs it held are free again.
	StateReleased = "released"
	// StateLost is a claim whose server was removed from the cluster for
	// good (members remove): its GPUs went with that server; releasing it
	// frees its ID.
	StateLost = "lost"
)

// Status is a server's GPUs.
type Status struct {
	Node    string `json:"node"`
	Version string `json:"version"`
	GPUs    []GPU  `json:"gpus"`
	// Fabric is the NVSwitch fabric mode (none, shared-nvswitch,
	// full-passthrough, unknown) and FabricWarning what it cannot serve.
	Fabric        string `json:"fabric,omitempty"`
	FabricWarning string `json:"fabric_warning,omitempty"`
	// Names is this agent's part in the name registry; absent when it
	// runs none (alone).
	Names *NamesStatus `json:"names,omitempty"`
	// Generation counts this server's changes (claims, releases, drains,
	// health and readiness): a watcher passes the last one it saw as
	// `after` and is answered once the generation is another.
	Generation uint64 `json:"generation,omitempty"`
	// InUseError says why the agent cannot tell which processes hold the
	// GPUs' VFIO groups open (proc_root unreadable): in_use_by may then
	// be missing on GPUs a VM uses.
	InUseError string `json:"in_use_error,omitempty"`
	// Storage lists the agent's stores whose last write failed (a full
	// disk, a read-only file system, an I/O error); absent when every
	// store writes.
	Storage []StorageProblem `json:"storage,omitempty"`
}

// StorageProblem is one of the agent's stores failing now.
type StorageProblem struct {
	Store  string    `json:"store"` // ledger, registry_log, registry_snapshots, members
	Op     string    `json:"op"`    // the operation that failed last
	Error  string    `json:"error"`
	Cause  string    `json:"cause"` // "no space left on device", "read-only file system", "I/O error", ...
	Since  time.Time `json:"since"` // the first failure since the store last wrote
	Action string    `json:"action"`
}

// NamesStatus is an agent's view of the name registry.
type NamesStatus struct {
	Role     string   `json:"role"` // voter, non-voter, standby or client
	Leader   string   `json:"leader,omitempty"`
	Registry string   `json:"registry,omitempty"` // the registry's ID
	Voters   []string `json:"voters,omitempty"`
	// LastContactSeconds: since a follower last heard from its leader.
	LastContactSeconds float64 `json:"last_contact_seconds,omitempty"`
	Halted             string  `json:"halted,omitempty"`
}

// Item is `count` GPUs of one model.
type Item struct {
	Model string `json:"model"`
	Count int    `json:"count"`
}

// ClaimRequest asks for GPUs, all on one server.
type ClaimRequest struct {
	GPUs   []Item            `json:"gpus"`
	Labels map[string]string `json:"labels,omitempty"`
	// PreferNode is tried first when it can hold the request: a VM that
	// restarts goes back to its old server when its GPUs are still free.
	PreferNode string `json:"prefer_node,omitempty"`
	// VCPUs is the VM's vCPU count, when the caller says it: outside the
	// 8–16 per GPU the platform recommends, the answer carries a warning.
	VCPUs int `json:"vcpus,omitempty"`
	// SameNode keeps the claim on PreferNode: when that server cannot hold
	// the request the answer is not_available with what it can hold,
	// instead of another server. Without PreferNode it is the default (a
	// remembered ID goes back to the server it last ran on and nowhere
	// else), accepted for older callers.
	SameNode bool `json:"same_node,omitempty"`
	// AnyNode lets a remembered ID (released within remember_released) be
	// placed on another server, with a warning, when the server it last
	// ran on cannot hold the request. It is still tried first.
	AnyNode bool `json:"any_node,omitempty"`
	// Devices pins the claim to these GPUs (PCI addresses) of PreferNode,
	// or of the answering agent's own server when PreferNode is empty:
	// exactly them or nothing, never other GPUs and never another
	// server. GPUs may then be left out (the models come from the
	// devices); given, it must match them. This is how a Kubernetes
	// allocation, which names the devices the scheduler chose, becomes a
	// claim. Only the agent of that server takes a pinned claim.
	Devices []string `json:"devices,omitempty"`
}

// ResizeRequest changes a claim's GPUs (model or count).
type ResizeRequest struct {
	GPUs []Item `json:"gpus"`
}

// Alternative is a request that one server could hold right now.
type Alternative struct {
	GPUs    []Item `json:"gpus"`
	Servers int    `json:"servers"`
}

// ClaimGPU is one GPU handed to a claim.
type ClaimGPU struct {
	PCIAddress string `json:"pci_address"`
	Model      string `json:"model"`
	IOMMUGroup int    `json:"iommu_group"`
	VFIODevice string `json:"vfio_device"`
	// Companions are the card's other functions in its IOMMU group (HD
	// audio, USB-C), on vfio-pci with it: a VM gets them on the GPU's slot.
	Companions []PCIFunction `json:"companions,omitempty"`
}

// PCIFunction is one PCI function of the host.
type PCIFunction struct {
	PCIAddress string `json:"pci_address"`
}

// Claim is a VM's (or node's) GPUs on one server.
type Claim struct {
	ID          string            `json:"id"`
	Node        string            `json:"node"`
	State       string            `json:"state"` // reserved or claimed
	Items       []Item            `json:"items"`
	GPUs        []ClaimGPU        `json:"gpus"`
	Labels      map[string]string `json:"labels,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	ExpiresAt   time.Time         `json:"expires_at,omitzero"`
	CommittedAt time.Time         `json:"committed_at,omitzero"`
	// Domain is the VM that runs on the claim, as the libvirt hook
	// reported it; absent when none does.
	Domain *DomainUse `json:"domain,omitempty"`
	// Warnings are advice about the request that did not stop it (vCPUs
	// per GPU, the server it last ran on being full).
	Warnings []string `json:"warnings,omitempty"`
	// Duplicate marks a copy of a claim ID that the name registry does not
	// name (an older version's ledger, a fault beyond the design): it is
	// released unless a VM uses it, and kept until its VM stops. KeptOn is
	// the server of the copy the registry names, if any.
	Duplicate bool   `json:"duplicate,omitempty"`
	KeptOn    string `json:"kept_on,omitempty"`
	// NameReleased, in an owner's answer to a release, says that the name
	// registry let the claim's ID go from that server: no other server can
	// hold it since, so the coordinator need not read the registry again.
	// An owner that does not say so leaves the coordinator to check.
	NameReleased bool `json:"name_released,omitempty"`
	// NameElsewhere, in an owner's answer to a release, says that the
	// registry refused to let the ID go from that server because it holds
	// it on another one: the copy released there was not the one the
	// registry names (a move cut short left it), and the coordinator
	// releases the registry's copy too.
	NameElsewhere bool `json:"name_elsewhere,omitempty"`
}

// DomainUse is the libvirt domain running on a claim.
type DomainUse struct {
	UUID    string    `json:"uuid"`
	Name    string    `json:"name,omitempty"`
	Started bool      `json:"started"`
	Since   time.Time `json:"since"`
}

// UseRequest is the libvirt hook asking whether a domain may run on claim
// ID's GPUs, and marking the claim in use by it when it may: every
// address of PCIAddresses that is one of this server's GPUs or their
// companion functions must belong to the claim, which must be committed on
// this server, with each GPU on vfio-pci.
type UseRequest struct {
	DomainUUID   string   `json:"domain_uuid"`
	DomainName   string   `json:"domain_name,omitempty"`
	PCIAddresses []string `json:"pci_addresses,omitempty"`
	// CheckOnly checks without marking (an incoming migration, a restore).
	CheckOnly bool `json:"check_only,omitempty"`
	// Started: the domain is running (libvirt's started and reconnect).
	Started bool `json:"started,omitempty"`
}

// UseEnd is what ending a domain's use of a claim did.
type UseEnd struct {
	Claim    Claim  `json:"claim"`
	Released bool   `json:"released"`
	Reason   string `json:"reason,omitempty"` // why nothing was released
}

// ClaimList is every claim of the platform that the answering agent could
// collect. Partial is true when some server did not answer: its claims are
// missing from Claims, and Unanswered names it.
type ClaimList struct {
	Claims     []Claim      `json:"claims"`
	Partial    bool         `json:"partial"`
	Unanswered []Unanswered `json:"unanswered,omitempty"`
}

// Unanswered is a server whose answer is missing, and why.
type Unanswered struct {
	Node   string `json:"node"`
	Reason string `json:"reason"`
}

// ModelAvailability is one model of the platform.
type ModelAvailability struct {
	Model     string `json:"model"`
	Available bool   `json:"available"`
	Free      int    `json:"free"`
	Total     int    `json:"total"`
	Healthy   int    `json:"healthy"`
	// Unusable GPUs are healthy but cannot be passed through now; they are
	// neither free nor healthy.
	Unusable int `json:"unusable,omitempty"`
	// MaxFreeOnOneServer is the largest request of this model one server
	// can hold now (a VM's GPUs are all on one server).
	MaxFreeOnOneServer int `json:"max_free_on_one_server"`
}

// Availability lists every model of the platform, available or not, as the
// answering agent sees it (its own ledger, the others' gossip). Partial is
// true when the agent lacks a server's capacity (Unanswered names each):
// the counts may then be short.
type Availability struct {
	Node       string              `json:"node"`
	Servers    int                 `json:"servers"`
	Models     []ModelAvailability `json:"models"`
	Partial    bool                `json:"partial"`
	Unanswered []Unanswered        `json:"unanswered,omitempty"`
}

// Member is one server of the platform.
type Member struct {
	Name         string              `json:"name"`
	Addr         string              `json:"addr,omitempty"` // gossip address
	State        string              `json:"state"`          // alive, suspect, dead, left, unknown (MemberUnknown)
	Self         bool                `json:"self,omitempty"`
	Drained      bool                `json:"drained"`
	AgentVersion string              `json:"agent_version,omitempty"`
	Models       []ModelAvailability `json:"models"`
	// SummaryError says why the member's gossiped summary cannot be read
	// (a newer or broken agent): its version, drain, registry role and
	// capacity are then unknown and left empty, and no claim is placed
	// there.
	SummaryError string `json:"summary_error,omitempty"`
	// NamesRole is the member's role in the name registry (voter,
	// non-voter, standby, client), as it gossips it; NamesLeader marks the
	// registry's leader.
	NamesRole   string `json:"names_role,omitempty"`
	NamesLeader bool   `json:"names_leader,omitempty"`
}

// MemberUnknown is the state of a server the answering agent has seen
// before and whose state its gossip does not know now (not heard of since
// the agent started, or gone for longer than gossip remembers).
const MemberUnknown = "unknown"

// ServerDrainRequest cordons a whole server.
type ServerDrainRequest struct {
	Reason string `json:"reason,omitempty"`
}

// DrainRequest drains a GPU: no new claims there, the existing one stays.
type DrainRequest struct {
	Reason string `json:"reason,omitempty"`
}

// VersionInfo is the agent's build.
type VersionInfo struct {
	Version string `json:"version"`
	Commit  string `json:"commit,omitempty"`
	Go      string `json:"go"`
}

// Error is the body of every non-2xx answer.
type Error struct {
	Status      int      `json:"-"`
	Code        string   `json:"code"`
	Message     string   `json:"message"`
	Field       string   `json:"field,omitempty"`
	Missing     []Item   `json:"missing,omitempty"`
	KnownModels []string `json:"known_models,omitempty"`
	// Alternatives: what would fit on one server now, when Missing could not.
	Alternatives []Alternative `json:"alternatives,omitempty"`
	// PCIAddresses: the functions a not_claimed or not_bound error is about.
	PCIAddresses []string `json:"pci_addresses,omitempty"`
	// HeldBy: the claims of the server that hold the functions of a
	// not_claimed error instead.
	HeldBy []string `json:"held_by,omitempty"`
	// Refusals: why owners refused GPUs their view had offered (a GPU found
	// unusable before any driver change), one line per refusal.
	Refusals []string `json:"refusals,omitempty"`
	// Node: the server a go_back error sends the claim back to.
	Node string `json:"node,omitempty"`
	// Summary: in an owner's not_available answer to a peer, the owner's
	// capacity as it would gossip it now (its encoded gossip summary), so
	// that the coordinator's view of it need not wait for gossip.
	Summary []byte `json:"summary,omitempty"`
}

func (e *Error) Error() string { return e.Message }

// ErrorBody wraps Error on the wire so that later fields can sit beside it.
type ErrorBody struct {
	Error *Error `json:"error"`
}

// NotAvailableMessage is the sentence users see when a request cannot be
// held: every item that could not be placed, e.g.
// "The following GPUs are not available: 2x NVIDIA H100 80GB".
func NotAvailableMessage(missing []Item) string {
	return "The following GPUs are not available: " + DescribeItems(missing)
}

// NotClaimedMessage is the sentence a VM start refused by the libvirt hook
// shows: "The following GPUs are not claimed by vm-b: 0000:41:00.0".
func NotClaimedMessage(id string, addrs []string) string {
	return fmt.Sprintf("The following GPUs are not claimed by %s: %s", id, strings.Join(addrs, ", "))
}

// DescribeItems writes items as people read them: "2x NVIDIA H100 80GB, 1x NVIDIA L40S".
func DescribeItems(items []Item) string {
	parts := make([]string, len(items))
	for i, it := range items {
		parts[i] = fmt.Sprintf("%dx %s", it.Count, it.Model)
	}
	return strings.Join(parts, ", ")
}

// GroupRequest creates a Kubernetes node group: Nodes nodes, each with GPUs
// (the same for every node, all of a node's on one server). A group created
// without GPUs can never get one.
type GroupRequest struct {
	Nodes int    `json:"nodes"`
	GPUs  []Item `json:"gpus,omitempty"`
	// Kubernetes: the nodes are KubeVirt VMs; their claims carry
	// LabelKubernetes, so the DRA driver publishes their GPUs for the
	// nodes' pinned ResourceClaims (docs/kubevirt.md). A repair or resize
	// places a missing node as the nodes that hold GPUs are.
	Kubernetes bool `json:"kubernetes,omitempty"`
}

// GroupRecord is what the platform remembers of a group besides its node
// claims: the name registry keeps it (a server running alone, a file).
type GroupRecord struct {
	Name        string `json:"name"`
	Nodes       int    `json:"nodes"`
	WithGPUs    bool   `json:"with_gpus"`
	Coordinator string `json:"coordinator"`
	// CreatedAt is when the group was created; unknown (omitted) for a
	// group kept in the name registry.
	CreatedAt time.Time `json:"created_at,omitzero"`
}

// Group is a node group with the claim of each node (node i's claim ID is
// NAME.node-i).
type Group struct {
	GroupRecord
	GPUs   []Item  `json:"gpus"` // per node
	Claims []Claim `json:"claims"`
	// Missing are the node claims no server holds (released directly);
	// group repair places them again.
	Missing []string `json:"missing,omitempty"`
}

// SameItems reports whether x and y ask for the same GPUs: the same count
// of each model, in any order and however split into items.
func SameItems(x, y []Item) bool {
	count := func(items []Item) map[string]int {
		m := map[string]int{}
		for _, it := range items {
			m[it.Model] += it.Count
		}
		return m
	}
	return maps.Equal(count(x), count(y))
}
