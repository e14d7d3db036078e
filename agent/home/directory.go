package home

import (
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// The claim directory (docs/protocol.md, "The claim directory"). Every claim
// ID has a home: the live member with the highest rendezvous hash of
// (member, ID). The home remembers, in memory, on which servers the claim is
// held and which coordinator is placing it now, so that a coordinator asks
// one server instead of all of them. It is a shortcut, never the truth (the
// owners' ledgers are): whenever the home cannot vouch for its answer — it
// started or the membership changed less than directory_settle ago, or its
// record is stale — the coordinator asks every server, as without it.

const dirForget = 10 * time.Minute // a stale intent is forgotten after this

// dirEntry is what the home knows about one claim ID.
type dirEntry struct {
	owners      []string  // servers that reported the claim committed
	coordinator string    // the coordinator placing it, when owners is empty
	since       time.Time // when that coordinator began
}

// directory is this agent's part of the directory: the entries of the IDs
// homed here.
type directory struct {
	mu      sync.Mutex
	entries map[string]*dirEntry
	changed time.Time // the membership last changed, or this agent started
	members uint64    // digest of the membership it changed to (name and boot of every usable member)

	// released: where the IDs homed here were last released (releases.go).
	released map[string]lastRelease

	// counts: the records above per caller, for their bounds (quota.go).
	counts dirCounts
}

func newDirectory(now time.Time) *directory {
	return &directory{entries: map[string]*dirEntry{}, changed: now, released: map[string]lastRelease{}, counts: newDirCounts()}
}

// rendezvous is the weight of node for claim id; the highest weight wins.
func rendezvous(node, id string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(node))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(id))
	// FNV's low bits mix poorly: finish with splitmix64's mixer.
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Of is the home of claim id among members, which are never empty (the
// agent asking is always one) and named by name: the member with the
// highest rendezvous weight for id, the least name on a tie. Every agent
// computes the same home from the same membership, and a member that comes
// or goes moves only the IDs it was home for.
func Of[M any](id string, members []M, name func(M) string) M {
	best, bestName := members[0], name(members[0])
	bestW := rendezvous(bestName, id)
	for _, m := range members[1:] {
		n := name(m)
		if w := rendezvous(n, id); w > bestW || (w == bestW && n < bestName) {
			best, bestName, bestW = m, n, w
		}
	}
	return best
}

// answer is the home's answer from its entry for id; false when there is none.
func (d *directory) answer(id string, now time.Time, ttl time.Duration) (api.DirAnswer, bool) {
	e := d.entries[id]
	switch {
	case e == nil:
		return api.DirAnswer{}, false
	case len(e.owners) > 0:
		return api.DirAnswer{State: api.DirHeld, Owners: slices.Clone(e.owners)}, true
	case now.Sub(e.since) < ttl:
		return api.DirAnswer{State: api.DirPending, Coordinator: e.coordinator}, true
	}
	return api.DirAnswer{State: api.DirUnsure}, true
}

// apply applies one notification of from, which the peer API verified to
// be the caller: an owner adds or removes only itself, a coordinator drops
// only its own intent. It refuses a record past from's bound (quota.go).
func (d *directory) apply(from string, op api.DirOp, now time.Time) error {
	e := d.entries[op.ID]
	switch op.Op {
	case api.DirOpHeld:
		if e == nil || !slices.Contains(e.owners, from) {
			if d.counts.held[from] >= HeldPerCaller {
				return limitError("claims reported held", from, HeldPerCaller)
			}
		}
		if e == nil {
			e = &dirEntry{}
			d.entries[op.ID] = e
		}
		if !slices.Contains(e.owners, from) {
			e.owners = append(e.owners, from)
			slices.Sort(e.owners)
			add(d.counts.held, from, 1)
		}
		if e.coordinator != "" {
			add(d.counts.intents, e.coordinator, -1)
		}
		e.coordinator, e.since = "", now
	case api.DirOpGone:
		if e != nil && len(e.owners) > 0 && !slices.Contains(e.owners, from) {
			// Not the server that holds it: neither a release nor where
			// the ID last ran (an owner re-sending an old release of an
			// ID held elsewhere now has nothing to say either).
			return nil
		}
		d.noteRelease(from, op, now)
		if e == nil {
			return nil
		}
		if slices.Contains(e.owners, from) {
			e.owners = slices.DeleteFunc(e.owners, func(o string) bool { return o == from })
			add(d.counts.held, from, -1)
		}
		if len(e.owners) == 0 && e.coordinator == "" {
			delete(d.entries, op.ID)
		}
	case api.DirOpAbandon:
		if e != nil && len(e.owners) == 0 && e.coordinator == from {
			d.dropEntry(op.ID)
		}
	}
	return nil
}

// forget drops intents that went stale long ago: the owners' periodic
// resync has re-sent whatever they became.
func (d *directory) forget(now time.Time) {
	if len(d.entries) < 1024 {
		return
	}
	for id, e := range d.entries {
		if len(e.owners) == 0 && now.Sub(e.since) > dirForget {
			d.dropEntry(id)
		}
	}
}
