package agent

import (
	"errors"
	"slices"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/host"
)

// The claim protocol's side of readiness (agent/host keeps the verdicts):
// an owner looks at every group a claim would bind before it touches any
// (host.LookBeforeBind), and says which GPU and device refused it; a
// coordinator passes the owners' refusals on with its final "not
// available" (withRefusals), after trying the other servers.

// refusedError is the owner's answer to a reservation that failed: when a
// GPU was refused for readiness on the way, a "not available" says which
// GPU and which device blocked it, so the coordinator moves on to another
// server and the operator reading it knows what to fix.
func (o *owner) refusedError(err error, refused *host.NotReadyFailure) error {
	ae, ok := o.apiError(err).(*api.Error)
	if !ok || refused == nil || ae.Code != api.CodeNotAvailable {
		return o.apiError(err)
	}
	out := *ae
	out.Refusals = []string{o.cfg.NodeName + ": " + refused.Error()}
	if !errors.As(err, new(*host.NotReadyFailure)) {
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
