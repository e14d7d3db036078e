// Package status is this server's GPUs as the status API shows them: each
// GPU's state in the ledger with the driver it is on, read as one
// consistent picture, and what the agent adds to it (the fabric, the VMs
// using the GPUs, the name registry, the stores). It is built from named
// dependencies (Deps), never from the agent.
package status

import (
	"context"
	"fmt"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/internal/clock"
	"github.com/gpuherd/gpuherd/vfio"
)

// Ledger is what the status reads of the ledger.
type Ledger interface {
	// Revision changes with every write.
	Revision() uint64
	GPUStates(now time.Time) []ledger.GPUState
	// Get is a claim, for its holder labels.
	Get(id string) (ledger.Claim, error)
}

// Host is what the status reads of this server's GPUs (*host.Host).
type Host interface {
	GPU(addr string) (inventory.GPU, bool)
	// Device reads the device live: its driver now.
	Device(addr string) (vfio.Device, error)
	// LockGPUs holds the device locks: no bind, unbind or commit then.
	LockGPUs(addrs ...string) (unlock func())
	WhyNotOffered(addr string) string
	Readiness(addr string) *api.Readiness
	Fabric() host.Fabric
	// AnnotateUse marks the GPUs that VMs hold open.
	AnnotateUse(gpus []api.GPU) error
}

// Deps is what a Reader uses, by name.
type Deps struct {
	// Node is this server's name; Version the agent's.
	Node    string
	Version string
	Ledger  Ledger
	Host    Host
	Clock   clock.Clock
	// Generation is the count of this server's changes (api.Watcher).
	Generation func() uint64
	// Names is the name registry's part in the status; nil without one.
	Names func() *api.NamesStatus
	// Storage is the stores whose last write failed.
	Storage func() []api.StorageProblem
}

// Reader reads this server's GPUs for the status API.
type Reader struct {
	node, version string
	ledger        Ledger
	host          Host
	clk           clock.Clock
	generation    func() uint64
	names         func() *api.NamesStatus
	storage       func() []api.StorageProblem
}

// New builds a Reader over d.
func New(d Deps) *Reader {
	return &Reader{node: d.Node, version: d.Version, ledger: d.Ledger, host: d.Host, clk: d.Clock,
		generation: d.Generation, names: d.Names, storage: d.Storage}
}

// Status lists this server's GPUs with their state.
func (r *Reader) Status(context.Context) (api.Status, error) {
	// Read before the state: a change in between is seen by the next
	// watch at once, never missed.
	gen := r.generation()
	st := api.Status{Node: r.node, Version: r.version, GPUs: []api.GPU{},
		Fabric: r.host.Fabric().Mode, FabricWarning: r.host.Fabric().Warning, Generation: gen}
	for _, s := range r.States() {
		st.GPUs = append(st.GPUs, r.view(s))
	}
	if err := r.host.AnnotateUse(st.GPUs); err != nil {
		st.InUseError = err.Error()
	}
	st.Names = r.names()
	if ps := r.storage(); len(ps) > 0 {
		st.Storage = ps
	}
	return st, nil
}

// Known is nil when addr is one of this server's GPUs, else the API's
// error for it.
func (r *Reader) Known(addr string) error {
	if err := vfio.ValidateAddress(addr); err != nil {
		return api.Invalid("pci_address", "%v", err)
	}
	if _, ok := r.host.GPU(addr); !ok {
		return &api.Error{Code: api.CodeNotFound,
			Message: fmt.Sprintf("no GPU at %s on %s (see `gpuherd status`)", addr, r.node)}
	}
	return nil
}

// GPU is the GPU at addr as the status shows it.
func (r *Reader) GPU(addr string) (api.GPU, error) {
	for _, s := range r.States() {
		if s.GPU.Address == addr {
			return r.view(s), nil
		}
	}
	return api.GPU{}, &api.Error{Code: api.CodeNotFound, Message: "no GPU at " + addr}
}

// State is a GPU's state in the ledger with the driver it was on at the
// same moment.
type State struct {
	ledger.GPUState
	Driver  string
	Read    bool  // false: the device could not be read, Driver is ""
	ReadErr error // why not
}

// States reads every GPU's ledger state and its driver as one consistent
// picture. A claim binds its GPUs before the ledger commits it, and the
// ledger releases a claim before its GPUs go back to the idle driver, so
// a GPU the ledger calls claimed is on vfio-pci throughout; but a state
// read, then a driver read after a release and its unbind in between,
// would pair "claimed" with the idle driver. The picture is kept only when
// the ledger did not change while the drivers were read. A ledger that
// keeps changing gets the device locks instead: under them no bind,
// unbind or commit happens, and a release that slips in leaves a free GPU
// still on vfio-pci, which is true.
func (r *Reader) States() []State {
	const attempts = 3
	for range attempts {
		rev := r.ledger.Revision()
		out := r.readStates()
		if r.ledger.Revision() == rev {
			return out
		}
	}
	var addrs []string
	for _, s := range r.ledger.GPUStates(r.clk.Now()) {
		addrs = append(addrs, s.GPU.Address)
	}
	unlock := r.host.LockGPUs(addrs...)
	defer unlock()
	return r.readStates()
}

func (r *Reader) readStates() []State {
	states := r.ledger.GPUStates(r.clk.Now())
	out := make([]State, len(states))
	for i, s := range states {
		out[i].GPUState = s
		if d, err := r.host.Device(s.GPU.Address); err == nil {
			out[i].Driver, out[i].Read = d.Driver, true
		} else {
			out[i].ReadErr = err
		}
	}
	return out
}

func (r *Reader) view(s State) api.GPU {
	g, _ := r.host.GPU(s.GPU.Address)
	return api.GPU{
		PCIAddress:  s.GPU.Address,
		Model:       s.GPU.Model,
		MemoryBytes: g.MemoryBytes,
		NUMANode:    s.GPU.NUMANode,
		// NVMLMemoryBytes: NVML's own figure, apart from the model's.
		NVMLMemoryBytes: g.NVMLMemoryBytes,
		IOMMUGroup:      g.IOMMUGroup,
		PCIeRoot:        g.PCIeRoot,
		Driver:          s.Driver, // read live: what a VM start will find
		DriverError:     errString(s.ReadErr),
		State:           string(s.Status),
		Claim:           s.ClaimID,
		ClaimLabels:     r.claimLabels(s.ClaimID),
		DrainReason:     s.DrainReason,
		UUID:            g.UUID,
		Companions:      g.Companions,
		Health:          r.host.WhyNotOffered(s.GPU.Address),
		Readiness:       r.host.Readiness(s.GPU.Address),
	}
}

// claimLabels are the holder labels of claim id on this server; none
// when it holds none.
func (r *Reader) claimLabels(id string) map[string]string {
	if id == "" {
		return nil
	}
	c, err := r.ledger.Get(id)
	if err != nil {
		return nil
	}
	return c.Labels
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
