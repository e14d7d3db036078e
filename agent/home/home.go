// Package home is the home role of the claim protocol (docs/protocol.md,
// "The claim directory"): every claim ID has a home, the live member with
// the highest rendezvous hash of (member, ID), which remembers in memory
// where the claim is held and which coordinator is placing it, so that a
// coordinator asks one server instead of all of them. Its records are
// memory only and never the truth (the owners' ledgers are); it vouches
// only when it may.
package home

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// Membership is the cluster as a home reads it.
type Membership interface {
	// Joined reports whether this agent has joined the cluster: before,
	// its view may lack servers that hold claims.
	Joined() bool
	// Peers names the other members a coordinator may ask now (alive,
	// their summary readable, with a peer API): with this agent, the
	// members among which every claim ID has its home.
	Peers() []string
}

// Deps is what a home uses.
type Deps struct {
	NodeName string      // this agent's name
	Clock    clock.Clock // when intents began, releases happened, the membership changed
	Members  Membership  // whether this agent may vouch, and for which IDs
	// DirectorySettle is how long after its start or a membership change
	// a home vouches for nothing (directory_settle): the time every owner
	// has to re-send its claims to their new homes.
	DirectorySettle time.Duration
	// RememberReleased is how long a home names the server a released
	// claim ID last ran on (remember_released).
	RememberReleased time.Duration
	// PendingTTL is how long an intent counts as a placement in progress:
	// a coordinator reserves and commits within it.
	PendingTTL time.Duration
}

// Home answers, as the home of claim IDs, where they are held and who is
// placing them.
type Home struct {
	node       string
	clk        clock.Clock
	members    Membership
	settle     time.Duration
	keep       time.Duration
	pendingTTL time.Duration
	dir        *directory
}

// New is the home of this agent, starting now with no records: it vouches
// for nothing until DirectorySettle has passed.
func New(d Deps) *Home {
	return &Home{
		node:       d.NodeName,
		clk:        d.Clock,
		members:    d.Members,
		settle:     d.DirectorySettle,
		keep:       d.RememberReleased,
		pendingTTL: d.PendingTTL,
		dir:        newDirectory(d.Clock.Now()),
	}
}

var _ api.Directory = (*Home)(nil)

// BeginClaim records that req.Coordinator is about to place claim id, and
// answers DirNew when this home vouches that the ID is held nowhere. When it
// cannot vouch, the intent is still recorded (the answer is DirUnsure), so
// that lookups see a placement in progress.
func (h *Home) BeginClaim(_ context.Context, id string, req api.DirBegin) (api.DirAnswer, error) {
	if err := validID(id); err != nil {
		return api.DirAnswer{}, err
	}
	if err := validNode("coordinator", req.Coordinator); err != nil {
		return api.DirAnswer{}, err
	}
	now := h.clk.Now()
	vouch := h.trusted(now) && h.IsHome(id)
	d := h.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	ans, ok := d.answer(id, now, h.pendingTTL)
	if ok && ans.State != api.DirUnsure {
		return ans, nil
	}
	if err := d.setIntent(id, req.Coordinator, now, h.pendingTTL); err != nil {
		return api.DirAnswer{}, err
	}
	if ok || !vouch {
		return api.DirAnswer{State: api.DirUnsure}, nil
	}
	return api.DirAnswer{State: api.DirNew, LastOwner: d.lastOwner(id, now, h.keep)}, nil
}

// LookupDirectory answers where claim id is, as far as this home knows.
func (h *Home) LookupDirectory(_ context.Context, id string) (api.DirAnswer, error) {
	if err := validID(id); err != nil {
		return api.DirAnswer{}, err
	}
	now := h.clk.Now()
	vouch := h.trusted(now) && h.IsHome(id)
	d := h.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	if ans, ok := d.answer(id, now, h.pendingTTL); ok {
		return ans, nil
	}
	last := d.lastOwner(id, now, h.keep)
	if vouch {
		return api.DirAnswer{State: api.DirAbsent, LastOwner: last}, nil
	}
	return api.DirAnswer{State: api.DirUnsure, LastOwner: last}, nil
}

// UpdateDirectory applies an owner's (or a coordinator's) notifications, in
// their order.
func (h *Home) UpdateDirectory(_ context.Context, u api.DirUpdate) error {
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
		d.forgetReleases(now, h.keep)
	}
	return nil
}

// Member is a usable member of the cluster as a home tracks it: its name
// and the boot of its run (a new one when it restarts behind the same name).
type Member struct {
	Name string
	Boot uint64
}

// NoteMembership takes the usable members now, this agent among them, and
// reports whether they changed since the last call: a member came, went,
// or restarted. After a change this home vouches for nothing until
// DirectorySettle has passed, and forgets the intents of coordinators that
// are no longer members: they place nothing any more.
//
// It runs on every change of the view, capacity updates included, so it
// compares an order-independent digest instead of sorted names.
func (h *Home) NoteMembership(members []Member) bool {
	var set uint64
	for _, m := range members {
		set += rendezvous(m.Name, strconv.FormatUint(m.Boot, 16))
	}
	d := h.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	if set == d.members {
		return false
	}
	d.members = set
	d.changed = h.clk.Now()
	d.dropIntentsOf(func(n string) bool {
		return n == h.node || slices.ContainsFunc(members, func(m Member) bool { return m.Name == n })
	})
	return true
}

// IsHome reports whether this agent is the home of id by its own view: the
// same choice as Of over this agent and its peers, without building them.
func (h *Home) IsHome(id string) bool {
	me := h.node
	best, bestW := me, rendezvous(me, id)
	for _, m := range h.members.Peers() {
		if w := rendezvous(m, id); w > bestW || (w == bestW && m < best) {
			best, bestW = m, w
		}
	}
	return best == me
}

// trusted reports whether this agent may vouch, as a home, that an ID it
// has no entry for is held nowhere: it has joined the cluster, and neither
// its start nor the last membership change is less than directory_settle
// ago, which gives every owner the time to re-send its claims to their new
// homes.
func (h *Home) trusted(now time.Time) bool {
	if !h.members.Joined() {
		return false
	}
	h.dir.mu.Lock()
	changed := h.dir.changed
	h.dir.mu.Unlock()
	return now.Sub(changed) >= h.settle
}

// Stats counts what a home remembers.
type Stats struct {
	Entries  int            // claim IDs held or being placed
	Releases int            // claim IDs remembered released
	Intents  map[string]int // placements in progress, by coordinator
}

// Stats counts this home's records now.
func (h *Home) Stats() Stats {
	d := h.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	return Stats{Entries: len(d.entries), Releases: len(d.released), Intents: maps.Clone(d.counts.intents)}
}

// Knows reports whether this home has a record of claim id: the servers
// that hold it, or the coordinator placing it (however old).
func (h *Home) Knows(id string) bool {
	d := h.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.entries[id] != nil
}

// LastOwner is the server claim id was last released on, within
// remember_released, or "".
func (h *Home) LastOwner(id string) string {
	d := h.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastOwner(id, h.clk.Now(), h.keep)
}

// ForgetReleases forgets every release this home remembers, as a restart
// of its agent does.
func (h *Home) ForgetReleases() {
	d := h.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	d.released = map[string]lastRelease{}
	d.counts.released = map[string]int{}
}

// validID refuses an ID the ledger refuses, worded as the agent's other
// refusals of a ledger.ValidationError.
func validID(id string) error {
	err := ledger.ValidateID(id)
	var val *ledger.ValidationError
	if errors.As(err, &val) {
		return api.Invalid(val.Field, "%s", val.Error())
	}
	return err
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
