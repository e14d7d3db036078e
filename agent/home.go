package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
)

// home answers, as the home of claim IDs, where they are held and who is
// placing them (docs/protocol.md, "The claim directory"). Its records are
// memory only and never the truth; it vouches only when it may.
type home struct {
	*Agent
}

var _ api.Directory = (*Agent)(nil)

// BeginClaim records that req.Coordinator is about to place claim id, and
// answers DirNew when this home vouches that the ID is held nowhere. When it
// cannot vouch, the intent is still recorded (the answer is DirUnsure), so
// that lookups see a placement in progress.
func (h *home) BeginClaim(_ context.Context, id string, req api.DirBegin) (api.DirAnswer, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.DirAnswer{}, h.apiError(err)
	}
	if err := validNode("coordinator", req.Coordinator); err != nil {
		return api.DirAnswer{}, err
	}
	now := h.clk.Now()
	vouch := h.dirTrusted(now) && h.isHome(id)
	d := h.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	ans, ok := d.answer(id, now, h.pendingTTL())
	if ok && ans.State != api.DirUnsure {
		return ans, nil
	}
	if err := d.setIntent(id, req.Coordinator, now, h.pendingTTL()); err != nil {
		return api.DirAnswer{}, err
	}
	if ok || !vouch {
		return api.DirAnswer{State: api.DirUnsure}, nil
	}
	return api.DirAnswer{State: api.DirNew, LastOwner: d.lastOwner(id, now, time.Duration(h.cfg.RememberReleased))}, nil
}

// LookupDirectory answers where claim id is, as far as this home knows.
func (h *home) LookupDirectory(_ context.Context, id string) (api.DirAnswer, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.DirAnswer{}, h.apiError(err)
	}
	now := h.clk.Now()
	vouch := h.dirTrusted(now) && h.isHome(id)
	d := h.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	if ans, ok := d.answer(id, now, h.pendingTTL()); ok {
		return ans, nil
	}
	last := d.lastOwner(id, now, time.Duration(h.cfg.RememberReleased))
	if vouch {
		return api.DirAnswer{State: api.DirAbsent, LastOwner: last}, nil
	}
	return api.DirAnswer{State: api.DirUnsure, LastOwner: last}, nil
}

// UpdateDirectory applies an owner's (or a coordinator's) notifications, in
// their order.
func (h *home) UpdateDirectory(_ context.Context, u api.DirUpdate) error {
	if err := validNode("from", u.From); err != nil {
		return err
	}
	if len(u.Ops) > api.MaxDirUpdateIDs {
		return api.Invalid("ops", "%d operations: at most %d", len(u.Ops), api.MaxDirUpdateIDs)
	}
	for i, op := range u.Ops {
		if err := ledger.ValidateID(op.ID); err != nil {
			return api.Invalid(fmt.Sprintf("ops[%d].id", i), "%v", err)
		}
		switch op.Op {
		case api.DirOpHeld, api.DirOpGone, api.DirOpAbandon:
		default:
			return api.Invalid(fmt.Sprintf("ops[%d].op", i), "%q: must be %s, %s or %s", truncateName(op.Op), api.DirOpHeld, api.DirOpGone, api.DirOpAbandon)
		}
	}
	now := h.clk.Now()
	d := h.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, op := range u.Ops {
		if err := d.apply(u.From, op, now); err != nil {
			if i > 0 {
				var e *api.Error
				if errors.As(err, &e) {
					e.Message = fmt.Sprintf("%s (the first %d operations were applied)", e.Message, i)
				}
			}
			return err
		}
	}
	d.forget(now)
	if len(d.released) >= maxLastReleases/2 {
		d.forgetReleases(now, time.Duration(h.cfg.RememberReleased))
	}
	return nil
}

// isHome reports whether this agent is the home of id by its own view: the
// same choice as homeOf over targets, without building them.
func (h *home) isHome(id string) bool {
	me := h.cfg.NodeName
	best, bestW := me, rendezvous(me, id)
	for _, m := range h.cluster.g.Members() {
		if m.Self || !m.Usable() || m.Summary.PeerAddr == "" {
			continue // as clusterState.peers
		}
		if w := rendezvous(m.Name, id); w > bestW || (w == bestW && m.Name < best) {
			best, bestW = m.Name, w
		}
	}
	return best == me
}

// dirTrusted reports whether this agent may vouch, as a home, that an ID it
// has no entry for is held nowhere: it has joined the cluster, and neither
// its start nor the last membership change is less than directory_settle
// ago, which gives every owner the time to re-send its claims to their new
// homes.
func (h *home) dirTrusted(now time.Time) bool {
	if h.cluster == nil || !h.cluster.joined.Load() {
		return false
	}
	h.dir.mu.Lock()
	changed := h.dir.changed
	h.dir.mu.Unlock()
	return now.Sub(changed) >= time.Duration(h.cfg.DirectorySettle)
}

// pendingTTL is how long an intent counts as a placement in progress: a
// coordinator reserves within reserveTimeout and commits within a lease.
func (a *Agent) pendingTTL() time.Duration {
	return reserveTimeout + time.Duration(a.cfg.ReservationLease) + 5*time.Second
}

func validNode(field, name string) error {
	if name == "" || len(name) > ledger.MaxCoordinatorLen || strings.ContainsFunc(name, func(r rune) bool { return r < 0x21 || r == 0x7f }) {
		return api.Invalid(field, "node name %q: must be 1 to %d printable characters without spaces", truncateName(name), ledger.MaxCoordinatorLen)
	}
	return nil
}

func truncateName(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
