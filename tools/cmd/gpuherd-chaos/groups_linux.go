package main

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// groupRec is what the run knows about one node group. Group names are
// never reused.
type groupRec struct {
	name  string
	nodes int
	// want holds the per-node requests the group may have now: the last
	// acknowledged one first, then those that a resize whose answer was
	// lost may have applied. Every node has the same one.
	want []([]api.Item)

	created         bool // create acknowledged
	createAmbiguous bool // a create's fate is unknown
	createAcked     bool // a create was answered with the group
	createRefused   bool // a create answered not available or refused: nothing may be kept
	deleted         bool // delete acknowledged
	deleteAmbiguous bool
}

// groupPrefix is the prefix of the group's node claim IDs (NAME.node-i).
func (g *groupRec) groupPrefix() string { return g.name + ".node-" }

// groupOf is the group whose node claim id is, if the run made it.
func (h *history) groupOf(id string) *groupRec {
	name, _, ok := strings.Cut(id, ".node-")
	if !ok {
		return nil
	}
	return h.groups[name]
}

// shape is a claim's GPUs as "model×count" in a canonical order.
func shape(gpus []api.ClaimGPU) string {
	n := map[string]int{}
	for _, g := range gpus {
		n[g.Model]++
	}
	var parts []string
	for _, m := range slices.Sorted(maps.Keys(n)) {
		parts = append(parts, fmt.Sprintf("%s×%d", m, n[m]))
	}
	return strings.Join(parts, ", ")
}

func itemsShape(items []api.Item) string {
	n := map[string]int{}
	for _, it := range items {
		n[it.Model] += it.Count
	}
	var parts []string
	for _, m := range slices.Sorted(maps.Keys(n)) {
		parts = append(parts, fmt.Sprintf("%s×%d", m, n[m]))
	}
	return strings.Join(parts, ", ")
}

// noteGroupHalfCreated counts groups left with some nodes by a create that
// was never answered (its coordinator killed or cut off half-way).
const noteGroupHalfCreated = "a group create never answered left some nodes (shown missing; repair or delete)"

// noteGroupResizeLeftMixed counts groups seen holding the old and the new
// GPUs side by side after a resize failed and the agent said it could not
// put every node back.
const noteGroupResizeLeftMixed = "a failed group resize could not put every node back, and said so (old and new GPUs side by side; resize again)"

// mixedAsReported reports whether shapes, more than one, are each a
// request the group may have, and a coordinator logged that a resize of g
// failed and could not put every node back (a node's server did not
// answer): the group then holds the old and the new GPUs side by side
// until it is resized again, as the resize's answer (an internal error
// naming each node that is not as it was) and that log line say
// (agent/groups, restoreGroup). The answer itself is often lost: the
// putting back outlasts the client's patience.
func (h *history) mixedAsReported(g *groupRec, shapes map[string]bool) bool {
	if len(shapes) < 2 {
		return false
	}
	for s := range shapes {
		if !slices.ContainsFunc(g.want, func(w []api.Item) bool { return itemsShape(w) == s }) {
			return false
		}
	}
	return h.resizeLeftMixed != nil && h.resizeLeftMixed(g.name)
}

// judgeGroupLocked checks a group's node claims (as a get answered them,
// or as the final state holds them) against the run's history: a group is
// all or nothing — every node present with the same GPUs, one of the
// requests the group may have — or, when it was refused or deleted, none.
// h.mu is held.
func (h *history) judgeGroupLocked(g *groupRec, claims []api.Claim, when string) {
	var ids []string
	shapes := map[string]bool{}
	for _, c := range claims {
		ids = append(ids, fmt.Sprintf("%s on %s [%s]", c.ID, c.Node, shape(c.GPUs)))
		shapes[shape(c.GPUs)] = true
	}
	slices.Sort(ids)
	switch {
	case g.deleted && len(claims) > 0:
		h.violateLocked("group-claims-left", "%s: group %s was deleted (acknowledged) but holds %s", when, g.name, strings.Join(ids, "; "))
		return
	case g.createRefused && !g.created && !g.createAmbiguous && len(claims) > 0:
		h.violateLocked("group-not-all-or-nothing", "%s: the create of group %s was refused, yet it holds %s", when, g.name, strings.Join(ids, "; "))
		return
	case g.deleteAmbiguous || g.deleted || len(claims) == 0 && !g.created:
		return // gone, or its fate is unknown
	}
	if len(claims) != g.nodes && g.createAmbiguous && !g.createAcked && len(claims) < g.nodes {
		// No create was ever answered: its coordinator died or was cut
		// off half-way, which leaves the nodes placed so far under a group
		// that `group get` shows with the others missing, for `group
		// repair` or `group delete` (docs/protocol.md, "Node groups": a
		// known gap, no automatic rollback yet).
		h.notes[noteGroupHalfCreated]++
		return
	}
	if len(claims) != g.nodes {
		h.violateLocked("group-not-all-or-nothing", "%s: group %s of %d nodes holds %d node claims: %s", when, g.name, g.nodes, len(claims), strings.Join(ids, "; "))
		return
	}
	if h.mixedAsReported(g, shapes) {
		h.notes[noteGroupResizeLeftMixed]++
		return
	}
	ok := len(shapes) == 1
	if ok {
		ok = false
		for _, w := range g.want {
			if shapes[itemsShape(w)] {
				ok = true
			}
		}
	}
	if !ok {
		var want []string
		for _, w := range g.want {
			want = append(want, itemsShape(w))
		}
		h.violateLocked("group-not-all-or-nothing", "%s: group %s's nodes hold %s; every node must hold the same, one of [%s]", when, g.name, strings.Join(ids, "; "), strings.Join(want, " | "))
	}
}

// groupClient creates, reads, resizes and deletes node groups through
// random agents, retrying like the claimers. Some resizes ask for more
// than one server has, so that a resize fails half-way and must roll back.
func (w *workload) groupClient(rng *rand.Rand, wg *sync.WaitGroup) {
	defer wg.Done()
	for n := 1; !w.stopped(); n++ {
		g := &groupRec{name: fmt.Sprintf("g%d", n), nodes: 2 + rng.IntN(2)}
		items := []api.Item{w.request(rng)[0]}
		items[0].Count = 1
		g.want = [][]api.Item{items}
		w.h.mu.Lock()
		w.h.groups[g.name] = g
		w.h.mu.Unlock()
		a := w.agents[rng.IntN(len(w.agents))]
		o := w.retrying(rng, a, "", retryBudget, func(a *agent) outcome { return w.groupCreate(a, g, items) })
		if o == outOK || o == outConflict {
			// Resize: to another model or count, sometimes to more than
			// the largest server has, which cannot complete.
			to := w.otherRequest(rng, items)[:1]
			if rng.IntN(3) == 0 {
				to[0].Count = w.mostOf(to[0].Model) + 1
			}
			lost := false // an attempt's answer was lost: it may still apply
			w.retrying(rng, w.agents[rng.IntN(len(w.agents))], "", retryBudget, func(a *agent) outcome { return w.groupResize(a, g, to, &lost) })
			w.groupGet(w.agents[rng.IntN(len(w.agents))], g)
			w.retrying(rng, w.agents[rng.IntN(len(w.agents))], "", retryBudget, func(a *agent) outcome { return w.groupDelete(a, g) })
		}
		select {
		case <-w.stop:
			return
		case <-time.After(time.Duration(200+rng.IntN(800)) * time.Millisecond):
		}
	}
}

func (w *workload) mostOf(model string) int {
	for _, m := range w.models {
		if m.name == model {
			return m.maxOne
		}
	}
	return 1
}

func (w *workload) groupCreate(a *agent, g *groupRec, items []api.Item) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), groupTimeout)
	defer cancel()
	_, err := a.client.CreateGroup(ctx, g.name, api.GroupRequest{Nodes: g.nodes, GPUs: items})
	o := classify(err)
	w.h.count("group-create", o)
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	switch o {
	case outOK:
		g.created, g.createAcked = true, true
	case outConflict:
		// "already exists": an earlier attempt whose answer was lost
		// created it (names are never reused).
		if !g.createAmbiguous {
			w.h.violateLocked("false-conflict", "group create %s through %s answered conflict; no earlier create of that name was sent", g.name, a.name)
		}
		g.created = true
	case outAmbiguous:
		g.createAmbiguous = true
	default:
		g.createRefused = true
	}
	return o
}

// groupResize resizes g to to; lost says whether an earlier attempt of
// this resize had its answer lost (and so may apply whatever this one says).
func (w *workload) groupResize(a *agent, g *groupRec, to []api.Item, lost *bool) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), groupTimeout)
	defer cancel()
	w.h.mu.Lock()
	if !slices.ContainsFunc(g.want, func(x []api.Item) bool { return slices.Equal(x, to) }) {
		g.want = append(g.want, to) // may apply from now on
	}
	w.h.mu.Unlock()
	_, err := a.client.ResizeGroup(ctx, g.name, api.ResizeRequest{GPUs: to})
	o := classify(err)
	w.h.count("group-resize", o)
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	switch o {
	case outOK:
		g.want = [][]api.Item{to}
	case outAmbiguous:
		*lost = true
	case outNotFound:
		w.h.violateLocked("group-not-found", "group resize %s through %s answered not_found; the group was created and never deleted", g.name, a.name)
	default:
		// Refused: every node keeps what it had, unless an earlier
		// attempt whose answer was lost applied the resize.
		if !*lost {
			g.want = slices.DeleteFunc(g.want, func(x []api.Item) bool { return slices.Equal(x, to) })
		}
	}
	return o
}

func (w *workload) groupGet(a *agent, g *groupRec) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), getTimeout)
	defer cancel()
	start := time.Now()
	got, err := a.client.GetGroup(ctx, g.name)
	o := classify(err)
	w.h.count("group-get", o)
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	switch o {
	case outOK:
		w.h.judgeGroupLocked(g, got.Claims, fmt.Sprintf("group get through %s at %s", a.name, start.Format(timeFmt)))
	case outNotFound:
		if g.created && !g.deleted && !g.deleteAmbiguous {
			w.h.violateLocked("group-not-found", "group get %s through %s at %s answered not_found; the group was created and never deleted", g.name, a.name, start.Format(timeFmt))
		}
	}
	return o
}

func (w *workload) groupDelete(a *agent, g *groupRec) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), groupTimeout)
	defer cancel()
	_, err := a.client.DeleteGroup(ctx, g.name)
	o := classify(err)
	w.h.count("group-delete", o)
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	switch o {
	case outOK:
		g.deleted, g.deleteAmbiguous = true, false
	case outNotFound:
		if !g.deleteAmbiguous && g.created {
			w.h.violateLocked("group-not-found", "group delete %s through %s answered not_found; the group was created and never deleted", g.name, a.name)
		}
		g.deleted, g.deleteAmbiguous = true, false
	case outAmbiguous:
		g.deleteAmbiguous = true
	}
	return o
}
