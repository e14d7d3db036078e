package claim

import (
	"errors"
	"slices"

	"github.com/gpuherd/gpuherd/agent/api"
)

// The claim protocol's side of readiness (agent/host keeps the verdicts):
// an owner looks at every group a claim would bind before it touches any
// (host.LookBeforeBind), and says which GPU and device refused it; a
// coordinator passes the owners' refusals on with its final "not
// available" (withRefusals), after trying the other servers.

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
