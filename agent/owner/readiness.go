package owner

import (
	"errors"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/host"
)

// refusedError is the owner's answer to a reservation that failed: when a
// GPU was refused for readiness on the way, a "not available" says which
// GPU and which device blocked it, so the coordinator moves on to another
// server and the operator reading it knows what to fix.
func (o *Owner) refusedError(err error, refused *host.NotReadyFailure) error {
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
