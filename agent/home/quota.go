package home

import (
	"fmt"
	"slices"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// Bounds on what one caller can make a home remember (docs/protocol.md,
// "Who may say what"). A home's records come from other agents' calls;
// without a bound per caller, one agent of the cluster's CA could grow a
// home's memory without end, or fill a shared bound and push everyone
// else's records out. A caller speaks only for itself (the peer API checks
// its certificate), so counting per caller bounds every caller.
const (
	// IntentsPerCaller bounds the placements one coordinator has in
	// progress at one home. A coordinator places a claim in milliseconds
	// to seconds; thousands at once at one home is not a coordinator.
	IntentsPerCaller = 4096
	// HeldPerCaller bounds the claims one owner reports held to one
	// home: every claim holds at least one GPU of its owner.
	HeldPerCaller = 4096
	// ReleasesPerCaller bounds the releases of one owner a home
	// remembers (for remember_released); past it, that owner's oldest
	// half is forgotten, nobody else's.
	ReleasesPerCaller = 4 * IntentsPerCaller
	// dirSweepEvery spaces the sweeps of expired intents that a caller
	// at its bound triggers.
	dirSweepEvery = time.Second
)

// dirCounts are the records a home keeps per caller.
type dirCounts struct {
	intents  map[string]int // by coordinator
	held     map[string]int // by owner
	released map[string]int // by the owner that released
	sweptAt  time.Time
}

func newDirCounts() dirCounts {
	return dirCounts{intents: map[string]int{}, held: map[string]int{}, released: map[string]int{}}
}

// add changes m[who] by n, dropping zero counts so that callers that hold
// nothing cost nothing.
func add(m map[string]int, who string, n int) {
	if v := m[who] + n; v > 0 {
		m[who] = v
	} else {
		delete(m, who)
	}
}

// limitError is the refusal of a record past a caller's bound.
func limitError(what, who string, max int) error {
	return &api.Error{Code: api.CodeLimit, Message: fmt.Sprintf(
		"%s: %s already has %d at this home, the most one agent may; they expire with their lease (or when %s leaves the cluster)", what, who, max, who)}
}

// setIntent records that coordinator is placing id, replacing an entry
// without owners (a stale intent). The caller holds d.mu.
func (d *directory) setIntent(id, coordinator string, now time.Time, ttl time.Duration) error {
	old := d.entries[id]
	if old == nil || old.coordinator != coordinator {
		if d.counts.intents[coordinator] >= IntentsPerCaller {
			d.sweepIntents(now, ttl)
		}
		if d.counts.intents[coordinator] >= IntentsPerCaller {
			return limitError("claim placements in progress", coordinator, IntentsPerCaller)
		}
	}
	d.dropEntry(id)
	d.entries[id] = &dirEntry{coordinator: coordinator, since: now}
	add(d.counts.intents, coordinator, 1)
	return nil
}

// dropEntry forgets id's entry and what it counted. The caller holds d.mu.
func (d *directory) dropEntry(id string) {
	e := d.entries[id]
	if e == nil {
		return
	}
	if e.coordinator != "" {
		add(d.counts.intents, e.coordinator, -1)
	}
	for _, o := range e.owners {
		add(d.counts.held, o, -1)
	}
	delete(d.entries, id)
}

// sweepIntents drops intents older than ttl — their placement is over,
// one way or the other, and they answer "unsure" anyway — at most every
// dirSweepEvery: a caller stuck at its bound must not make every call a
// walk over every entry. The caller holds d.mu.
func (d *directory) sweepIntents(now time.Time, ttl time.Duration) {
	if now.Sub(d.counts.sweptAt) < dirSweepEvery {
		return
	}
	d.counts.sweptAt = now
	for id, e := range d.entries {
		if len(e.owners) == 0 && now.Sub(e.since) >= ttl {
			d.dropEntry(id)
		}
	}
}

// dropIntentsOf forgets the intents of coordinators that are no longer
// members: they place nothing any more. Held records stay: a home that
// says where a claim is while its owner is down is what keeps a get or a
// release from answering "not found" for it. The caller holds d.mu.
func (d *directory) dropIntentsOf(member func(string) bool) {
	if len(d.counts.intents) == 0 {
		return
	}
	gone := map[string]bool{}
	for c := range d.counts.intents {
		if !member(c) {
			gone[c] = true
		}
	}
	if len(gone) == 0 {
		return
	}
	for id, e := range d.entries {
		if len(e.owners) == 0 && gone[e.coordinator] {
			d.dropEntry(id)
		}
	}
}

// roomForRelease makes room for one more release of node, forgetting the
// oldest half of node's own when it is at its bound. The caller holds d.mu.
func (d *directory) roomForRelease(node string) {
	if d.counts.released[node] < ReleasesPerCaller {
		return
	}
	type rel struct {
		id string
		at time.Time
	}
	var mine []rel
	for id, r := range d.released {
		if r.node == node {
			mine = append(mine, rel{id, r.at})
		}
	}
	slices.SortFunc(mine, func(a, b rel) int { return a.at.Compare(b.at) })
	for _, r := range mine[:len(mine)/2] {
		delete(d.released, r.id)
		add(d.counts.released, node, -1)
	}
}
