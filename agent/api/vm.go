package api

import (
	"context"
	"net/http"
)

// InUse is the process holding a GPU's VFIO group open: the VM's QEMU.
type InUse struct {
	PID  int    `json:"pid"`
	Comm string `json:"comm,omitempty"`
	// Domain is the VM's name when its command line shows it (QEMU's
	// `-name guest=NAME`, which libvirt always passes).
	Domain string `json:"domain,omitempty"`
}

// StateReturning is a free GPU whose VFIO group a process still holds open
// after its claim was released (by force): it goes back to the idle driver
// once the group is closed, and is offered to no claim until then.
const StateReturning = "returning"

// ReleaseRequest is the optional body of a release.
type ReleaseRequest struct {
	// Force releases a claim even while a VM holds its GPUs' VFIO groups
	// open; the GPUs then wait, unoffered, until the VM lets go.
	Force bool `json:"force,omitempty"`
}

type forceKey struct{}

// WithForce marks ctx as carrying a forced release, which the agent passes
// on to the claim's owner.
func WithForce(ctx context.Context) context.Context { return context.WithValue(ctx, forceKey{}, true) }

// Forced reports whether ctx carries a forced release.
func Forced(ctx context.Context) bool { v, _ := ctx.Value(forceKey{}).(bool); return v }

// ReleaseWith frees a claim's GPUs as req says (Force).
func (c *Client) ReleaseWith(ctx context.Context, id string, req ReleaseRequest) (Claim, error) {
	if req.Force {
		ctx = WithForce(ctx)
	}
	return c.Release(ctx, id)
}

// releaseBody is what a release sends: a body only when forced, so that
// an older agent, which accepts no body, still takes a plain release.
func releaseBody(ctx context.Context) any {
	if Forced(ctx) {
		return ReleaseRequest{Force: true}
	}
	return nil
}

// releaseContext reads a release's optional body into the request's context.
func releaseContext(w http.ResponseWriter, r *http.Request) (context.Context, error) {
	if r.ContentLength == 0 {
		return r.Context(), nil
	}
	var req ReleaseRequest
	if err := decode(w, r, &req); err != nil {
		return nil, err
	}
	if req.Force {
		return WithForce(r.Context()), nil
	}
	return r.Context(), nil
}
