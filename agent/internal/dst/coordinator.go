package dst

import (
	"fmt"
	"slices"

	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
)

// request is what a client asks for under a claim ID.
type request struct {
	count int
}

func (r request) items() []ledger.Item         { return []ledger.Item{{Model: "L40S", Count: r.count}} }
func (r request) digest() string               { return fmt.Sprintf("v1:l40s-%d", r.count) }
func sameItems(c ledger.Claim, r request) bool { return slices.Equal(c.Items, r.items()) }

// digestOf is the digest an owner computes from its reservation.
func digestOf(c ledger.Claim) string {
	n := 0
	for _, it := range c.Items {
		n += it.Count
	}
	return request{count: n}.digest()
}

// claimLocked runs claim once no other claim of id runs on this agent:
// coordinateOn takes the ID's lock (claimLocks), so a retry through the
// same agent waits for the first try. The lock is in memory: a kill ends
// it with the attempts it ordered.
func (n *node) claimLocked(id string, rq request, reply func(answer)) {
	n.locked(id, func(done func(answer)) { n.claim(id, rq, 0, done) }, reply)
}

// resizeLocked runs a resize under the claim ID's lock, as claims do.
func (n *node) resizeLocked(id string, rq request, reply func(answer)) {
	n.locked(id, func(done func(answer)) { n.resize(id, rq, done) }, reply)
}

func (n *node) locked(id string, op func(func(answer)), reply func(answer)) {
	n.serialize(n.locks, id, func(done func()) {
		op(func(a answer) {
			done()
			reply(a)
		})
	})
}

// serialize runs op once no other op under id in q runs; op calls done
// when it ends, which starts the next one waiting.
func (n *node) serialize(q map[string][]func(), id string, op func(done func())) {
	run := func() {
		op(func() {
			waiting := q[id]
			if len(waiting) == 0 {
				delete(q, id)
				return
			}
			q[id] = waiting[1:]
			n.w.at(n.idx, 0, waiting[0])
		})
	}
	if waiting, busy := q[id]; busy {
		q[id] = append(waiting, run)
		return
	}
	q[id] = nil
	run()
}

// claim is placeNamed (namedclaim.go) on coordinator n: place the claim at
// once (the owner that commits holds the ID in the registry first, which
// is the check), and look the ID up when that owner found it held or
// placed elsewhere (round 1): held, answer it from its holder. The ID is
// looked up before placing, as in round 1, for readFirst after a
// placement through n could not be confirmed (Agent.readNameFirst).
func (n *node) claim(id string, rq request, round int, reply func(answer)) {
	if round == 0 && n.w.now >= n.readFirstUntil {
		n.place(id, rq, 0, round, func(a answer) {
			if a.code == codeUnavailable {
				n.readFirstUntil = n.w.now + readFirst
			}
			reply(a)
		})
		return
	}
	n.lookUpThenPlace(id, rq, round, reply)
}

// readFirst is how long a coordinator reads IDs before placing them after
// a placement through it could not be confirmed (agent's readFirstFor).
const readFirst = 30_000

// lookUpThenPlace looks the ID up; held, answers it from its holder; free,
// places it (lookUpName, then the placement).
func (n *node) lookUpThenPlace(id string, rq request, round int, reply func(answer)) {
	w := n.w
	w.reg.do(n.idx, regIn{Op: "lookup", Key: id}, func(res names.Result, found, ok bool) {
		if !ok {
			reply(answer{code: codeUnavailable})
			return
		}
		if !found {
			n.place(id, rq, 0, round, reply)
			return
		}
		n.answerHeld(id, rq, *res.Record, reply)
	})
}

// answerHeld answers a claim whose ID the registry has (rec), as
// lookUpName does.
func (n *node) answerHeld(id string, rq request, rec names.Record, reply func(answer)) {
	w := n.w
	switch {
	case rec.State == names.StateHeld && rec.Request == rq.digest():
		n.fromHolder(id, rq, rec.Owner, reply)
	case rec.State == names.StateHeld:
		// Held under another digest: the claim may have been
		// resized since, to what this request asks (heldOn).
		o := w.index(rec.Owner)
		w.call(n.idx, o, w.cfg.RPCTimeout, func(r func(any)) { r(w.nodes[o].lookup(id)) }, func(ans any, ok bool) {
			if ok && ans.(answer).code == codeOK && ans.(answer).claim.State == ledger.StateCommitted && sameItems(ans.(answer).claim, rq) {
				reply(ans.(answer))
				return
			}
			reply(answer{code: codeConflict})
		})
	case rec.State == names.StatePending && rec.Request == rq.digest():
		// Being placed the two-step way: the real attempt polls for
		// up to its pending TTL and then answers 503.
		reply(answer{code: codeUnavailable})
	default: // another request's, or lost
		reply(answer{code: codeConflict})
	}
}

// place asks the owners in random order (the coordinator's ranking) to
// reserve and commit, as attempt.ask and attempt.commit do.
func (n *node) place(id string, rq request, token uint64, round int, reply func(answer)) {
	w := n.w
	var order []int
	for _, o := range w.nodes {
		if o.alive { // the gossip view: dead members are not candidates
			order = append(order, o.idx)
		}
	}
	w.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	refused, failed := 0, 0
	var try func(i int)
	try = func(i int) {
		if i == len(order) {
			n.releaseGrant(id, token)
			refusal := answer{code: codeUnavailable}
			if refused > 0 || failed == 0 {
				refusal = answer{code: codeNotAvailable}
			}
			if token != 0 {
				reply(refusal)
				return
			}
			// placeNamed reads the ID again before a refusal stands:
			// held meanwhile, the answer is that claim or its conflict.
			w.reg.do(n.idx, regIn{Op: "lookup", Key: id}, func(res names.Result, found, ok bool) {
				if !ok || !found {
					reply(refusal)
					return
				}
				n.answerHeld(id, rq, *res.Record, reply)
			})
			return
		}
		o := order[i]
		w.call(n.idx, o, w.cfg.RPCTimeout, func(r func(any)) {
			if token == 0 {
				// Named: the owner commits in the same call
				// (owner.commitAtOnce).
				w.nodes[o].reserveAndCommit(id, rq.items(), n.name, r)
				return
			}
			r(w.nodes[o].reserve(id, rq.items(), token, n.name))
		}, func(ans any, ok bool) {
			if !ok {
				failed++
				if token != 0 {
					w.call(n.idx, o, w.cfg.RPCTimeout, func(r func(any)) { r(w.nodes[o].abort(id, true)) }, func(any, bool) {})
					try(i + 1)
					return
				}
				// The call also commits: only an abort that answers that
				// nothing is left lets the placement go on elsewhere
				// (attempt.ask); otherwise the commit is unknown.
				w.call(n.idx, o, w.cfg.RPCTimeout, func(r func(any)) { r(w.nodes[o].abort(id, true)) }, func(ans any, ok bool) {
					if ok && (ans.(answer).code == codeOK || ans.(answer).code == codeNotFound) {
						try(i + 1)
						return
					}
					reply(answer{code: codeUnavailable})
				})
				return
			}
			a := ans.(answer)
			switch a.code {
			case codeOK:
				if token == 0 && a.claim.State == ledger.StateCommitted {
					reply(a)
					return
				}
				if token == 0 {
					// The owner could not decide the commit: the
					// coordinator reads the ID itself first; the
					// registry not answering, the reservation is
					// dropped and the claim is a 503
					// (attempt.registryAnswers).
					w.reg.do(n.idx, regIn{Op: "lookup", Key: id}, func(_ names.Result, _, ok bool) {
						if !ok {
							w.call(n.idx, o, w.cfg.RPCTimeout, func(r func(any)) { r(w.nodes[o].abort(id, true)) }, func(any, bool) {})
							reply(answer{code: codeUnavailable})
							return
						}
						n.commitThen(id, o, token, round, rq, reply)
					})
					return
				}
				n.commitThen(id, o, token, round, rq, reply)
			case codeNotAvailable:
				refused++
				try(i + 1)
			case codeConflict:
				if token == 0 && round == 0 {
					n.claim(id, rq, 1, reply) // placed meanwhile: look again
					return
				}
				n.releaseGrant(id, token)
				reply(a)
			default:
				n.releaseGrant(id, token)
				reply(a)
			}
		})
	}
	try(0)
}

// commitThen commits the reservation on o (commitOn) and answers: a
// conflict or a lapsed lease in round 0 looks the ID up again.
func (n *node) commitThen(id string, o int, token uint64, round int, rq request, reply func(answer)) {
	n.commitOn(id, o, n.w.cfg.CommitAttempts, func(a answer) {
		switch {
		case a.code == codeOK:
			reply(a)
		case a.code == codeUnavailable:
			reply(a) // commit unknown: the name stays
		case round == 0 && (a.code == codeLeaseExpired || a.code == codeConflict):
			n.claim(id, rq, 1, reply)
		default:
			n.releaseGrant(id, token)
			reply(a)
		}
	})
}

// commitOn retries an unanswered commit, as attempt.commit does.
func (n *node) commitOn(id string, o, attempts int, reply func(answer)) {
	w := n.w
	w.call(n.idx, o, w.cfg.RPCTimeout, func(r func(any)) { w.nodes[o].commit(id, r) }, func(ans any, ok bool) {
		if ok && ans.(answer).code != codeUnavailable {
			reply(ans.(answer))
			return
		}
		if attempts > 1 {
			n.commitOn(id, o, attempts-1, reply)
			return
		}
		reply(answer{code: codeUnavailable})
	})
}

func (n *node) releaseGrant(id string, token uint64) {
	if token == 0 {
		return // placed without a grant: the owner holds the ID at commit
	}
	n.w.reg.do(n.idx, regIn{Op: "release", Key: id, Token: token, Node: n.name}, func(names.Result, bool, bool) {})
}

// fromHolder answers a retried claim from the owner that holds its name.
func (n *node) fromHolder(id string, rq request, owner string, reply func(answer)) {
	w := n.w
	o := w.index(owner)
	w.call(n.idx, o, w.cfg.RPCTimeout, func(r func(any)) { r(w.nodes[o].lookup(id)) }, func(ans any, ok bool) {
		if !ok {
			reply(answer{code: codeUnavailable})
			return
		}
		a := ans.(answer)
		switch {
		case a.code == codeNotFound:
			reply(answer{code: codeUnavailable}) // lookupHolder's 503
		case a.code != codeOK:
			reply(a)
		case !sameItems(a.claim, rq):
			reply(answer{code: codeConflict})
		case a.claim.State == ledger.StateCommitted:
			reply(a)
		default:
			n.commitOn(id, o, w.cfg.CommitAttempts, reply)
		}
	})
}

// find is findNamed: the registry says where the ID is held, and op runs
// there. An unavailable registry is a 503 here; the real agent then asks
// every owner's ledger (not modelled).
func (n *node) find(id string, op func(o int) func(func(any)), reply func(answer)) {
	w := n.w
	w.reg.do(n.idx, regIn{Op: "lookup", Key: id}, func(res names.Result, found, ok bool) {
		switch {
		case !ok:
			reply(answer{code: codeUnavailable})
			return
		case !found:
			reply(answer{code: codeNotFound})
			return
		case res.Record.State != names.StateHeld:
			reply(answer{code: codeUnavailable})
			return
		}
		o := w.index(res.Record.Owner)
		w.call(n.idx, o, w.cfg.RPCTimeout, op(o), func(ans any, ok bool) {
			if !ok || ans.(answer).code == codeNotFound {
				reply(answer{code: codeUnavailable})
				return
			}
			reply(ans.(answer))
		})
	})
}

func (n *node) get(id string, reply func(answer)) {
	n.find(id, func(o int) func(func(any)) {
		return func(r func(any)) { r(n.w.nodes[o].lookup(id)) }
	}, reply)
}

// release is coordinator.Release with releaseMovedAway: after the copy
// the registry named is released, a name moved away from it meanwhile
// (a failed resize putting it back on its old copy) is followed and that
// copy released too.
func (n *node) release(id string, reply func(answer)) {
	w := n.w
	w.reg.do(n.idx, regIn{Op: "lookup", Key: id}, func(res names.Result, found, ok bool) {
		switch {
		case !ok:
			reply(answer{code: codeUnavailable})
		case !found:
			reply(answer{code: codeNotFound})
		case res.Record.State != names.StateHeld:
			reply(answer{code: codeUnavailable})
		default:
			n.releaseOn(id, *res.Record, nil, 3, reply)
		}
	})
}

func (n *node) releaseOn(id string, rec names.Record, first *answer, rounds int, reply func(answer)) {
	w := n.w
	o := w.index(rec.Owner)
	w.call(n.idx, o, w.cfg.RPCTimeout, func(r func(any)) { w.nodes[o].releaseClaim(id, r) }, func(ans any, ok bool) {
		if !ok || ans.(answer).code == codeNotFound {
			reply(answer{code: codeUnavailable})
			return
		}
		a := ans.(answer)
		if a.code == codeOK && a.claim.State == ledger.StateReserved {
			// neverClaimed's not found, which lookupHolder answers as a
			// 503: the registry holds the name there, the ledger no claim.
			reply(answer{code: codeUnavailable})
			return
		}
		if a.code != codeOK {
			reply(a)
			return
		}
		if first == nil {
			first = &a
		}
		w.reg.do(n.idx, regIn{Op: "lookup", Key: id}, func(res names.Result, found, ok bool) {
			switch {
			case !ok:
				reply(answer{code: codeUnavailable})
			case !found:
				reply(*first)
			case res.Record.State != names.StateHeld || res.Record.Owner == rec.Owner || res.Record.MovedFrom != rec.Owner ||
				res.Record.Token <= rec.Token || res.Record.Request != rec.Request:
				reply(*first)
			case rounds <= 1:
				reply(answer{code: codeUnavailable})
			default:
				w.logf("%s releases %s on %s too: moved there from %s", n.name, id, res.Record.Owner, rec.Owner)
				n.releaseOn(id, *res.Record, first, rounds-1, reply)
			}
		})
	})
}

func (w *world) index(name string) int {
	for _, n := range w.nodes {
		if n.name == name {
			return n.idx
		}
	}
	panic("no node " + name)
}

// resize is a resize that moves the claim to another server
// (resize_move.go; the in-place resize is not modelled): the name starts
// moving to the new server, which reserves and commits under the move's
// token (its commit confirms the move), and only then is the old copy
// released; a release that fails moves the name back and drops the new
// copy.
func (n *node) resize(id string, rq request, reply func(answer)) {
	w := n.w
	w.reg.do(n.idx, regIn{Op: "lookup", Key: id}, func(res names.Result, found, ok bool) {
		switch {
		case !ok:
			reply(answer{code: codeUnavailable})
			return
		case !found:
			reply(answer{code: codeNotFound})
			return
		case res.Record.State != names.StateHeld:
			reply(answer{code: codeUnavailable})
			return
		}
		rec := *res.Record
		from := w.index(rec.Owner)
		w.call(n.idx, from, w.cfg.RPCTimeout, func(r func(any)) { r(w.nodes[from].lookup(id)) }, func(ans any, ok bool) {
			switch {
			case !ok || ans.(answer).code == codeNotFound:
				reply(answer{code: codeUnavailable})
			case ans.(answer).code != codeOK:
				reply(ans.(answer))
			case sameItems(ans.(answer).claim, rq) && ans.(answer).claim.State == ledger.StateCommitted:
				reply(ans.(answer))
			default:
				n.moveTo(id, rq, rec, from, reply)
			}
		})
	})
}

func (n *node) moveTo(id string, rq request, rec names.Record, from int, reply func(answer)) {
	w := n.w
	var order []int
	for _, o := range w.nodes {
		if o.alive && o.idx != from {
			order = append(order, o.idx)
		}
	}
	w.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	refused, failed := 0, 0
	var try func(i int)
	try = func(i int) {
		if i == len(order) {
			if refused > 0 || failed == 0 {
				reply(answer{code: codeNotAvailable})
			} else {
				reply(answer{code: codeUnavailable})
			}
			return
		}
		t := order[i]
		w.reg.do(n.idx, regIn{Op: "move", Key: id, Token: rec.Token, Node: w.name(from), To: w.name(t), Caller: n.name, Lease: w.cfg.NameLease}, func(res names.Result, _, ok bool) {
			switch {
			case !ok:
				reply(answer{code: codeUnavailable})
				return
			case res.Code == names.CodeConflict, res.Code == names.CodeStale, res.Code == names.CodeLost:
				reply(answer{code: codeConflict})
				return
			case res.Code == names.CodeNotFound:
				reply(answer{code: codeNotFound})
				return
			case res.Code != names.CodeOK && res.Code != names.CodeSame:
				reply(answer{code: codeUnavailable})
				return
			}
			mvToken := res.Record.Move.Token
			w.call(n.idx, t, w.cfg.RPCTimeout, func(r func(any)) {
				r(w.nodes[t].reserve(id, rq.items(), mvToken, n.name))
			}, func(ans any, ok bool) {
				if !ok || ans.(answer).code != codeOK {
					if !ok {
						failed++
						w.call(n.idx, t, w.cfg.RPCTimeout, func(r func(any)) { r(w.nodes[t].abort(id, true)) }, func(any, bool) {})
					} else if ans.(answer).code == codeNotAvailable {
						refused++
					} else {
						failed++
					}
					try(i + 1)
					return
				}
				n.commitOn(id, t, w.cfg.CommitAttempts, func(a answer) {
					switch a.code {
					case codeOK:
					case codeUnavailable:
						reply(a) // the claim stays on from until the move is confirmed
						return
					default:
						w.call(n.idx, t, w.cfg.RPCTimeout, func(r func(any)) { r(w.nodes[t].abort(id, true)) }, func(any, bool) {})
						reply(a)
						return
					}
					moved := a
					w.reg.do(n.idx, regIn{Op: "confirm", Key: id, Token: mvToken, Node: w.name(t)}, func(res names.Result, _, ok bool) {
						switch {
						case !ok:
							reply(answer{code: codeUnavailable}) // both copies kept until settled
							return
						case res.Code != names.CodeOK && res.Code != names.CodeSame:
							n.dropCopy(id, t)
							reply(answer{code: codeConflict})
							return
						}
						w.call(n.idx, from, w.cfg.RPCTimeout, func(r func(any)) { w.nodes[from].releaseClaim(id, r) }, func(ans any, ok bool) {
							if ok && (ans.(answer).code == codeOK || ans.(answer).code == codeNotFound) {
								w.logf("%s moved %s from %s to %s", n.name, id, w.name(from), w.name(t))
								reply(moved)
								return
							}
							n.undoMove(id, from, t, moved.claim, reply)
						})
					})
				})
			})
		})
	}
	try(0)
}

func (n *node) dropCopy(id string, t int) {
	n.w.call(n.idx, t, n.w.cfg.RPCTimeout, func(r func(any)) { n.w.nodes[t].releaseClaim(id, r) }, func(any, bool) {})
}

// undoMove moves the name back to from and drops the new copy on t, as
// resize_move.go's undoMove does when the old copy could not be released.
func (n *node) undoMove(id string, from, t int, moved ledger.Claim, reply func(answer)) {
	w := n.w
	// The new copy may have been released meanwhile: its name must not
	// bring the old copy back to life.
	w.call(n.idx, t, w.cfg.RPCTimeout, func(r func(any)) { r(w.nodes[t].lookup(id)) }, func(ans any, ok bool) {
		if !ok || ans.(answer).code != codeOK || ans.(answer).claim.State != ledger.StateCommitted || !ans.(answer).claim.CreatedAt.Equal(moved.CreatedAt) {
			reply(answer{code: codeConflict})
			return
		}
		n.undoMoveName(id, from, t, reply)
	})
}

func (n *node) undoMoveName(id string, from, t int, reply func(answer)) {
	w := n.w
	w.reg.do(n.idx, regIn{Op: "lookup", Key: id}, func(res names.Result, found, ok bool) {
		if !ok || !found {
			reply(answer{code: codeUnavailable})
			return
		}
		w.reg.do(n.idx, regIn{Op: "move", Key: id, Token: res.Record.Token, Node: w.name(t), To: w.name(from), Caller: n.name, Lease: w.cfg.NameLease}, func(res names.Result, _, ok bool) {
			if !ok || (res.Code != names.CodeOK && res.Code != names.CodeSame) {
				reply(answer{code: codeUnavailable})
				return
			}
			w.reg.do(n.idx, regIn{Op: "confirm", Key: id, Token: res.Record.Move.Token, Node: w.name(from)}, func(res names.Result, _, ok bool) {
				if !ok || (res.Code != names.CodeOK && res.Code != names.CodeSame) {
					reply(answer{code: codeUnavailable})
					return
				}
				n.dropCopy(id, t)
				reply(answer{code: codeConflict})
			})
		})
	})
}
