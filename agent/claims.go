package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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

// Claim takes the GPUs of req on this server for id, binds them to vfio-pci
// and commits the claim. A retry with the same id and request returns the
// same claim.
func (a *Agent) Claim(ctx context.Context, id string, req api.ClaimRequest) (api.Claim, error) {
	lreq, err := a.resolve(req)
	if err != nil {
		return api.Claim{}, err
	}
	for attempt := 1; ; attempt++ {
		c, err := a.Reserve(ctx, id, lreq, "")
		if err != nil {
			var bf *bindFailure
			if errors.As(err, &bf) && attempt < bindAttempts {
				a.log.Warn("retrying claim on other GPUs", "claim", id, "attempt", attempt, "err", err)
				continue
			}
			return api.Claim{}, err
		}
		return a.Commit(ctx, c.ID)
	}
}

// Reserve takes the GPUs under a lease and binds them to vfio-pci; the
// coordinator then commits or lets the lease run out. A GPU that fails to bind
// is fenced off and the reservation dropped, so the caller may retry.
func (a *Agent) Reserve(ctx context.Context, id string, req ledger.Request, coordinator string) (ledger.Claim, error) {
	lease := time.Duration(a.cfg.ReservationLease)
	c, err := a.ledger.Reserve(id, req, coordinator, a.now(), lease)
	if err != nil {
		return ledger.Claim{}, a.apiError(err)
	}
	fresh := c.State == ledger.StateReserved
	unlock := a.locks.lock(c.GPUs...)
	defer unlock()
	for _, addr := range c.GPUs {
		if fresh {
			// Binding can take seconds per card; keep the lease ahead of it.
			if _, err := a.ledger.Extend(id, a.now(), lease); err != nil {
				return ledger.Claim{}, a.apiError(err)
			}
		}
		res, err := a.binder.Bind(ctx, addr)
		if err != nil {
			a.fence(addr, fmt.Sprintf("bind to vfio-pci failed: %v", err))
			if fresh {
				if _, rerr := a.ledger.Release(id, a.now()); rerr != nil && !errors.Is(rerr, ledger.ErrNotFound) {
					a.log.Error("dropping reservation after bind failure", "claim", id, "err", rerr)
				}
				a.toIdleLocked(ctx, c.GPUs, addr)
			}
			return ledger.Claim{}, &bindFailure{claim: id, addr: addr, err: err}
		}
		logChanges(a, "claim", id, res)
	}
	return c, nil
}

// Commit makes a reservation a claim that survives crashes of this agent.
func (a *Agent) Commit(ctx context.Context, id string) (api.Claim, error) {
	c, err := a.ledger.Commit(id, a.now())
	if err != nil {
		if errors.Is(err, ledger.ErrLeaseExpired) {
			// The GPUs went back to the pool; put them back on the idle driver.
			a.log.Warn("reservation expired before commit", "claim", id)
		}
		return api.Claim{}, a.apiError(err)
	}
	a.log.Info("claimed", "claim", id, "gpus", c.GPUs)
	return a.claimView(c), nil
}

type bindFailure struct {
	claim, addr string
	err         error
}

func (b *bindFailure) Error() string {
	return fmt.Sprintf("claim %s: GPU %s could not be bound to vfio-pci and was fenced off: %v", b.claim, b.addr, b.err)
}

func (b *bindFailure) Unwrap() error { return b.err }

// Release frees a claim's GPUs and returns them to the idle driver.
func (a *Agent) Release(ctx context.Context, id string) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, a.apiError(err)
	}
	c, err := a.ledger.Release(id, a.now())
	if err != nil {
		return api.Claim{}, a.apiError(err)
	}
	a.log.Info("released", "claim", id, "gpus", c.GPUs)
	unlock := a.locks.lock(c.GPUs...)
	a.toIdleLocked(ctx, c.GPUs, "")
	unlock()
	return a.claimView(c), nil
}

// toIdleLocked returns the GPUs of addrs that no live claim holds to the
// idle driver, skipping skip. The caller holds their device locks, so a
// claim that takes one of them now binds it only after this returns. Failures
// fence the GPU; the release itself already happened in the ledger.
func (a *Agent) toIdleLocked(ctx context.Context, addrs []string, skip string) {
	for _, addr := range a.unclaimed(addrs) {
		if addr == skip || a.health(addr) != "" {
			continue
		}
		res, err := a.binder.Release(ctx, addr, a.policy)
		if err != nil {
			a.fence(addr, fmt.Sprintf("return to idle driver %s failed: %v", a.policy, err))
			continue
		}
		logChanges(a, "release", "", res)
	}
}

func logChanges(a *Agent, op, claim string, res vfio.Result) {
	for _, ch := range res.Changes {
		a.log.Info("driver changed", "op", op, "claim", claim, "pci_address", ch.Address, "from", orNone(ch.From), "to", orNone(ch.To))
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// Get returns one claim.
func (a *Agent) Get(_ context.Context, id string) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, a.apiError(err)
	}
	c, err := a.ledger.Get(id)
	if err != nil {
		return api.Claim{}, a.apiError(err)
	}
	return a.claimView(c), nil
}

// Claims lists every claim of this server.
func (a *Agent) Claims(context.Context) ([]api.Claim, error) {
	cs := a.ledger.List()
	out := make([]api.Claim, 0, len(cs))
	now := a.now()
	for _, c := range cs {
		if !c.Live(now) {
			continue // an expired reservation, about to be swept
		}
		out = append(out, a.claimView(c))
	}
	return out, nil
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
		return &api.Error{Status: http.StatusNotFound, Code: api.CodeNotFound,
			Message: fmt.Sprintf("no GPU at %s on %s (see `gpuherd status`)", addr, a.cfg.NodeName)}
	}
	return nil
}

// Status lists this server's GPUs with their state.
func (a *Agent) Status(context.Context) (api.Status, error) {
	st := api.Status{Node: a.cfg.NodeName, Version: Version, GPUs: []api.GPU{}}
	for _, s := range a.ledger.GPUStates(a.now()) {
		st.GPUs = append(st.GPUs, a.stateView(s))
	}
	return st, nil
}

func (a *Agent) gpuView(addr string) (api.GPU, error) {
	for _, s := range a.ledger.GPUStates(a.now()) {
		if s.GPU.Address == addr {
			return a.stateView(s), nil
		}
	}
	return api.GPU{}, &api.Error{Status: http.StatusNotFound, Code: api.CodeNotFound, Message: "no GPU at " + addr}
}

func (a *Agent) stateView(s ledger.GPUState) api.GPU {
	g, _ := a.gpu(s.GPU.Address)
	v := api.GPU{
		PCIAddress:  s.GPU.Address,
		Model:       s.GPU.Model,
		MemoryBytes: g.MemoryBytes,
		NUMANode:    s.GPU.NUMANode,
		IOMMUGroup:  g.IOMMUGroup,
		Driver:      g.Driver,
		State:       string(s.Status),
		Claim:       s.ClaimID,
		DrainReason: s.DrainReason,
		UUID:        g.UUID,
		Companions:  g.Companions,
		Health:      a.health(s.GPU.Address),
	}
	// The driver is read live: it is what a VM start will find.
	if d, err := a.pci.Device(s.GPU.Address); err == nil {
		v.Driver = d.Driver
	} else {
		v.Driver = ""
	}
	return v
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

// Availability lists every model of the catalog and of this server, with
// how many are free here.
func (a *Agent) Availability(context.Context) (api.Availability, error) {
	totals := a.ledger.Totals(a.now())
	for _, name := range a.inv.Catalog().Names() {
		if _, ok := totals[name]; !ok {
			totals[name] = ledger.ModelTotals{}
		}
	}
	out := api.Availability{Node: a.cfg.NodeName}
	for name, t := range totals {
		out.Models = append(out.Models, api.ModelAvailability{
			Model: name, Available: t.Free > 0, Free: t.Free, Total: t.Total, Healthy: t.Healthy,
		})
	}
	slices.SortFunc(out.Models, func(x, y api.ModelAvailability) int {
		if x.Model < y.Model {
			return -1
		}
		if x.Model > y.Model {
			return 1
		}
		return 0
	})
	return out, nil
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
			return ledger.Request{}, &api.Error{Status: http.StatusBadRequest, Code: api.CodeUnknownModel,
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

// modelNames is every name a claim may ask for: the catalog and the
// unknown models found on this server.
func (a *Agent) modelNames() []string {
	names := a.inv.Catalog().Names()
	a.mu.RLock()
	for _, g := range a.gpus {
		if !slices.Contains(names, g.Model) {
			names = append(names, g.Model)
		}
	}
	a.mu.RUnlock()
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
		return &api.Error{Status: http.StatusConflict, Code: api.CodeNotAvailable,
			Message: api.NotAvailableMessage(missing), Missing: missing}
	case errors.As(err, &conf):
		return &api.Error{Status: http.StatusConflict, Code: api.CodeConflict, Message: err.Error()}
	case errors.As(err, &val):
		return api.Invalid(val.Field, "%s", val.Error())
	case errors.Is(err, ledger.ErrNotFound):
		return &api.Error{Status: http.StatusNotFound, Code: api.CodeNotFound, Message: err.Error()}
	case errors.Is(err, ledger.ErrLeaseExpired):
		return &api.Error{Status: http.StatusConflict, Code: api.CodeLeaseExpired, Message: err.Error()}
	}
	var bf *bindFailure
	if errors.As(err, &bf) {
		return &api.Error{Status: http.StatusInternalServerError, Code: api.CodeBindFailed, Message: err.Error()}
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
		a.log.Warn("reservation expired without commit; GPUs freed", "claim", c.ID, "coordinator", c.Coordinator, "gpus", c.GPUs)
		unlock := a.locks.lock(c.GPUs...)
		a.toIdleLocked(ctx, c.GPUs, "")
		unlock()
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
