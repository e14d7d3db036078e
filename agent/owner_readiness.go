package agent

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/vfio"
)

// The claim protocol's side of readiness (passthrough.go keeps the verdicts):
// an owner looks at every group a claim would bind before it touches any
// (owner.lookBeforeBind), and says which GPU and device refused it; a
// coordinator passes the owners' refusals on with its final "not
// available" (withRefusals), after trying the other servers.

// notReadyFailure is a claim refused before it changed anything: a GPU it
// would bind cannot be passed through now.
type notReadyFailure struct {
	claim, addr string
	verdict     vfio.Verdict
}

func (f *notReadyFailure) Error() string {
	return fmt.Sprintf("claim %s: GPU %s cannot be passed through: %s; no driver binding on this server was changed, and other servers may still serve the request",
		f.claim, f.addr, f.verdict.Reason())
}

// lookBeforeBind checks, with a fresh read, every GPU a claim would bind,
// before any of them is touched. A GPU found unusable is taken out of the
// offer at once. The caller holds the GPUs' device locks.
func (o *owner) lookBeforeBind(claim string, addrs []string) error {
	o.pass.mu.RLock()
	cfg := o.pass.cfg
	o.pass.mu.RUnlock()
	host := o.pci.ReadHostFacts()
	var refused *notReadyFailure
	for _, addr := range addrs {
		v, err := o.pci.Readiness(addr, cfg, &host)
		if err != nil || v.Ready() {
			continue // unreadable: the bind fails and fences it, as before
		}
		if refused == nil {
			refused = &notReadyFailure{claim: claim, addr: addr, verdict: v}
		}
	}
	if refused == nil {
		return nil
	}
	o.noteReadiness("claim "+claim, addrs)
	o.log.Warn("claim refused before any driver change", "claim", claim, "pci_address", refused.addr, "reason", refused.verdict.Reason())
	return refused
}

// refusedError is the owner's answer to a reservation that failed: when a
// GPU was refused for readiness on the way, a "not available" says which
// GPU and which device blocked it, so the coordinator moves on to another
// server and the operator reading it knows what to fix.
func (o *owner) refusedError(err error, refused *notReadyFailure) error {
	ae, ok := o.apiError(err).(*api.Error)
	if !ok || refused == nil || ae.Code != api.CodeNotAvailable {
		return o.apiError(err)
	}
	out := *ae
	out.Refusals = []string{o.cfg.NodeName + ": " + refused.Error()}
	if !errors.As(err, new(*notReadyFailure)) {
		out.Message = ae.Message + " on " + o.cfg.NodeName + ": " + refused.Error()
	}
	return &out
}

// refusalsOf returns the refusals an owner's "not available" carries.
func refusalsOf(err error) []string {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Refusals
	}
	return nil
}

// withRefusals adds the owners' refusals to the coordinator's final "not
// available", so the caller learns which GPU and device blocked it.
func withRefusals(err error, refusals []string) error {
	var ae *api.Error
	if len(refusals) == 0 || !errors.As(err, &ae) {
		return err
	}
	out := *ae
	out.Refusals = append(slices.Clone(ae.Refusals), refusals...)
	return &out
}
