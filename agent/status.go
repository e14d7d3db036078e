package agent

import (
	"context"
	"fmt"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/vfio"
)

// Status lists this server's GPUs with their state.
func (a *Agent) Status(context.Context) (api.Status, error) {
	// Read before the state: a change in between is seen by the next
	// watch at once, never missed.
	gen := a.feed.current()
	st := api.Status{Node: a.cfg.NodeName, Version: Version, GPUs: []api.GPU{},
		Fabric: a.host.Fabric().Mode, FabricWarning: a.host.Fabric().Warning, Generation: gen}
	for _, s := range a.gpuStates() {
		st.GPUs = append(st.GPUs, a.stateView(s))
	}
	if err := a.host.AnnotateUse(st.GPUs); err != nil {
		st.InUseError = err.Error()
	}
	st.Names = a.registry.Status()
	if ps := a.storage.problems(); len(ps) > 0 {
		st.Storage = ps
	}
	return st, nil
}

func (a *Agent) knownGPU(addr string) error {
	if err := vfio.ValidateAddress(addr); err != nil {
		return api.Invalid("pci_address", "%v", err)
	}
	if _, ok := a.host.GPU(addr); !ok {
		return &api.Error{Code: api.CodeNotFound,
			Message: fmt.Sprintf("no GPU at %s on %s (see `gpuherd status`)", addr, a.cfg.NodeName)}
	}
	return nil
}

func (a *Agent) gpuView(addr string) (api.GPU, error) {
	for _, s := range a.gpuStates() {
		if s.GPU.Address == addr {
			return a.stateView(s), nil
		}
	}
	return api.GPU{}, &api.Error{Code: api.CodeNotFound, Message: "no GPU at " + addr}
}

// gpuState is a GPU's state in the ledger with the driver it was on at the
// same moment.
type gpuState struct {
	ledger.GPUState
	driver  string
	read    bool  // false: the device could not be read, driver is ""
	readErr error // why not
}

// gpuStates reads every GPU's ledger state and its driver as one
// consistent picture. A claim binds its GPUs before the ledger commits it,
// and the ledger releases a claim before its GPUs go back to the idle
// driver, so a GPU the ledger calls claimed is on vfio-pci throughout;
// but a state read, then a driver read after a release and its unbind in
// between, would pair "claimed" with the idle driver. The picture is kept
// only when the ledger did not change while the drivers were read. A ledger
// that keeps changing gets the device locks instead: under them no bind,
// unbind or commit happens, and a release that slips in leaves a free GPU
// still on vfio-pci, which is true.
func (a *Agent) gpuStates() []gpuState {
	const attempts = 3
	for range attempts {
		rev := a.ledger.Revision()
		out := a.readStates()
		if a.ledger.Revision() == rev {
			return out
		}
	}
	var addrs []string
	for _, s := range a.ledger.GPUStates(a.clk.Now()) {
		addrs = append(addrs, s.GPU.Address)
	}
	unlock := a.host.LockGPUs(addrs...)
	defer unlock()
	return a.readStates()
}

func (a *Agent) readStates() []gpuState {
	states := a.ledger.GPUStates(a.clk.Now())
	out := make([]gpuState, len(states))
	for i, s := range states {
		out[i].GPUState = s
		if d, err := a.host.Device(s.GPU.Address); err == nil {
			out[i].driver, out[i].read = d.Driver, true
		} else {
			out[i].readErr = err
		}
	}
	return out
}

func (a *Agent) stateView(s gpuState) api.GPU {
	g, _ := a.host.GPU(s.GPU.Address)
	return api.GPU{
		PCIAddress:  s.GPU.Address,
		Model:       s.GPU.Model,
		MemoryBytes: g.MemoryBytes,
		NUMANode:    s.GPU.NUMANode,
		// NVMLMemoryBytes: NVML's own figure, apart from the model's.
		NVMLMemoryBytes: g.NVMLMemoryBytes,
		IOMMUGroup:      g.IOMMUGroup,
		PCIeRoot:        g.PCIeRoot,
		Driver:          s.driver, // read live: what a VM start will find
		DriverError:     errString(s.readErr),
		State:           string(s.Status),
		Claim:           s.ClaimID,
		ClaimLabels:     a.claimLabels(s.ClaimID),
		DrainReason:     s.DrainReason,
		UUID:            g.UUID,
		Companions:      g.Companions,
		Health:          a.host.WhyNotOffered(s.GPU.Address),
		Readiness:       a.host.Readiness(s.GPU.Address),
	}
}

// Version is this build.
func (a *Agent) Version() api.VersionInfo { return VersionInfo() }

// claimLabels are the holder labels of claim id on this server; none
// when it holds none.
func (a *Agent) claimLabels(id string) map[string]string {
	if id == "" {
		return nil
	}
	c, err := a.ledger.Get(id)
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
