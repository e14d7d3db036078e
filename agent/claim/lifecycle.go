package claim

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/placement"
)

// The VM's life cycle: stopping a VM releases its claim; starting it again
// claims the same ID. The owner remembers a released claim (its ledger,
// for remember_released) and tells the ID's home, which remembers the
// server in memory (agent/home); a later claim of the ID without a preferred server
// goes back there, and when that server cannot hold it the answer is "not
// available" with what it can hold (the platform's "Select an alternative
// GPU"). With any_node such a claim is placed elsewhere instead, with a
// warning. The owners re-send what they remember when the homes move, so
// the memory survives a home's restart.

// vCPU guidance of the platform: 8 to 16 vCPUs per GPU.
const (
	minVCPUsPerGPU = 8
	maxVCPUsPerGPU = 16
)

// vcpuWarning is the advice for a VM of vcpus vCPUs with gpus GPUs, or "".
func vcpuWarning(vcpus, gpus int) string {
	if vcpus <= 0 || gpus <= 0 {
		return ""
	}
	lo, hi := minVCPUsPerGPU*gpus, maxVCPUsPerGPU*gpus
	if vcpus >= lo && vcpus <= hi {
		return ""
	}
	return fmt.Sprintf("%d vCPUs for %d GPU(s) is %.1f per GPU; the platform recommends %d to %d per GPU (%d to %d vCPUs for this VM)",
		vcpus, gpus, float64(vcpus)/float64(gpus), minVCPUsPerGPU, maxVCPUsPerGPU, lo, hi)
}

// validateVCPUs refuses a vCPU count no VM can have.
func validateVCPUs(vcpus int) error {
	if vcpus < 0 || vcpus > 4096 {
		return api.Invalid("vcpus", "%d: must be between 1 and 4096, or left out", vcpus)
	}
	return nil
}

// withVCPUWarning adds the vCPU advice to a granted claim.
func withVCPUWarning(c api.Claim, vcpus int) api.Claim {
	n := 0
	for _, it := range c.Items {
		n += it.Count
	}
	if w := vcpuWarning(vcpus, n); w != "" {
		c.Warnings = append(c.Warnings, w)
	}
	return c
}

// recalled is the server a claim goes back to: the one it last ran on,
// unless the caller named one.
func recalled(prefer, last string) string {
	if prefer != "" {
		return ""
	}
	return last
}

// stays reports whether a reservation on server may be committed as far
// as last, the server the ID last ran on, is concerned: nothing is
// remembered, it is that server, or (with any_node) that server cannot
// hold the request by this attempt's view.
func (at *attempt) stays(last, server string) bool {
	if last == "" || last == server {
		return true
	}
	if !at.anyNode {
		return false
	}
	t, ok := targetNamed(at.view, last)
	if !ok {
		return true
	}
	return len(placement.Rank([]placement.Server{t.server}, at.want, "", nil)) == 0
}

// returnTo finishes a placement whose ID's home vouched for it: when it
// reserved elsewhere than last while last can hold it, the reservation is
// dropped and the claim placed with last first (other servers still follow
// if last refuses).
func (at *attempt) returnTo(ctx context.Context, last string, c api.Claim, err error) (api.Claim, error) {
	var nv *notVouched
	if !errors.As(err, &nv) {
		return at.notePlaced(last, c, err)
	}
	if nv.held {
		// The owner already held it committed (a retry): that is the claim.
		return at.commit(ctx, nv.t)
	}
	at.abortReservation(ctx, nv.t)
	at.log.Info("claim goes back to the server it last ran on", "claim", at.id, "node", last, "reserved_first_on", nv.t.name)
	p := *at
	p.prefer = last
	c, err = p.placeVouched(ctx, func(string) bool { return true })
	return at.notePlaced(last, c, err)
}

// goBack is the answer of a placement that found the ID remembered on
// node, the server it last ran on, without committing it there: the claim
// may not move (no any_node), and coordinator.claimWhere places it on node
// alone, or answers with what node can hold.
type goBack struct{ node string }

func (g *goBack) Error() string { return "the claim goes back to " + g.node }

// mustReturn finishes a placement whose ID's home vouched for it and
// remembers last, when the claim may not move: committed on last, it is
// done; a reservation elsewhere is dropped and the answer is a *goBack.
func (at *attempt) mustReturn(ctx context.Context, last string, c api.Claim, err error) (api.Claim, error) {
	var nv *notVouched
	switch {
	case errors.As(err, &nv):
		if nv.held {
			// The owner already held it committed (a retry): that is the claim.
			return at.commit(ctx, nv.t)
		}
		at.abortReservation(ctx, nv.t)
	case err == nil || errors.Is(err, errCommitUnknown):
		return at.notePlaced(last, c, err)
	}
	return api.Claim{}, &goBack{node: last}
}

// notePlaced warns when a claim of a remembered ID was placed elsewhere
// than last, the server it last ran on.
func (at *attempt) notePlaced(last string, c api.Claim, err error) (api.Claim, error) {
	if err != nil || last == "" || c.Node == last {
		return c, err
	}
	why := "cannot hold " + api.DescribeItems(c.Items) + " now"
	if _, seen := targetNamed(at.view, last); !seen {
		why = "this agent does not see now"
	}
	c.Warnings = append(c.Warnings, fmt.Sprintf("claim %s last ran on %s, which %s; placed on %s", at.id, last, why, c.Node))
	return c, nil
}
