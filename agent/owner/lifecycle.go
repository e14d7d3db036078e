package owner

import (
	"context"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// A released claim is remembered (remember_released), so that a restart of
// its VM goes back to the server it ran on (docs/protocol.md).

// releasable is nil when claim id may be released now: no VM holds its
// GPUs open, or the release is forced (api.Forced).
func (o *Owner) releasable(ctx context.Context, id string) error {
	c, err := o.ledger.Get(id)
	if err != nil {
		return nil // the release itself answers not found
	}
	if api.Forced(ctx) {
		if used, _ := o.host.UsedBy(c.GPUs); len(used) > 0 {
			o.log.Warn("release forced while a VM uses the claim's GPUs; they return to the idle driver once it lets go", "claim", id, "in_use", used)
		}
		return nil
	}
	return o.host.RefuseInUse(id, c.GPUs)
}

// rememberedOps are the released claims this owner remembers, as directory
// notifications: sent again with every resync so that an ID's new home
// knows where it last ran.
func (o *Owner) rememberedOps() []api.DirOp {
	keep := time.Duration(o.cfg.RememberReleased)
	if keep <= 0 {
		return nil
	}
	rs, err := o.ledger.RecallAll(o.clk.Now(), keep)
	if err != nil {
		o.log.Warn("released claims not re-sent to their homes", "err", err)
		return nil
	}
	ops := make([]api.DirOp, 0, len(rs))
	for _, r := range rs {
		if _, err := o.ledger.Get(r.ID); err == nil {
			continue // held here again
		}
		ops = append(ops, api.DirOp{ID: r.ID, Op: api.DirOpGone, At: r.ReleasedAt})
	}
	return ops
}
