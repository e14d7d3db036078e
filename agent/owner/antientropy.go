package owner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/internal/keyedlock"
)

// Anti-entropy between the name registry and this owner's ledger
// (docs/protocol.md, "Anti-entropy"). The claim path keeps the two in
// step, but not every step reaches both: a release whose name release
// could not reach the registry leaves the name held; a ledger written by
// an older version has claims with no name; a fault beyond what the design
// promises can leave a second copy of an ID. Each owner compares its own
// part at start and then every antiEntropyEvery, jittered:
//
//   - a name the registry holds on this server with no claim in its ledger
//     is released (its token, this server as holder), unless it came here
//     by a move from another server: then it is handed back there first
//     (moved back, once per token; antientropy_moves.go), and released
//     only if it is still here on a later pass;
//   - a committed claim whose ID has no name is given one (acquired and
//     confirmed for this server: adopted) when its ledger records no name
//     token (a ledger from before the registry); one that was named once
//     lost its name by a release: it is a leftover, released like a
//     duplicate;
//   - a committed claim whose name is moving to this server is confirmed
//     here: the name comes back to the copy;
//   - a claim committed ahead of its name (commitahead.go) by a commit
//     that did not finish is kept when the registry holds its ID here
//     for its request, and removed otherwise;
//   - a committed claim whose name is held on another server is a
//     duplicate. The registry's copy is kept. This copy is released unless
//     a VM uses it (the ledger's use mark, or a process holding its VFIO
//     groups open), or the holder does not answer that it holds its copy
//     committed; then it stays, marked, until its VM stops or the holder
//     answers. GPUs are never taken from a running VM.
//
// A registry that does not answer skips the pass, logged once until a pass
// gets through again.

// antiEntropyEvery is the mean time between two passes of one owner.
const antiEntropyEvery = 30 * time.Second

// antiEntropy is what the passes remember between them.
type antiEntropy struct {
	// pass serialises passes (a lock a waiter blocks on durably, see
	// keyedlock); passes counts those that ended.
	pass   keyedlock.Set
	passes atomic.Int64

	mu sync.Mutex
	// dups are the duplicate copies this server holds, by claim ID: what
	// the registry named instead when the pass found it.
	dups map[string]sighting
	// down: the last pass could not reach the registry (logged once).
	down bool
	// lostHere are claims of this ledger whose names the registry lists as
	// lost on this server (it was removed while it ran); warned once each.
	lostHere map[string]bool
	// handedBack are the names this server moved back to the server they
	// came from, by claim ID: the token they were held under here.
	handedBack map[string]uint64
}

// mark is the duplicate mark of claim id for claim views.
func (e *antiEntropy) mark(id string) (bool, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	d, ok := e.dups[id]
	return ok, d.owner
}

// sighting is the registry's record that made a copy a duplicate: a copy
// is released only when two passes in a row saw the same one, so that a
// claim between two steps of the claim path (a move from one server to
// another, a commit racing a release) is never taken for a duplicate. A
// leftover (a copy whose name was released) has no owner and the copy's
// own token.
type sighting struct {
	owner string
	token uint64
}

// AntiEntropyReport is what one pass did, for tests and the log.
type AntiEntropyReport struct {
	Skipped    bool
	Freed      []string // names released: no claim in the ledger
	HandedBack []string // names with no claim here moved back where they came from
	Adopted    []string // claims given their missing name
	Confirmed  []string // claims whose name moving here was confirmed
	Released   []string // duplicate and leftover copies released
	Kept       []string // duplicate and leftover copies kept: a VM uses them, first seen, or the holder did not say
	Settled    []string // claims committed ahead of their name whose name the registry holds here
	Undone     []string // claims committed ahead of their name whose name it does not: removed
	Undecided  []string // claims committed ahead of their name that the registry could not decide yet
}

// undecidedRetry is the first wait before a pass asks again about a claim
// committed ahead of its name that the registry could not decide; it
// doubles up to antiEntropyEvery while the registry stays silent.
const undecidedRetry = 500 * time.Millisecond

// RunAntiEntropy runs a pass at once, then one every antiEntropyEvery
// (± a fifth, so that owners started together do not ask together),
// until ctx ends. While a claim committed ahead of its name is undecided
// (a crash between its two writes, then a registry that did not answer),
// it holds its GPUs and is listed as a reservation past its deadline: the
// next pass comes sooner, from undecidedRetry on.
func (o *Owner) RunAntiEntropy(ctx context.Context) {
	if o.names() == nil {
		return
	}
	retry := undecidedRetry
	for {
		rep := o.AntiEntropyPass(ctx)
		// Drawn after the pass, as ever: the draw's place among the
		// owner's other draws is part of the simulation's schedule.
		wait := o.jitter(antiEntropyEvery*4/5, antiEntropyEvery*6/5)
		if len(rep.Undecided) > 0 {
			wait, retry = min(wait, retry), min(2*retry, antiEntropyEvery)
		} else {
			retry = undecidedRetry
		}
		t := o.clk.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// AntiEntropyPass compares the registry's names held on this server with
// its ledger once, and repairs what differs.
func (o *Owner) AntiEntropyPass(ctx context.Context) AntiEntropyReport {
	var rep AntiEntropyReport
	if o.names() == nil {
		return rep
	}
	defer o.ae.pass.Lock("pass")()
	defer o.ae.passes.Add(1)
	self := o.cfg.NodeName
	// The registry first, the ledger second: an owner confirms a name
	// before it commits, so a name confirmed after this read has at least
	// a reservation in the ledger read after it, and is left alone.
	listing, err := o.names().List(ctx, names.Filter{Kind: names.KindClaim, Owner: self}, names.Linearizable)
	if err != nil {
		rep = o.antiEntropySkipped(err)
		for _, c := range o.ledger.Awaiting() {
			rep.Undecided = append(rep.Undecided, c.ID)
		}
		return rep
	}
	held := map[string]names.Record{}
	for _, r := range listing.Records {
		if r.State == names.StateHeld || r.State == names.StateLost {
			held[r.Name] = r
		}
	}
	now := o.clk.Now()
	claims := map[string]ledger.Claim{}
	for _, c := range o.ledger.List() {
		if c.Live(now) {
			claims[c.ID] = c
		}
	}

	nameless := map[string]bool{}
	for _, id := range slices.Sorted(maps.Keys(held)) {
		if _, ok := claims[id]; ok {
			continue
		}
		nameless[id] = true
		switch o.nameWithoutClaim(ctx, held[id]) {
		case nameFreed:
			rep.Freed = append(rep.Freed, id)
		case nameHandedBack:
			rep.HandedBack = append(rep.HandedBack, id)
		}
	}
	o.forgetHandedBack(nameless)

	o.ae.mu.Lock()
	prev := o.ae.dups
	o.ae.mu.Unlock()
	dups := map[string]sighting{}
	lostHere := map[string]bool{}
	for _, id := range slices.Sorted(maps.Keys(claims)) {
		c := claims[id]
		if c.AwaitingName {
			// Committed ahead of its name (commitahead.go): once the
			// commit in flight, if any, is done, the registry decides.
			switch o.settleAwaitingInPass(ctx, id) {
			case awaitingSettled:
				rep.Settled = append(rep.Settled, id)
			case awaitingUndone:
				rep.Undone = append(rep.Undone, id)
			case awaitingUndecided:
				rep.Undecided = append(rep.Undecided, id)
			}
			continue
		}
		if c.State != ledger.StateCommitted {
			continue // being placed: the claim path names it
		}
		if r, ok := held[id]; ok {
			o.ownName(c, r, lostHere)
			continue
		}
		r, err := o.names().Lookup(ctx, names.Claim(id), names.Linearizable)
		switch {
		case errors.Is(err, names.ErrNotFound) && c.NameToken != 0:
			seen := sighting{token: c.NameToken}
			if o.resolveLeftover(ctx, c, prev[id] == seen) {
				rep.Released = append(rep.Released, id)
			} else {
				dups[id] = seen
				rep.Kept = append(rep.Kept, id)
			}
		case errors.Is(err, names.ErrNotFound):
			if o.adoptName(ctx, c) {
				rep.Adopted = append(rep.Adopted, id)
			}
		case err != nil:
			if names.IsUnavailable(err) {
				return o.antiEntropySkipped(err)
			}
			o.log.Warn("anti-entropy: looking a claim's name up failed", "claim", id, "err", err)
		case r.State == names.StatePending:
			// Another coordinator is placing the ID now; its owner's
			// confirm decides, and the next pass sees the outcome.
		case r.Owner == self:
			// Confirmed here since the list was read.
		case r.Move != nil && r.Move.To == self:
			if o.confirmMoveHere(ctx, c, r) {
				rep.Confirmed = append(rep.Confirmed, id)
			}
		default:
			seen := sighting{owner: r.Owner, token: r.Token}
			if o.resolveDuplicate(ctx, c, r, prev[id] == seen) {
				rep.Released = append(rep.Released, id)
			} else {
				dups[id] = seen
				rep.Kept = append(rep.Kept, id)
			}
		}
	}
	o.ae.mu.Lock()
	if o.ae.down {
		o.log.Info("anti-entropy: the name registry answers again; passes resumed")
	}
	o.ae.down = false
	o.ae.dups = dups
	o.ae.lostHere = lostHere
	o.ae.mu.Unlock()
	o.counters.SetClaimDuplicates(len(dups))
	if len(rep.Freed)+len(rep.HandedBack)+len(rep.Adopted)+len(rep.Confirmed)+len(rep.Released)+len(rep.Kept)+
		len(rep.Settled)+len(rep.Undone) > 0 {
		o.log.Info("anti-entropy pass", "names_freed", rep.Freed, "names_handed_back", rep.HandedBack,
			"names_adopted", rep.Adopted, "moves_confirmed", rep.Confirmed,
			"duplicates_released", rep.Released, "duplicates_kept", rep.Kept,
			"awaiting_settled", rep.Settled, "awaiting_undone", rep.Undone)
	}
	return rep
}

// antiEntropySkipped ends a pass the registry did not answer, logging it
// only when the previous pass got through.
func (o *Owner) antiEntropySkipped(err error) AntiEntropyReport {
	o.counters.AntiEntropySkipped()
	o.ae.mu.Lock()
	first := !o.ae.down
	o.ae.down = true
	o.ae.mu.Unlock()
	if first {
		o.log.Warn("anti-entropy: the name registry does not answer; passes skipped until it does (claims and their GPUs are unaffected)", "err", err)
	}
	return AntiEntropyReport{Skipped: true}
}

// freeName releases name r, held on this server with no claim in its
// ledger: a release whose name release could not reach the registry, or a
// commit that failed after its confirm. The ledger is read again first,
// under the ID's commit lock: a claim committed since the pass read it, or
// being placed here now (an early hold comes before its reservation,
// owner.holdEarly), keeps its name.
func (o *Owner) freeName(ctx context.Context, r names.Record) bool {
	unlock := o.commitLocks.Lock(r.Name)
	defer unlock()
	if c, err := o.ledger.Get(r.Name); err == nil && c.Live(o.clk.Now()) {
		return false
	}
	_, err := o.names().Release(ctx, names.Claim(r.Name), r.Token, o.cfg.NodeName)
	switch {
	case err == nil:
		o.counters.ClaimNameFreed()
		o.log.Warn("anti-entropy: name held on this server with no claim in its ledger released", "claim", r.Name, "state", r.State, "token", r.Token)
		return true
	case errors.Is(err, names.ErrNotFound), errors.Is(err, names.ErrStale), errors.Is(err, names.ErrConflict):
		// Released, or granted again, since the list was read.
	default:
		o.log.Warn("anti-entropy: releasing a name with no claim failed; the next pass retries", "claim", r.Name, "err", err)
	}
	return false
}

// ownName checks a committed claim whose name the registry holds on this
// server: the ledger learns the token if it lacks it; a name the registry
// lists as lost (this server was removed while it still ran) is kept as it
// is, warned about once: the operator decides.
func (o *Owner) ownName(c ledger.Claim, r names.Record, lostHere map[string]bool) {
	if r.State == names.StateLost {
		lostHere[c.ID] = true
		o.ae.mu.Lock()
		warned := o.ae.lostHere[c.ID]
		o.ae.mu.Unlock()
		if !warned {
			o.log.Warn("claim held here is listed as lost: this server was removed from the cluster (members remove) while it ran; release the claim, or keep its VM here and release the lost name, after which this server adopts it again",
				"claim", c.ID, "gpus", c.GPUs)
		}
		return
	}
	if c.NameToken != r.Token {
		if _, err := o.ledger.SetNameToken(c.ID, r.Token); err != nil {
			o.log.Warn("anti-entropy: recording a claim's name token failed", "claim", c.ID, "token", r.Token, "err", err)
		}
	}
}

// adoptedRequest is the request digest under which a claim of an older
// version's ledger is given its name: the claim's items and labels.
func adoptedRequest(c ledger.Claim) string {
	h := sha256.New()
	for _, it := range c.Items {
		fmt.Fprintf(h, "item %q %d\n", it.Model, it.Count)
	}
	for _, k := range slices.Sorted(maps.Keys(c.Labels)) {
		fmt.Fprintf(h, "label %q %q\n", k, c.Labels[k])
	}
	return "adopted:" + hex.EncodeToString(h.Sum(nil))[:32]
}

// adoptName gives committed claim c, which has no name and never had one
// (no name token: a ledger from before the registry), one held on this
// server. Another request that takes the name first wins; the next pass
// then finds this copy a duplicate.
func (o *Owner) adoptName(ctx context.Context, c ledger.Claim) bool {
	self := o.cfg.NodeName
	key := names.Claim(c.ID)
	g, err := o.names().Acquire(ctx, key, self, self, adoptedRequest(c), nil)
	if err != nil {
		o.log.Info("anti-entropy: claim not adopted this pass", "claim", c.ID, "err", err)
		return false
	}
	r, err := o.names().Confirm(ctx, key, g.Record.Token, self, nil)
	if err != nil {
		o.log.Info("anti-entropy: claim not adopted this pass", "claim", c.ID, "err", err)
		return false
	}
	if _, err := o.ledger.SetNameToken(c.ID, r.Token); err != nil {
		o.log.Warn("anti-entropy: recording an adopted claim's name token failed", "claim", c.ID, "token", r.Token, "err", err)
	}
	o.counters.ClaimNameAdopted()
	o.log.Info("anti-entropy: claim from before the name registry adopted", "claim", c.ID, "token", r.Token, "gpus", c.GPUs)
	return true
}

// resolveDuplicate applies the rule to committed claim c, whose name r is
// held on another server: the registry's copy is kept; this one is
// released unless a VM uses it. again says the previous pass saw the same
// record: a first sighting only marks the copy. It reports whether c was
// released.
func (o *Owner) resolveDuplicate(ctx context.Context, c ledger.Claim, r names.Record, again bool) bool {
	if !again {
		o.log.Warn("claim held on several servers", "claim", c.ID, "kept_on", r.Owner, "kept_state", r.State,
			"copy_on", o.cfg.NodeName, "gpus", c.GPUs)
	}
	unlock := o.claimLocks.Lock(c.ID)
	defer unlock()
	cur, err := o.ledger.Get(c.ID)
	if err != nil || cur.State != ledger.StateCommitted || !cur.CommittedAt.Equal(c.CommittedAt) {
		return false // released or replaced meanwhile: the next pass looks again
	}
	if r.State == names.StateLost {
		if !again {
			o.log.Warn("duplicate kept: the registry's copy was on a removed server; release the lost name to let this server adopt its copy", "claim", c.ID, "lost_on", r.Owner)
		}
		return false
	}
	if why := o.inUseWhy(cur); why != "" {
		if !again {
			o.log.Warn("duplicate kept while a VM uses it; it is released once the VM stops", "claim", c.ID, "kept_on", r.Owner, "in_use", why)
		}
		return false
	}
	if !again {
		o.log.Info("duplicate unused; released by the next pass if it is still one", "claim", c.ID, "kept_on", r.Owner)
		return false
	}
	if why := o.holderLacks(ctx, r.Owner, c.ID); why != "" {
		o.log.Warn("duplicate kept: the server the registry names does not confirm it holds the claim; the next pass asks again", "claim", c.ID, "kept_on", r.Owner, "why", why)
		return false
	}
	return o.releaseCopy(ctx, c, "duplicate", "the name registry names the copy on another server", "kept_on", r.Owner)
}

// releaseCopy releases claim c, a copy the registry does not name (what
// says which kind, why says why, with attrs for the log), and returns its
// GPUs to the idle driver. It reports whether c was released.
func (o *Owner) releaseCopy(ctx context.Context, c ledger.Claim, what, why string, attrs ...any) bool {
	moved := what + " " + c.ID + " released"
	rel, scan, devs, err := o.host.ReleaseLocked(c.ID, moved, func() (ledger.Claim, error) { return o.ledger.Release(c.ID, o.clk.Now()) })
	if err != nil {
		o.log.Error("releasing a "+what+" claim failed; the next pass retries", "claim", c.ID, "err", err)
		return false
	}
	o.rec.Reservation(events.ReservationReleased)
	o.counters.ClaimDuplicateReleased()
	o.log.Warn(what+" claim released: "+why, append([]any{"claim", c.ID, "gpus", rel.GPUs}, attrs...)...)
	// The pass's context ends with the agent; a driver move, once begun,
	// runs to its own deadline.
	o.host.ToIdleScanned(context.WithoutCancel(ctx), moved, rel.GPUs, "", scan)
	devs()
	o.changed()
	return true
}

// inUseWhy says why a claim's GPUs are in use by a VM, or "": the libvirt
// hook's use mark, or a process holding one of its VFIO groups open. A
// /proc that cannot be read counts as in use: never take GPUs away on a
// guess.
func (o *Owner) inUseWhy(c ledger.Claim) string {
	if c.Use.Domain != "" {
		name := c.Use.Name
		if name == "" {
			name = c.Use.Domain
		}
		return "domain " + name + " is marked running on it"
	}
	used, err := o.host.UsedBy(c.GPUs)
	if err != nil {
		return "cannot tell whether a VM uses its GPUs: " + err.Error()
	}
	return strings.Join(used, "; ")
}

// duplicateMark adds the anti-entropy pass's mark to a claim view.
func (o *Owner) duplicateMark(v *api.Claim) {
	v.Duplicate, v.KeptOn = o.ae.mark(v.ID)
}

// AntiEntropyPasses is how many passes have ended since the start.
func (o *Owner) AntiEntropyPasses() int64 { return o.ae.passes.Load() }
