package ledger

import (
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// Item is one line of a request: Count GPUs of the canonical model Model.
// It is the API's item, stored as it travels (the same JSON), so a request
// keeps one item type from the user to the ledger.
type Item = api.Item

// Request is what a claim asks for; every item must be satisfied on this server.
type Request struct {
	Items  []Item            `json:"items"`
	Labels map[string]string `json:"labels,omitempty"`
	// NameToken is the name registry's token for the claim ID that the
	// placement asking for this holds (api.ReserveRequest.Token); 0 when
	// there is no registry. See Reserve for what a newer one replaces.
	NameToken uint64 `json:"name_token,omitempty"`
	// Devices pins the request to these GPUs (PCI addresses, sorted): the
	// claim takes exactly them or nothing. A Kubernetes allocation names
	// the devices the scheduler chose, and the claim must be those.
	Devices []string `json:"devices,omitempty"`
}

// State is the state of a claim in the owner's ledger.
type State string

// Claim states. A reservation holds GPUs until ExpiresAt unless committed.
const (
	StateReserved  State = "reserved"
	StateCommitted State = "committed"
)

// Claim is one VM's (or node's) GPUs on this server.
type Claim struct {
	ID          string            `json:"id"`
	State       State             `json:"state"`
	Items       []Item            `json:"items"`
	GPUs        []string          `json:"gpus"` // PCI addresses, sorted
	Labels      map[string]string `json:"labels,omitempty"`
	Coordinator string            `json:"coordinator,omitempty"` // who asked; "" for local
	CreatedAt   time.Time         `json:"created_at"`
	ExpiresAt   time.Time         `json:"expires_at,omitzero"` // reservations only
	CommittedAt time.Time         `json:"committed_at,omitzero"`
	// Use is the VM running on the claim (MarkUse); zero when none. Files
	// written before it existed have none.
	Use Use `json:"use,omitzero"`
	// NameToken is the name registry's token for the claim ID that this
	// claim was confirmed under (agent/names); 0 when the server runs
	// alone or the claim predates the registry.
	NameToken uint64 `json:"name_token,omitempty"`
	// AwaitingName marks a committed claim written before the name
	// registry answered the hold of its ID (CommitAwaitingName): it holds
	// its GPUs, but it is a claim only once SettleName gives it the token,
	// and it is undone (UnwindAwaiting) when the registry refused. One
	// found at Open is settled or undone by the owner against the
	// registry.
	AwaitingName bool `json:"awaiting_name,omitempty"`
}

// GPU is what the ledger needs to know about one GPU of this server; the
// inventory provides it at start and whenever health changes.
type GPU struct {
	Address  string `json:"address"`
	Model    string `json:"model"`
	NUMANode int    `json:"numa_node"`
	Healthy  bool   `json:"healthy"`
	// Unusable: the GPU cannot be passed through now (its IOMMU group
	// holds a device the host needs, the IOMMU is off, ...). It is never
	// reserved and never counted as free or healthy.
	Unusable bool `json:"unusable,omitempty"`
	// Distance to other GPUs of this server by address (NVML topology level,
	// smaller is closer); nil when unknown.
	Distance map[string]int `json:"distance,omitempty"`
}

// Named reports whether c is a claim whose ID the registry holds, as far
// as this ledger knows: committed, and not awaiting its name.
func (c Claim) Named() bool { return c.State == StateCommitted && !c.AwaitingName }

// Live reports whether the claim still holds its GPUs at now: a committed
// claim always does, a reservation only strictly before ExpiresAt.
func (c Claim) Live(now time.Time) bool {
	switch c.State {
	case StateCommitted:
		return true
	case StateReserved:
		return now.Before(c.ExpiresAt)
	default:
		return false
	}
}
