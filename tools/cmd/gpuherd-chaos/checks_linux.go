package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

const vfioDriver = "vfio-pci"

// monitor samples every live agent while the run goes on and checks what
// must hold at every instant: a claimed GPU is on vfio-pci, no GPU is in two
// live claims of its owner's ledger, and no reservation is still listed
// well after its lease (the owner sweeps every quarter lease).
type monitor struct {
	agents []*agent
	lease  time.Duration
	h      *history

	mu        sync.Mutex
	snapshots int
	crashed   map[string]bool
}

func (m *monitor) run(ctx context.Context) {
	m.crashed = map[string]bool{}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var (
			wg    sync.WaitGroup
			rmu   sync.Mutex
			round = map[string][]api.Claim{} // node → its committed claims this round
		)
		for _, a := range m.agents {
			if err := a.crashed(); err != nil {
				m.mu.Lock()
				if !m.crashed[a.name] {
					m.crashed[a.name] = true
					m.h.violate("agent-crashed", "%v%s", err, a.tail(20))
				}
				m.mu.Unlock()
				continue
			}
			if !a.running() || a.isPaused() {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				own := m.sample(ctx, a)
				rmu.Lock()
				round[a.name] = own
				rmu.Unlock()
			}()
		}
		wg.Wait()
		checkOneServerPerID(m.h, round)
	}
}

// checkOneServerPerID reports a claim ID committed on two servers at once,
// from one round of samples of the owners' ledgers. Node claims of groups
// are left out: a group resize that moves a node commits the new placement
// before it releases the old one.
func checkOneServerPerID(h *history, round map[string][]api.Claim) {
	where := map[string][]string{}
	for node, cs := range round {
		for _, c := range cs {
			if c.State == api.StateClaimed && !strings.Contains(c.ID, ".node-") {
				where[c.ID] = append(where[c.ID], fmt.Sprintf("%s %v", node, claimAddrs(c)))
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(where)) {
		if ws := where[id]; len(ws) > 1 {
			slices.Sort(ws)
			h.violateOnce("two-servers "+id+" "+strings.Join(ws, " "), "id-on-two-servers", "%s is committed on %s at once (owners' ledgers, one sampling round at %s)", id, strings.Join(ws, " and "), time.Now().Format(timeFmt))
		}
	}
}

// sample checks one agent and returns the claims its own ledger lists.
func (m *monitor) sample(ctx context.Context, a *agent) []api.Claim {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st, err := a.client.Status(ctx)
	if err != nil {
		return nil
	}
	before := time.Now()
	claims, err := a.client.Claims(ctx)
	if err != nil {
		return nil
	}
	after := time.Now()
	m.mu.Lock()
	m.snapshots++
	m.mu.Unlock()
	for _, g := range st.GPUs {
		if g.State == api.StateClaimed && g.Driver != vfioDriver {
			m.h.violate("claimed-not-on-vfio", "%s %s claimed by %s is on %q (status at %s)", a.name, g.PCIAddress, g.Claim, g.Driver, before.Format(time.RFC3339Nano))
		}
	}
	var own []api.Claim
	for _, c := range claims.Claims {
		if c.Node == a.name {
			own = append(own, c)
		}
	}
	// The ledger lists a reservation until the sweep removes it, at most a
	// quarter lease after its deadline; a second of slack covers scheduling.
	// A freshly started or resumed agent gets the same slack from then.
	tol := m.lease/4 + time.Second
	for _, c := range own {
		if c.State != api.StateReserved {
			continue
		}
		deadline := a.realTime(c.ExpiresAt) // the agent's clock may carry a step
		from := deadline
		if w := a.wake(); w.After(from) {
			from = w
		}
		if before.Sub(from) > tol {
			m.h.violate("reservation-outlived-lease", "%s lists reservation %s (expires %s) at %s, %s after its deadline", a.name, c.ID,
				deadline.Format(time.RFC3339Nano), before.Format(time.RFC3339Nano), before.Sub(deadline).Round(time.Millisecond))
		}
	}
	// Live claims of this owner: committed ones, and reservations whose
	// deadline had not passed when the answer came back.
	checkNoSharedGPU(m.h, a.name, own, func(c api.Claim) bool {
		return c.State == api.StateClaimed || (c.State == api.StateReserved && a.realTime(c.ExpiresAt).After(after))
	})
	return own
}

// checkNoSharedGPU reports every GPU of node that is in two live claims.
func checkNoSharedGPU(h *history, node string, claims []api.Claim, live func(api.Claim) bool) {
	holder := map[string]string{}
	for _, c := range claims {
		if !live(c) {
			continue
		}
		for _, g := range c.GPUs {
			if other, ok := holder[g.PCIAddress]; ok && other != c.ID {
				h.violate("gpu-in-two-claims", "%s %s is in %s and %s", node, g.PCIAddress, other, c.ID)
			}
			holder[g.PCIAddress] = c.ID
		}
	}
}

// finalState is what every agent says once the run is over, every fault
// healed, every agent restarted and every lease run out.
type finalState struct {
	status map[string]api.Status      // node → its GPUs
	claims map[string][]api.Claim     // node → its own ledger's claims
	byID   map[string][]api.Claim     // id → its claims on every node
	views  map[string]map[string]bool // node → "id@node" it lists (every reachable server)
}

// collect reads the final state through the CLI (`status -o json`,
// `claims -o json`), as an operator would.
func collect(ctx context.Context, agents []*agent, h *history) (*finalState, error) {
	fs := &finalState{status: map[string]api.Status{}, claims: map[string][]api.Claim{}, byID: map[string][]api.Claim{}, views: map[string]map[string]bool{}}
	for _, a := range agents {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		st, err := cliJSON[api.Status](cctx, a, "status")
		if err == nil {
			// A partial list (a server did not answer) exits 5: an error.
			var cl api.ClaimList
			cl, err = cliJSON[api.ClaimList](cctx, a, "claims")
			fs.views[a.name] = map[string]bool{}
			for _, c := range cl.Claims {
				fs.views[a.name][c.ID+"@"+c.Node] = true
				if c.Node == a.name {
					fs.claims[a.name] = append(fs.claims[a.name], c)
					fs.byID[c.ID] = append(fs.byID[c.ID], c)
				}
			}
		}
		cancel()
		if err != nil {
			return nil, err
		}
		fs.status[a.name] = st
	}
	return fs, nil
}

// finalCheck checks the final state against the invariants and the run's
// history. It returns how many claims and GPUs it checked.
func finalCheck(fs *finalState, h *history, runEnd time.Time) (claims, gpus int) {
	// Every agent lists the same claims: the cluster is whole again.
	var want []string
	for node, cs := range fs.claims {
		for _, c := range cs {
			want = append(want, c.ID+"@"+node)
		}
	}
	for node, view := range fs.views {
		for _, k := range want {
			if !view[k] {
				h.violate("claims-view-incomplete", "%s's `claims` lacks %s after the cluster healed", node, k)
			}
		}
	}

	for node, cs := range fs.claims {
		claims += len(cs)
		// No reservation survives: nothing has placed a claim for longer
		// than a lease.
		for _, c := range cs {
			if c.State != api.StateClaimed {
				h.violate("reservation-outlived-lease", "%s still lists %s in state %s (expires %s) after the run", node, c.ID, c.State, c.ExpiresAt.Format(time.RFC3339Nano))
			}
		}
		checkNoSharedGPU(h, node, cs, func(api.Claim) bool { return true })
		// The ledger and the hardware agree: every GPU of a claim is
		// claimed by it and on vfio-pci; no GPU claims to be held by a
		// claim the ledger does not list.
		gpuByAddr := map[string]api.GPU{}
		for _, g := range fs.status[node].GPUs {
			gpuByAddr[g.PCIAddress] = g
		}
		ids := map[string]bool{}
		for _, c := range cs {
			ids[c.ID] = true
			for _, cg := range c.GPUs {
				gpus++
				g, ok := gpuByAddr[cg.PCIAddress]
				switch {
				case !ok:
					h.violate("claim-gpu-missing", "%s: claim %s holds %s, which status does not list", node, c.ID, cg.PCIAddress)
				case g.Driver != vfioDriver:
					h.violate("claimed-not-on-vfio", "%s %s of claim %s is on %q", node, cg.PCIAddress, c.ID, g.Driver)
				case g.State != api.StateClaimed || g.Claim != c.ID:
					h.violate("status-ledger-mismatch", "%s %s of claim %s: status says %s by %q", node, cg.PCIAddress, c.ID, g.State, g.Claim)
				}
			}
		}
		for _, g := range fs.status[node].GPUs {
			if (g.State == api.StateClaimed || g.State == api.StateReserved) && !ids[g.Claim] {
				h.violate("status-ledger-mismatch", "%s %s is %s by %q, which the ledger does not list", node, g.PCIAddress, g.State, g.Claim)
			}
		}
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	// Every acknowledged commit not released is there, as acknowledged.
	for _, rec := range h.recs {
		if !rec.committed || rec.released || rec.ambiguousRelease {
			continue
		}
		found := false
		for _, c := range fs.byID[rec.id] {
			if c.Node == rec.node && slices.Equal(claimAddrs(c), rec.gpus) {
				found = true
			}
		}
		if !found {
			h.violateLocked("lost-commit", "%s committed on %s %v at %s (acknowledged), not released, now %s",
				rec.id, rec.node, rec.gpus, rec.ackAt.Format(time.RFC3339Nano), describe(fs.byID[rec.id]))
		}
	}
	// Every claim present is one the run placed and did not release.
	var ids []string
	for id := range fs.byID {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		cs := fs.byID[id]
		if len(cs) > 1 {
			// One name, one authority: a duplicate is never allowed.
			h.violateLocked("id-on-two-servers", "%s is held as %s after every fault healed", id, describe(cs))
		}
		rec := h.recs[id]
		if rec == nil && h.groupOf(id) != nil {
			continue // a group's node claim: the group checks below
		}
		for _, c := range cs {
			asAcked := rec != nil && rec.committed && c.Node == rec.node && slices.Equal(claimAddrs(c), rec.gpus)
			switch {
			case rec == nil:
				h.violateLocked("unknown-claim", "%s on %s: no claimer ever asked for it", id, c.Node)
			case rec.released && (asAcked || !rec.lastTryEnd.After(rec.releaseAckAt)):
				// An acknowledged release, after every claim attempt had
				// ended, leaves no GPUs under the ID anywhere.
				h.violateLocked("released-claim-present", "%s on %s %v: its release was acknowledged at %s", id, c.Node, claimAddrs(c), rec.releaseAckAt.Format(timeFmt))
			case asAcked:
			case rec.ambiguousClaim:
				// An attempt whose answer was lost committed here (or
				// elsewhere than the retry): the caller's concurrent
				// duplicate, as docs/protocol.md allows.
				h.notes["claim committed by an attempt whose answer was lost (kept, not acknowledged)"]++
			default:
				h.violateLocked("phantom-claim", "%s on %s %v: the claimer was told %s", id, c.Node, claimAddrs(c), tellWhat(rec))
			}
		}
	}
	// Groups: all or nothing, and nothing left after a delete.
	for _, name := range slices.Sorted(maps.Keys(h.groups)) {
		g := h.groups[name]
		var nodes []api.Claim
		for _, id := range ids {
			if strings.HasPrefix(id, g.groupPrefix()) {
				nodes = append(nodes, fs.byID[id]...)
			}
		}
		h.judgeGroupLocked(g, nodes, "final state")
	}
	// Over the whole history: two claims acknowledged on one GPU were never
	// both certainly held at once. A claim is certainly held from its
	// acknowledgement until its first release request (or the run's end).
	type span struct {
		id       string
		from, to time.Time
	}
	spans := map[string][]span{}
	for _, rec := range h.recs {
		if !rec.committed {
			continue
		}
		to := runEnd
		if !rec.releaseSentAt.IsZero() {
			to = rec.releaseSentAt
		}
		for _, g := range rec.gpus {
			spans[rec.node+" "+g] = append(spans[rec.node+" "+g], span{rec.id, rec.ackAt, to})
		}
	}
	for gpu, ss := range spans {
		for x := range ss {
			for y := x + 1; y < len(ss); y++ {
				if ss[x].from.Before(ss[y].to) && ss[y].from.Before(ss[x].to) {
					h.violateLocked("double-allocation", "%s held by %s [%s, %s] and %s [%s, %s]", gpu,
						ss[x].id, ss[x].from.Format("15:04:05.000"), ss[x].to.Format("15:04:05.000"),
						ss[y].id, ss[y].from.Format("15:04:05.000"), ss[y].to.Format("15:04:05.000"))
				}
			}
		}
	}
	return claims, gpus
}

func describe(cs []api.Claim) string {
	if len(cs) == 0 {
		return "absent"
	}
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s on %s %v", c.State, c.Node, claimAddrs(c)))
	}
	return strings.Join(parts, "; ")
}

func tellWhat(rec *claimRec) string {
	switch {
	case rec.refused:
		return "refused"
	case rec.committed:
		return fmt.Sprintf("committed on %s %v", rec.node, rec.gpus)
	}
	return "not available"
}
