package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/vfio"
)

// bindAttempts bounds how often a claim is retried on other GPUs after a
// GPU failed to bind. Each failure fences one GPU, so retries end anyway;
// the bound keeps a server whose every card misbehaves from taking minutes.
const bindAttempts = 8

var _ api.Service = (*Agent)(nil)

type bindFailure struct {
	claim, addr string
	err         error
}

func (b *bindFailure) Error() string {
	return fmt.Sprintf("claim %s: GPU %s could not be bound to vfio-pci and was fenced off: %v", b.claim, b.addr, b.err)
}

func (b *bindFailure) Unwrap() error { return b.err }

// toIdleLocked returns the GPUs of addrs that no live claim holds to the
// idle driver, skipping skip. The caller holds their device locks, so a
// claim that takes one of them now binds it only after this returns. Failures
// fence the GPU; the release itself already happened in the ledger.
func (a *Agent) toIdleLocked(ctx context.Context, why string, addrs []string, skip string) {
	for _, addr := range a.unclaimed(addrs) {
		if addr == skip || a.health(addr) != "" {
			continue
		}
		start := time.Now()
		res, err := a.binder.Release(ctx, addr, a.policy)
		a.rec.VFIOOperation(VFIORelease, time.Since(start), err)
		if err != nil {
			a.fence(addr, fmt.Sprintf("return to idle driver %s failed: %v", a.policy, err))
			continue
		}
		logChanges(a, why, res)
	}
}

// logChanges logs every driver change of a bind or release: the operator's
// record of what gpuherd did to the machine, and why.
func logChanges(a *Agent, why string, res vfio.Result) {
	for _, ch := range res.Changes {
		a.log.Info("driver changed", "why", why, "pci_address", ch.Address, "from", orNone(ch.From), "to", orNone(ch.To))
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// Drain stops new claims on a GPU; a claim it is in stays.
func (a *Agent) Drain(_ context.Context, addr, reason string) (api.GPU, error) {
	if err := a.knownGPU(addr); err != nil {
		return api.GPU{}, err
	}
	if len(reason) > 256 {
		return api.GPU{}, api.Invalid("reason", "drain reason longer than 256 bytes")
	}
	if err := a.ledger.Drain(addr, reason, a.now()); err != nil {
		return api.GPU{}, a.apiError(err)
	}
	a.log.Info("drained", "pci_address", addr, "reason", reason)
	return a.gpuView(addr)
}

// Undrain offers a drained GPU again.
func (a *Agent) Undrain(_ context.Context, addr string) (api.GPU, error) {
	if err := a.knownGPU(addr); err != nil {
		return api.GPU{}, err
	}
	if err := a.ledger.Undrain(addr); err != nil {
		return api.GPU{}, a.apiError(err)
	}
	a.log.Info("undrained", "pci_address", addr)
	return a.gpuView(addr)
}

func (a *Agent) knownGPU(addr string) error {
	if err := vfio.ValidateAddress(addr); err != nil {
		return api.Invalid("pci_address", "%v", err)
	}
	if _, ok := a.gpu(addr); !ok {
		return &api.Error{Code: api.CodeNotFound,
			Message: fmt.Sprintf("no GPU at %s on %s (see `gpuherd status`)", addr, a.cfg.NodeName)}
	}
	return nil
}

// Status lists this server's GPUs with their state.
func (a *Agent) Status(context.Context) (api.Status, error) {
	st := api.Status{Node: a.cfg.NodeName, Version: Version, GPUs: []api.GPU{}}
	for _, s := range a.gpuStates() {
		st.GPUs = append(st.GPUs, a.stateView(s))
	}
	return st, nil
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
	driver string
	read   bool // false: the device could not be read, driver is ""
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
	for _, s := range a.ledger.GPUStates(a.now()) {
		addrs = append(addrs, s.GPU.Address)
	}
	unlock := a.locks.lock(addrs...)
	defer unlock()
	return a.readStates()
}

func (a *Agent) readStates() []gpuState {
	states := a.ledger.GPUStates(a.now())
	out := make([]gpuState, len(states))
	for i, s := range states {
		out[i].GPUState = s
		if d, err := a.pci.Device(s.GPU.Address); err == nil {
			out[i].driver, out[i].read = d.Driver, true
		}
	}
	return out
}

func (a *Agent) stateView(s gpuState) api.GPU {
	g, _ := a.gpu(s.GPU.Address)
	return api.GPU{
		PCIAddress:  s.GPU.Address,
		Model:       s.GPU.Model,
		MemoryBytes: g.MemoryBytes,
		NUMANode:    s.GPU.NUMANode,
		IOMMUGroup:  g.IOMMUGroup,
		Driver:      s.driver, // read live: what a VM start will find
		State:       string(s.Status),
		Claim:       s.ClaimID,
		DrainReason: s.DrainReason,
		UUID:        g.UUID,
		Companions:  g.Companions,
		Health:      a.health(s.GPU.Address),
	}
}

func (a *Agent) claimView(c ledger.Claim) api.Claim {
	v := api.Claim{
		ID:          c.ID,
		Node:        a.cfg.NodeName,
		State:       api.StateReserved,
		Labels:      c.Labels,
		CreatedAt:   c.CreatedAt,
		ExpiresAt:   c.ExpiresAt,
		CommittedAt: c.CommittedAt,
		GPUs:        make([]api.ClaimGPU, 0, len(c.GPUs)),
	}
	if c.State == ledger.StateCommitted {
		v.State = api.StateClaimed
	}
	for _, it := range c.Items {
		v.Items = append(v.Items, api.Item{Model: it.Model, Count: it.Count})
	}
	for _, addr := range c.GPUs {
		g, _ := a.gpu(addr)
		cg := api.ClaimGPU{PCIAddress: addr, Model: g.Model, IOMMUGroup: g.IOMMUGroup}
		if g.IOMMUGroup >= 0 {
			cg.VFIODevice = fmt.Sprintf("/dev/vfio/%d", g.IOMMUGroup)
		}
		v.GPUs = append(v.GPUs, cg)
	}
	return v
}

// Version is this build.
func (a *Agent) Version() api.VersionInfo { return VersionInfo() }

// resolve turns the user's model names into canonical ones (case, the
// "NVIDIA " prefix, spaces and dashes do not matter; a unique abbreviation
// is enough) and merges repeated models.
func (a *Agent) resolve(req api.ClaimRequest) (ledger.Request, error) {
	if len(req.GPUs) == 0 {
		return ledger.Request{}, api.Invalid("gpus", "a claim needs at least one GPU (e.g. --gpu \"H100 80GB:2\")")
	}
	if len(req.GPUs) > a.cfg.MaxGPUsPerClaim {
		return ledger.Request{}, api.Invalid("gpus", "%d items: at most %d", len(req.GPUs), a.cfg.MaxGPUsPerClaim)
	}
	names := a.modelNames()
	out := ledger.Request{Labels: req.Labels}
	index := map[string]int{}
	for i, it := range req.GPUs {
		field := fmt.Sprintf("gpus[%d]", i)
		model, err := a.inv.Catalog().MatchIn(it.Model, names)
		if err != nil {
			return ledger.Request{}, &api.Error{Code: api.CodeUnknownModel,
				Field: field + ".model", Message: err.Error(), KnownModels: names}
		}
		m := model.Name
		if it.Count < 1 || it.Count > a.cfg.MaxGPUsPerClaim {
			return ledger.Request{}, api.Invalid(field+".count", "count %d for %s: must be between 1 and %d", it.Count, m, a.cfg.MaxGPUsPerClaim)
		}
		if j, ok := index[m]; ok {
			out.Items[j].Count += it.Count
			continue
		}
		index[m] = len(out.Items)
		out.Items = append(out.Items, ledger.Item{Model: m, Count: it.Count})
	}
	return out, nil
}

// modelNames is every name a claim may ask for: the catalog, and the models
// missing from it that some server of the platform has.
func (a *Agent) modelNames() []string {
	names := a.inv.Catalog().Names()
	for _, t := range a.targets() {
		for m := range t.caps {
			if !slices.Contains(names, m) {
				names = append(names, m)
			}
		}
	}
	slices.Sort(names)
	return names
}

// apiError maps the ledger's errors to the API's.
func (a *Agent) apiError(err error) error {
	var (
		na   *ledger.NotAvailableError
		conf *ledger.ConflictError
		val  *ledger.ValidationError
		ae   *api.Error
	)
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &na):
		missing := make([]api.Item, len(na.Missing))
		for i, m := range na.Missing {
			missing[i] = api.Item{Model: m.Model, Count: m.Count}
		}
		return &api.Error{Code: api.CodeNotAvailable,
			Message: api.NotAvailableMessage(missing), Missing: missing}
	case errors.As(err, &conf):
		return &api.Error{Code: api.CodeConflict, Message: err.Error()}
	case errors.As(err, &val):
		return api.Invalid(val.Field, "%s", val.Error())
	case errors.Is(err, ledger.ErrNotFound):
		return &api.Error{Code: api.CodeNotFound, Message: err.Error()}
	case errors.Is(err, ledger.ErrLeaseExpired):
		return &api.Error{Code: api.CodeLeaseExpired, Message: err.Error()}
	case errors.Is(err, ledger.ErrCommitted):
		return &api.Error{Code: api.CodeConflict, Message: err.Error()}
	}
	var bf *bindFailure
	if errors.As(err, &bf) {
		return &api.Error{Code: api.CodeBindFailed, Message: err.Error()}
	}
	return err
}

// Sweep drops reservations whose lease ran out and returns their GPUs to
// the idle driver.
func (a *Agent) Sweep(ctx context.Context) {
	expired, err := a.ledger.Expire(a.now())
	if err != nil {
		a.log.Error("expiring reservations", "err", err)
		return
	}
	for _, c := range expired {
		a.bound.Delete(c.ID)
		a.rec.Reservation(ReservationExpired)
		a.log.Warn("reservation expired without commit; GPUs freed", "claim", c.ID, "coordinator", c.Coordinator, "gpus", c.GPUs)
		unlock := a.locks.lock(c.GPUs...)
		a.toIdleLocked(ctx, "reservation "+c.ID+" expired", c.GPUs, "")
		unlock()
	}
	if len(expired) > 0 {
		a.changed()
	}
}

// unclaimed keeps the addresses that no live claim holds (a GPU freed by an
// expired reservation may already be in a new claim).
func (a *Agent) unclaimed(addrs []string) []string {
	held := map[string]bool{}
	for _, s := range a.ledger.GPUStates(a.now()) {
		if s.ClaimID != "" {
			held[s.GPU.Address] = true
		}
	}
	var out []string
	for _, addr := range addrs {
		if !held[addr] {
			out = append(out, addr)
		}
	}
	return out
}
