package home

import (
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// A home remembers where each claim ID homed here was last released, from
// the owners' "gone" notices (sent again with every resync, each with its
// release time), so that a later claim of the ID without a preferred server
// goes back there (docs/protocol.md, "Restart on the old server").

// lastRelease is where, as its home, this agent last heard a claim ID was
// released.
type lastRelease struct {
	node string
	at   time.Time
}

// maxLastReleases bounds the releases a home remembers.
const maxLastReleases = 100000

// noteRelease records, at the home, that from released op.ID (at op.At, or
// now when the owner did not say). A later release wins over an earlier
// one whatever order they arrive in.
func (d *directory) noteRelease(from string, op api.DirOp, now time.Time) {
	at := op.At
	if at.IsZero() || at.After(now) {
		at = now
	}
	if old, ok := d.released[op.ID]; ok && old.at.After(at) {
		return
	}
	if len(d.released) >= maxLastReleases {
		d.forgetReleases(now, 0)
	}
	if old, ok := d.released[op.ID]; ok {
		delete(d.released, op.ID)
		add(d.counts.released, old.node, -1)
	}
	d.roomForRelease(from)
	d.released[op.ID] = lastRelease{node: from, at: at}
	add(d.counts.released, from, 1)
}

// lastOwner is the server claim id was last released on, if within keep.
func (d *directory) lastOwner(id string, now time.Time, keep time.Duration) string {
	r, ok := d.released[id]
	if !ok || now.Sub(r.at) >= keep {
		return ""
	}
	return r.node
}

// forgetReleases drops releases older than keep (all of them for keep 0
// when the map is full: the owners re-send theirs at the next resync).
func (d *directory) forgetReleases(now time.Time, keep time.Duration) {
	for id, r := range d.released {
		if keep == 0 || now.Sub(r.at) >= keep {
			delete(d.released, id)
			add(d.counts.released, r.node, -1)
		}
	}
}
