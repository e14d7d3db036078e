package dst

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
)

// API answer codes, as the agent's API uses them.
const (
	codeOK           = "ok"
	codeNotAvailable = "not_available"
	codeConflict     = "conflict"
	codeLeaseExpired = "lease_expired"
	codeNotFound     = "not_found"
	codeUnavailable  = "unavailable"
)

// answer is what an owner or a coordinator answers.
type answer struct {
	code  string
	claim ledger.Claim
}

// node is one agent: an owner with its real ledger, a coordinator, and
// the anti-entropy pass. gen counts its process lives: a kill ends every
// step it was running.
type node struct {
	w           *world
	idx         int
	name        string
	alive       bool
	gen         int
	pausedUntil int64
	path        string
	ledger      *ledger.Ledger
	// dups is the anti-entropy pass's previous sightings of duplicates
	// and leftovers; handedBack the names it moved back, by token.
	dups       map[string]sighting
	handedBack map[string]uint64
	// locks are the coordinator's claim IDs in progress, each with the
	// claims through this agent waiting for it; commits the owner's
	// commits in progress, by claim ID (owner.commitLocks).
	locks, commits map[string][]func()
	// readFirstUntil: until when claims through this coordinator look
	// their ID up before placing it (w.now, ms; coordinator.claim).
	readFirstUntil int64
}

func (n *node) open() error {
	l, err := ledger.Open(n.path, ledger.WithLockTimeout(time.Second))
	if err != nil {
		return fmt.Errorf("open the ledger of %s: %w", n.name, err)
	}
	var gpus []ledger.GPU
	for i := range n.w.cfg.GPUs {
		gpus = append(gpus, ledger.GPU{Address: fmt.Sprintf("0000:%02x:00.0", i+1), Model: "L40S", Healthy: true})
	}
	if err := l.SetInventory(gpus); err != nil {
		return fmt.Errorf("inventory of %s: %w", n.name, err)
	}
	n.ledger = l
	return nil
}

// kill ends the process: its steps in flight are dropped, its ledger
// closed (reservations, which live in memory, are gone at the next open).
func (n *node) kill() {
	n.alive = false
	n.gen++
	n.pausedUntil = 0
	if err := n.ledger.Close(); err != nil {
		panic(err)
	}
}

func (n *node) restart() {
	n.alive = true
	n.dups = map[string]sighting{}
	n.handedBack = map[string]uint64{}
	n.locks, n.commits = map[string][]func(){}, map[string][]func(){}
	if err := n.open(); err != nil {
		panic(err)
	}
	n.startLoops()
}

// startLoops starts the process's periodic anti-entropy pass.
func (n *node) startLoops() {
	var pass func()
	pass = func() {
		n.antiEntropy()
		n.w.at(n.idx, n.w.cfg.AntiEntropy, pass)
	}
	n.w.at(n.idx, n.w.cfg.AntiEntropy+n.w.rng.Int64N(n.w.cfg.AntiEntropy), pass)
}

func (n *node) clock() time.Time { return n.w.time() }

func ledgerCode(err error) string {
	var (
		na *ledger.NotAvailableError
		ce *ledger.ConflictError
	)
	switch {
	case err == nil:
		return codeOK
	case errors.As(err, &na):
		return codeNotAvailable
	case errors.As(err, &ce):
		return codeConflict
	case errors.Is(err, ledger.ErrLeaseExpired):
		return codeLeaseExpired
	case errors.Is(err, ledger.ErrNotFound):
		return codeNotFound
	case errors.Is(err, ledger.ErrCommitted):
		return codeConflict
	}
	panic(fmt.Sprintf("ledger error the simulation does not expect: %v", err))
}

// reserve is the owner's Reserve (owner.go): the ledger's check-and-take
// under the placement's name token.
func (n *node) reserve(id string, items []ledger.Item, token uint64, coordinator string) answer {
	c, err := n.ledger.Reserve(id, ledger.Request{Items: items, NameToken: token}, coordinator, n.clock(), ms(n.w.cfg.ReserveLease))
	return answer{ledgerCode(err), c}
}

// reserveAndCommit is the owner's combined call (owner.Reserve with
// Commit): a commit it cannot decide now answers the reservation. With no
// entry for id and room for items, the hold goes out before the
// reservation (owner.holdEarly), which is made at a later step, so
// anything may run in between; the ID's commits are serialised from the
// hold to the answer, and a hold whose reservation failed is let go before
// the answer (owner.settleEarly).
func (n *node) reserveAndCommit(id string, items []ledger.Item, coordinator string, reply func(any)) {
	answerCommit := func(a answer, commit func(func(any))) {
		commit(func(ans any) {
			if ans.(answer).code == codeUnavailable {
				reply(a)
				return
			}
			reply(ans)
		})
	}
	if n.w.cfg.LateHold || !n.roomFor(id, items) {
		a := n.reserve(id, items, 0, coordinator)
		if a.code != codeOK {
			reply(a)
			return
		}
		answerCommit(a, func(r func(any)) { n.commit(id, r) })
		return
	}
	n.serialize(n.commits, id, func(done func()) {
		w := n.w
		var (
			res                    names.Result
			held, heldOK, reserved bool
			a                      answer
		)
		// Both steps are events of this process: a kill drops whichever
		// has not run, and finish with it.
		finish := func() {
			if !held || !reserved {
				return
			}
			if a.code != codeOK {
				n.settleEarly(id, res, heldOK, func() {
					done()
					reply(a)
				})
				return
			}
			answerCommit(a, func(r func(any)) {
				n.commitHeld(id, res, heldOK, func(ans any) {
					done()
					r(ans)
				})
			})
		}
		digest := request{count: countOf(items)}.digest()
		w.reg.do(n.idx, regIn{Op: "hold", Key: id, Caller: coordinator, Request: digest, Node: n.name}, func(r names.Result, _, ok bool) {
			res, held, heldOK = r, true, ok
			finish()
		})
		// The reservation follows at once, or later: the process is
		// descheduled, or a bind failed and the reservation is made again
		// (owner.Reserve's retries), with no entry meanwhile.
		w.at(n.idx, w.rng.Int64N(2*w.cfg.MaxDelay+1), func() {
			a, reserved = n.reserve(id, items, 0, coordinator), true
			finish()
		})
	})
}

// roomFor is owner.holdEarly's test: no entry for id, and by the ledger
// room for items.
func (n *node) roomFor(id string, items []ledger.Item) bool {
	if _, err := n.ledger.Get(id); err == nil {
		return false
	}
	free := n.ledger.Free(n.clock())
	for _, it := range items {
		if free[it.Model] -= it.Count; free[it.Model] < 0 {
			return false
		}
	}
	return true
}

func countOf(items []ledger.Item) int {
	n := 0
	for _, it := range items {
		n += it.Count
	}
	return n
}

// settleEarly lets an early hold go when its reservation failed and no
// claim of the ID is here.
func (n *node) settleEarly(id string, res names.Result, ok bool, then func()) {
	if !ok || (res.Code != names.CodeOK && res.Code != names.CodeSame) || res.Record == nil || res.Record.Owner != n.name {
		then()
		return
	}
	if c, err := n.ledger.Get(id); err == nil && c.Live(n.clock()) {
		then()
		return
	}
	n.w.reg.do(n.idx, regIn{Op: "release", Key: id, Token: res.Record.Token, Node: n.name}, func(names.Result, bool, bool) { then() })
}

// commit is the owner's Commit (owner.go, ownernames.go): a live
// reservation is committed only once the registry holds its claim ID on
// this server: in one write (hold) for a reservation made without a
// token, confirmed under its token for one made with it (a move).
func (n *node) commit(id string, reply func(any)) {
	n.serialize(n.commits, id, func(done func()) {
		n.commitNow(id, func(a any) {
			done()
			reply(a)
		})
	})
}

func (n *node) commitNow(id string, reply func(any)) {
	pending, err := n.ledger.Get(id)
	if err != nil {
		reply(answer{code: ledgerCode(err)})
		return
	}
	if pending.State != ledger.StateReserved || !pending.Live(n.clock()) || n.w.cfg.BrokenCommitWithoutConfirm {
		c, err := n.ledger.Commit(id, n.clock())
		if pending.State == ledger.StateReserved {
			n.noteCommit(id, err) // not a retried commit of a committed claim
		}
		reply(answer{ledgerCode(err), c})
		return
	}
	in := regIn{Op: "confirm", Key: id, Token: pending.NameToken, Node: n.name}
	if pending.NameToken == 0 {
		in = regIn{Op: "hold", Key: id, Caller: pending.Coordinator, Request: digestOf(pending), Node: n.name}
	}
	n.w.reg.do(n.idx, in, func(res names.Result, _, ok bool) {
		n.commitAnswered(id, pending, res, ok, reply)
	})
}

// commitHeld is commitNow with the answer of an early hold: the
// reservation is read now, and committed under that answer when it is
// the live, unnamed reservation the hold was for.
func (n *node) commitHeld(id string, res names.Result, ok bool, reply func(any)) {
	pending, err := n.ledger.Get(id)
	if err != nil {
		reply(answer{code: ledgerCode(err)})
		return
	}
	if pending.State != ledger.StateReserved || !pending.Live(n.clock()) || pending.NameToken != 0 {
		// Not the reservation the hold was made for: as a commit without
		// it (the hold is let go by the pass if nothing claims it).
		n.commitNow(id, reply)
		return
	}
	n.commitAnswered(id, pending, res, ok, reply)
}

// commitAnswered finishes a commit once the registry answered its hold or
// confirm (ok false: no answer).
func (n *node) commitAnswered(id string, pending ledger.Claim, res names.Result, ok bool, reply func(any)) {
	if !ok {
		reply(answer{code: codeUnavailable})
		return
	}
	switch res.Code {
	case names.CodeOK, names.CodeSame:
	case names.CodeStale, names.CodeExpired, names.CodeNotFound:
		n.dropUnconfirmed(id, pending)
		reply(answer{code: codeLeaseExpired})
		return
	default:
		n.dropUnconfirmed(id, pending)
		reply(answer{code: codeConflict})
		return
	}
	c, err := n.ledger.CommitUnder(id, res.Record.Token, n.clock())
	n.noteCommit(id, err)
	if cur, gerr := n.ledger.Get(id); err != nil && (gerr != nil || cur.CreatedAt.Equal(pending.CreatedAt)) {
		// Unless reserved again (owner.reservedAgain); the owner
		// answers once the registry did (owner.releaseName).
		n.w.reg.do(n.idx, regIn{Op: "release", Key: id, Token: res.Record.Token, Node: n.name}, func(names.Result, bool, bool) {
			reply(answer{code: ledgerCode(err)})
		})
		return
	}
	reply(answer{ledgerCode(err), c})
}

// dropUnconfirmed drops the reservation whose name the registry refused,
// unless it was replaced meanwhile (the real owner holds the device locks
// across the confirm; here another step may run in between).
func (n *node) dropUnconfirmed(id string, pending ledger.Claim) {
	if cur, err := n.ledger.Get(id); err != nil || !cur.CreatedAt.Equal(pending.CreatedAt) || cur.State != ledger.StateReserved {
		return
	}
	if _, err := n.ledger.AbortReservation(id, n.clock()); err != nil && !errors.Is(err, ledger.ErrNotFound) {
		panic(err)
	}
}

// releaseClaim is the owner's Abort of a claim: the ledger lets it go, then
// its name, and only then is the answer given (owner.abort waits for the
// registry, up to its timeout, and answers success even when the name
// could not be let go).
func (n *node) releaseClaim(id string, r func(any)) {
	// Under the ID's commit lock from the ledger's release until the name
	// is let go (owner.abort): a hold of the ID here meanwhile would be
	// answered with the name being let go.
	n.serialize(n.commits, id, func(done func()) {
		reply := func(a any) {
			done()
			r(a)
		}
		a := n.abortOnly(id, false)
		if a.code != codeOK || a.claim.State != ledger.StateCommitted || a.claim.NameToken == 0 {
			reply(a)
			return
		}
		n.w.reg.do(n.idx, regIn{Op: "release", Key: id, Token: a.claim.NameToken, Node: n.name}, func(res names.Result, _, ok bool) {
			rec := res.Record
			if !ok || res.Code != names.CodeStale || rec == nil || rec.State != names.StateHeld || rec.Owner != n.name || rec.Move != nil || rec.Token < a.claim.NameToken {
				reply(a)
				return
			}
			// owner.releasedName: moved back here under a newer token; it
			// goes with the claim unless the ledger holds the ID again.
			if _, err := n.ledger.Get(id); err == nil {
				reply(a)
				return
			}
			n.w.reg.do(n.idx, regIn{Op: "release", Key: id, Token: rec.Token, Node: n.name}, func(names.Result, bool, bool) {
				reply(a)
			})
		})
	})
}

// abort is the owner's Abort and AbortReservation; a released claim lets
// its name go afterwards.
func (n *node) abort(id string, reservationOnly bool) answer {
	a := n.abortOnly(id, reservationOnly)
	if a.code == codeOK && a.claim.State == ledger.StateCommitted {
		n.releaseName(id, a.claim.NameToken)
	}
	return a
}

// abortOnly is abort's ledger part; a released claim is remembered.
func (n *node) abortOnly(id string, reservationOnly bool) answer {
	var (
		c   ledger.Claim
		err error
	)
	if reservationOnly {
		c, err = n.ledger.AbortReservation(id, n.clock())
	} else {
		c, err = n.ledger.Release(id, n.clock())
	}
	if err != nil {
		return answer{code: ledgerCode(err)}
	}
	if c.State == ledger.StateCommitted {
		// The owner's remember (lifecycle.go): the ledger keeps the token
		// the released claim was committed under.
		if err := n.ledger.Remember(c, n.clock(), rememberReleased); err != nil {
			panic(err)
		}
	}
	return answer{codeOK, c}
}

func (n *node) lookup(id string) answer {
	c, err := n.ledger.Get(id)
	if err == nil && !c.Live(n.clock()) {
		return answer{code: codeNotFound}
	}
	return answer{ledgerCode(err), c}
}

// releaseName lets a released claim's name go; what cannot be let go now
// is left for the anti-entropy pass.
func (n *node) releaseName(id string, token uint64) {
	if token == 0 {
		return
	}
	n.w.reg.do(n.idx, regIn{Op: "release", Key: id, Token: token, Node: n.name}, func(names.Result, bool, bool) {})
}

// noteCommit checks, at every commit, that the registry holds the name
// on this server under the token the claim was committed with: a commit
// the name does not back is a second copy in the making. Other servers
// may still hold an older copy (a move commits before it releases, and a
// move cut short leaves one): the anti-entropy pass resolves those, and
// the final checks require that it did.
func (n *node) noteCommit(id string, err error) {
	if err != nil {
		return
	}
	c, _ := n.ledger.Get(id)
	n.w.logf("%s committed %s under token %d", n.name, id, c.NameToken)
	r, ok := n.w.reg.m.Lookup(names.Claim(id))
	if !ok || r.State != names.StateHeld || r.Owner != n.name || r.Token != c.NameToken {
		n.w.violation("claim %s committed on %s under token %d, but the registry has %s", id, n.name, c.NameToken, recText(&r))
	}
	for _, o := range n.w.nodes {
		if o == n || !o.alive {
			continue
		}
		if oc, err := o.ledger.Get(id); err == nil && oc.State == ledger.StateCommitted {
			n.w.copies++
		}
	}
}

// sighting is what made a copy a duplicate (the registry's holder and
// token) or a leftover (no holder, the copy's own token).
type sighting struct {
	owner string
	token uint64
}

// antiEntropy is the pass of antientropy.go and antientropy_moves.go:
// names held here without a live claim are freed, or handed back to the
// server they were moved from (once per token); a committed claim whose
// name is moving here confirms it; one whose name is held elsewhere is a
// duplicate, released by the pass after the one that first saw it once
// the holder answers that it holds the claim committed; one whose name
// was released is a leftover, released the same way (no VM uses claims
// in the simulation).
func (n *node) antiEntropy() {
	w := n.w
	w.reg.do(n.idx, regIn{Op: "list", Node: n.name}, func(res names.Result, _, ok bool) {
		if !ok {
			return
		}
		held := map[string]names.Record{}
		for _, r := range res.Records {
			held[r.Name] = r
		}
		claims := map[string]ledger.Claim{}
		for _, c := range n.ledger.List() {
			if c.Live(n.clock()) {
				claims[c.ID] = c
			}
		}
		for _, r := range res.Records {
			if _, ok := claims[r.Name]; !ok {
				n.nameWithoutClaim(r)
			}
		}
		for id := range n.handedBack {
			if r, ok := held[id]; !ok || claims[id].ID != "" || r.Token != n.handedBack[id] {
				delete(n.handedBack, id)
			}
		}
		for _, c := range n.ledger.List() {
			if c.State != ledger.StateCommitted {
				continue
			}
			if r, ok := held[c.ID]; ok {
				// ownName: a claim moved back carries its old token.
				if c.NameToken != r.Token {
					if _, err := n.ledger.SetNameToken(c.ID, r.Token); err != nil {
						panic(err)
					}
				}
				continue
			}
			c := c
			w.reg.do(n.idx, regIn{Op: "lookup", Key: c.ID}, func(res names.Result, found, ok bool) {
				switch {
				case !ok:
				case !found:
					n.unnamed(c)
				case res.Record.State != names.StateHeld || res.Record.Owner == n.name:
				case res.Record.Move != nil && res.Record.Move.To == n.name && w.time().Before(res.Record.Move.Deadline):
					n.confirmMoveHere(c, *res.Record)
				default:
					w.logf("%s anti-entropy: duplicate %s (kept on %s)", n.name, c.ID, res.Record.Owner)
					if !n.sightedAgain(c.ID, sighting{res.Record.Owner, res.Record.Token}) {
						return
					}
					holder := w.index(res.Record.Owner)
					w.call(n.idx, holder, w.cfg.RPCTimeout, func(r func(any)) { r(w.nodes[holder].lookup(c.ID)) }, func(ans any, ok bool) {
						if !ok || ans.(answer).code != codeOK || ans.(answer).claim.State != ledger.StateCommitted {
							w.logf("%s anti-entropy keeps duplicate %s: %s does not confirm it holds it", n.name, c.ID, res.Record.Owner)
							return
						}
						n.releaseCopy(c, "duplicate")
					})
				}
			})
		}
	})
}

// sightedAgain records sighting s of claim id and reports whether the
// previous pass saw the same.
func (n *node) sightedAgain(id string, s sighting) bool {
	if n.dups[id] == s {
		return true
	}
	n.dups[id] = s
	return false
}

// nameWithoutClaim is the agent's nameWithoutClaim: a name with a move
// under way is left to it; one moved here from another server is handed
// back there once per token; any other is released.
func (n *node) nameWithoutClaim(r names.Record) {
	w := n.w
	switch {
	case r.Move != nil && w.time().Before(r.Move.Deadline):
		return
	case r.MovedFrom != "" && r.MovedFrom != n.name && n.handedBack[r.Name] != r.Token && !n.releasedUnder(r.Name, r.Token):
		w.reg.do(n.idx, regIn{Op: "move", Key: r.Name, Token: r.Token, Node: n.name, To: r.MovedFrom, Caller: n.name, Lease: w.cfg.NameLease}, func(res names.Result, _, ok bool) {
			if ok && (res.Code == names.CodeOK || res.Code == names.CodeSame) {
				n.handedBack[r.Name] = r.Token
				w.logf("%s anti-entropy handed name %s token %d back to %s", n.name, r.Name, r.Token, r.MovedFrom)
			}
		})
	case w.cfg.BrokenFreeWithoutLock:
		w.logf("%s anti-entropy frees name %s token %d", n.name, r.Name, r.Token)
		w.reg.do(n.idx, regIn{Op: "release", Key: r.Name, Token: r.Token, Node: n.name}, func(names.Result, bool, bool) {})
	default:
		// freeName: under the ID's commit lock, the ledger read again (an
		// early hold comes before its reservation).
		n.serialize(n.commits, r.Name, func(done func()) {
			if c, err := n.ledger.Get(r.Name); err == nil && c.Live(n.clock()) {
				done()
				return
			}
			w.logf("%s anti-entropy frees name %s token %d", n.name, r.Name, r.Token)
			w.reg.do(n.idx, regIn{Op: "release", Key: r.Name, Token: r.Token, Node: n.name}, func(names.Result, bool, bool) { done() })
		})
	}
}

// rememberReleased is how long the owners remember released claims (the
// agent's remember_released default).
const rememberReleased = 24 * time.Hour

// releasedUnder reports whether this server's ledger remembers releasing
// claim id committed under name token token.
func (n *node) releasedUnder(id string, token uint64) bool {
	rel, ok, err := n.ledger.Recall(id, n.clock(), rememberReleased)
	if err != nil {
		panic(err)
	}
	return ok && rel.NameToken == token
}

// confirmMoveHere is the agent's: committed claim c takes its name, which
// r says is moving here.
func (n *node) confirmMoveHere(c ledger.Claim, r names.Record) {
	w := n.w
	w.reg.do(n.idx, regIn{Op: "confirm", Key: c.ID, Token: r.Move.Token, Node: n.name}, func(res names.Result, _, ok bool) {
		if !ok || (res.Code != names.CodeOK && res.Code != names.CodeSame) {
			return
		}
		if _, err := n.ledger.SetNameToken(c.ID, res.Record.Token); err != nil {
			return // released meanwhile
		}
		w.logf("%s anti-entropy confirmed %s's move here under token %d", n.name, c.ID, res.Record.Token)
	})
}

// releaseCopy releases committed claim c, a duplicate or leftover, unless
// it changed since the pass read it.
func (n *node) releaseCopy(c ledger.Claim, what string) {
	cur, err := n.ledger.Get(c.ID)
	if err != nil || cur.State != ledger.StateCommitted || !cur.CommittedAt.Equal(c.CommittedAt) || cur.NameToken != c.NameToken {
		return
	}
	if _, err := n.ledger.Release(c.ID, n.clock()); err != nil {
		panic(err)
	}
	n.w.logf("%s anti-entropy released %s %s", n.name, what, c.ID)
}

// unnamed handles committed claim c, whose ID has no name. A claim
// without a token was never named (a broken owner committed without a
// confirm): a violation; the agent adopts those, which only a ledger from
// before the registry has. A claim with a token lost its name by a
// release: a leftover, released on its second sighting.
func (n *node) unnamed(c ledger.Claim) {
	w := n.w
	if c.NameToken == 0 {
		w.violation("claim %s committed on %s with no name in the registry", c.ID, n.name)
		return
	}
	w.logf("%s anti-entropy: leftover %s (token %d)", n.name, c.ID, c.NameToken)
	if n.sightedAgain(c.ID, sighting{token: c.NameToken}) {
		n.releaseCopy(c, "leftover")
	}
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

func removeLedger(path string) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		panic(err)
	}
}
