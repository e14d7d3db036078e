package owner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/vfio"
)

// The libvirt hook's side of the owner: a domain may start only on GPUs its
// claim holds on this server, and the claim remembers which domain runs on
// it, so that the domain's stop can release it and no other domain's can.
// The owner decides, as for every claim of its GPUs; the Agent serves it on
// the local socket only (api.Domains).

var _ api.Domains = (*Owner)(nil)

// bootID names this boot of the host: a use recorded in another boot is
// stale, as no VM outlives a reboot. "" when it cannot be read (then uses
// never go stale by themselves).
var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})

// UseClaim checks that a domain may run on claim id's GPUs and, unless
// req.CheckOnly, marks the claim in use by it (see api.UseRequest).
func (o *Owner) UseClaim(_ context.Context, id string, req api.UseRequest) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, o.apiError(err)
	}
	if req.DomainUUID == "" {
		return api.Claim{}, api.Invalid("domain_uuid", "name the domain by its UUID")
	}
	for i, addr := range req.PCIAddresses {
		if err := vfio.ValidateAddress(addr); err != nil {
			return api.Claim{}, api.Invalid(fmt.Sprintf("pci_addresses[%d]", i), "%v", err)
		}
	}
	named := o.managedAmong(req.PCIAddresses)
	c, err := o.ledger.Get(id)
	if err != nil || !c.Named() {
		return api.Claim{}, o.notClaimed(id, named, fmt.Sprintf("claim %s is not held on %s", id, o.cfg.NodeName), false)
	}
	held := o.functionsOf(c.GPUs)
	var foreign []string
	for _, addr := range named {
		if !held[addr] {
			foreign = append(foreign, addr)
		}
	}
	if len(foreign) > 0 {
		return api.Claim{}, o.notClaimed(id, foreign, fmt.Sprintf("claim %s holds %s on %s", id, strings.Join(c.GPUs, ", "), o.cfg.NodeName), true)
	}

	// Under the device locks no bind or release of these GPUs runs, so the
	// drivers read here are the ones the VM will find.
	unlock := o.host.LockGPUs(c.GPUs...)
	defer unlock()
	var unbound, drivers []string
	for _, addr := range named {
		d, err := o.host.Device(addr)
		if err == nil && d.Driver == vfio.DriverVFIO {
			continue
		}
		unbound = append(unbound, addr)
		switch {
		case err != nil:
			drivers = append(drivers, fmt.Sprintf("%s unreadable (%v)", addr, err))
		default:
			drivers = append(drivers, addr+" on "+host.OrNone(d.Driver))
		}
	}
	if len(unbound) > 0 {
		return api.Claim{}, &api.Error{Code: api.CodeNotBound, PCIAddresses: unbound,
			Message: fmt.Sprintf("GPUs of claim %s are not on vfio-pci: %s; something rebound them behind gpuherd (a managed='yes' domain, a manual bind): the agent binds them back within driver_check_interval (30 s by default) or at its restart (systemctl restart gpuherd), then start the domain again; `gpuherd status` and the agent's log say if they stay off", id, strings.Join(drivers, ", "))}
	}
	if req.CheckOnly {
		return o.ClaimView(c), nil
	}
	use := ledger.Use{Domain: req.DomainUUID, Name: req.DomainName, BootID: bootID(), Started: req.Started}
	marked, err := o.ledger.MarkUse(id, c.GPUs, use, o.clk.Now())
	var inUse *ledger.InUseError
	switch {
	case errors.As(err, &inUse):
		return api.Claim{}, &api.Error{Code: api.CodeInUse,
			Message: fmt.Sprintf("claim %s is in use by domain %s (%s) since %s; one domain runs on a claim at a time: stop that one first",
				id, host.OrNone(inUse.Use.Name), inUse.Use.Domain, inUse.Use.Since.Format("2006-01-02 15:04:05Z07:00"))}
	case errors.Is(err, ledger.ErrNotFound):
		return api.Claim{}, o.notClaimed(id, named, fmt.Sprintf("claim %s was released while the domain was checked", id), false)
	case err != nil:
		return api.Claim{}, o.apiError(err)
	}
	if marked.Use != c.Use {
		o.log.Info("claim in use by domain", "claim", id, "domain", req.DomainName, "domain_uuid", req.DomainUUID, "started", marked.Use.Started)
	}
	return o.ClaimView(marked), nil
}

// EndUse ends a domain's use of claim id; with release, the claim is
// released too, if that domain had marked it and started.
func (o *Owner) EndUse(ctx context.Context, id, domainUUID string, release bool) (api.UseEnd, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.UseEnd{}, o.apiError(err)
	}
	unlockID := o.commitLocks.Lock(id) // as in owner.abort: no hold of the ID until its name is let go
	defer unlockID()
	c, released, err := o.ledger.EndUse(id, domainUUID, release, o.clk.Now())
	switch {
	case errors.Is(err, ledger.ErrNotMarked):
		o.log.Info("domain stopped without using the claim; nothing changed", "claim", id, "domain_uuid", domainUUID)
		return api.UseEnd{Claim: o.ClaimView(c), Reason: fmt.Sprintf("claim %s is not in use by domain %s: nothing released", id, domainUUID)}, nil
	case err != nil:
		return api.UseEnd{}, o.apiError(err)
	}
	if !released {
		reason := ""
		if release {
			reason = fmt.Sprintf("domain %s never started on claim %s: nothing released", domainUUID, id)
		}
		o.log.Info("domain stopped; claim kept", "claim", id, "domain_uuid", domainUUID, "release_asked", release)
		return api.UseEnd{Claim: o.ClaimView(c), Reason: reason}, nil
	}
	o.rec.Reservation(events.ReservationReleased)
	o.dirNote(id, api.DirOpGone)
	o.releasedName(ctx, c)
	o.log.Info("released", "claim", id, "gpus", c.GPUs, "why", "domain "+domainUUID+" stopped")
	unlock := o.host.LockGPUs(c.GPUs...)
	o.host.ToIdleLocked(ctx, "release "+id+" at domain stop", c.GPUs, "")
	unlock()
	o.changed()
	return api.UseEnd{Claim: o.ClaimView(c), Released: true}, nil
}

// notClaimed is the refusal a VM start shows: what is wrong with claim
// id (why; exists when the claim is held here, on other GPUs), which
// claims of this server hold addrs instead (also in HeldBy, for the hook's
// advice), and what to do.
func (o *Owner) notClaimed(id string, addrs []string, why string, exists bool) error {
	if len(addrs) == 0 {
		return &api.Error{Code: api.CodeNotClaimed, Message: fmt.Sprintf("claim %s: %s", id, why)}
	}
	holders := o.holdersOf(addrs, id)
	give := fmt.Sprintf("claim GPUs for %s on %s (gpuherd claim %s --gpu MODEL --prefer-node %s --same-node) and give the domain those (gpuherd get %s -o libvirt)",
		id, o.cfg.NodeName, id, o.cfg.NodeName, id)
	if exists {
		give = fmt.Sprintf("give the domain the GPUs of claim %s (gpuherd get %s -o libvirt)", id, id)
	}
	todo := "no other claim holds them: " + give
	if len(holders) > 0 {
		todo = fmt.Sprintf("they are held by claim %s: run the domain on that claim (the id in its gpuherd metadata), or %s",
			strings.Join(holders, ", claim "), give)
	}
	return &api.Error{Code: api.CodeNotClaimed, Message: api.NotClaimedMessage(id, addrs) + " (" + why + "; " + todo + ")",
		PCIAddresses: addrs, HeldBy: holders}
}

// holdersOf lists the committed claims other than id that hold one of the
// functions addrs, sorted.
func (o *Owner) holdersOf(addrs []string, id string) []string {
	var out []string
	for _, c := range o.ledger.List() {
		if c.ID == id || c.State != ledger.StateCommitted {
			continue
		}
		fns := o.functionsOf(c.GPUs)
		for _, addr := range addrs {
			if fns[addr] {
				out = append(out, c.ID)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// managedAmong keeps the addresses that are this server's GPUs or their
// companion functions, sorted.
func (o *Owner) managedAmong(addrs []string) []string {
	all := o.host.Addresses()
	ours := o.functionsOf(all)
	var out []string
	for _, addr := range addrs {
		if ours[addr] && !slices.Contains(out, addr) {
			out = append(out, addr)
		}
	}
	slices.Sort(out)
	return out
}

// functionsOf is the GPUs at gpus with their companion functions.
func (o *Owner) functionsOf(gpus []string) map[string]bool {
	out := map[string]bool{}
	for _, addr := range gpus {
		out[addr] = true
		if g, ok := o.host.GPU(addr); ok {
			for _, c := range g.Companions {
				out[c] = true
			}
		}
	}
	return out
}
