package names

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// state is the replicated map of names and the counts its limits need.
// It is plain data: no clock (time arrives in commands), no locks (the FSM
// serialises), no I/O.
type state struct {
	records map[Key]Record
	// pendingBy counts pending names per caller, heldBy held and lost
	// names per owner.
	pendingBy map[string]int
	heldBy    map[string]int
	// recent is where released claim IDs last ran (remember.go); forget
	// orders them by when they are forgotten.
	recent map[Key]lastRun
	forget forgetQueue
	// now is the latest time any command carried. A new leader's clock may
	// be behind its predecessor's; time in the registry never goes back.
	now time.Time
}

func newState() *state {
	return &state{records: map[Key]Record{}, pendingBy: map[string]int{}, heldBy: map[string]int{}, recent: map[Key]lastRun{}}
}

func (s *state) advance(t time.Time) time.Time {
	if t.After(s.now) {
		s.now = t
		s.forgetPast(t)
	}
	return s.now
}

func (s *state) put(r Record) {
	s.remove(r.Key())
	s.records[r.Key()] = r
	switch r.State {
	case StatePending:
		s.pendingBy[r.Caller]++
	case StateHeld, StateLost:
		s.heldBy[r.Owner]++
	}
}

func (s *state) remove(k Key) (Record, bool) {
	r, ok := s.records[k]
	if !ok {
		return r, false
	}
	delete(s.records, k)
	switch r.State {
	case StatePending:
		decr(s.pendingBy, r.Caller)
	case StateHeld, StateLost:
		decr(s.heldBy, r.Owner)
	}
	return r, true
}

func decr(m map[string]int, k string) {
	if m[k] <= 1 {
		delete(m, k)
		return
	}
	m[k]--
}

// get returns the live record of k at the registry's time: a pending name
// past its deadline is gone even before an expiry command collects it.
func (s *state) get(k Key) (Record, bool) {
	r, ok := s.records[k]
	if !ok || !r.live(s.now) {
		return Record{}, false
	}
	return r.at(s.now), true
}

// apply runs one decoded command written at raft index idx.
func (s *state) apply(idx uint64, t messageType, body any) Result {
	switch m := body.(type) {
	case *acquireMessage:
		return s.acquire(idx, m)
	case *confirmMessage:
		return s.confirm(idx, m)
	case *releaseMessage:
		return s.release(m)
	case *expireMessage:
		return s.expire(m)
	case *removeMemberMessage:
		return s.removeMember(idx, m)
	case *setMembersMessage:
		return s.setMembers(idx, m)
	case *moveMessage:
		return s.move(idx, m)
	case *setRequestMessage:
		return s.setRequest(idx, m)
	case *stampMessage:
		return s.stamp(idx, m)
	case *holdMessage:
		return s.hold(idx, m)
	}
	return Result{Code: CodeInvalid, Detail: fmt.Sprintf("no rule for %s", t)}
}

// takenFrom refuses a request for key, whose live record is r, when r is
// another request's, or lost.
func takenFrom(k Key, r Record, request string) (Result, bool) {
	switch {
	case r.Request != request:
		return Result{Code: CodeConflict, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s is %s by another request on %s", k, r.State, r.holder())}, true
	case r.State == StateLost:
		return Result{Code: CodeLost, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s was held on %s, which was removed from the cluster; release it first", k, r.Owner)}, true
	}
	return Result{}, false
}

func (s *state) acquire(idx uint64, m *acquireMessage) Result {
	now := s.advance(m.Now)
	if r, ok := s.get(m.Key); ok {
		if res, taken := takenFrom(m.Key, r, m.Request); taken {
			return res
		}
		return withRecord(CodeSame, r)
	}
	if n := m.Limits.Members; n > 0 && len(m.Members) > n {
		return Result{Code: CodeLimit, Detail: fmt.Sprintf("%s has %d members; at most %d are allowed", m.Key, len(m.Members), n)}
	}
	if n := m.Limits.PendingPerCaller; n > 0 && s.pendingBy[m.Caller] >= n {
		return Result{Code: CodeLimit, Detail: fmt.Sprintf("%s is placing %d names already, the most one caller may", m.Caller, s.pendingBy[m.Caller])}
	}
	r := Record{
		Kind: m.Key.Kind, Name: m.Key.Name,
		Owner: m.Owner, Caller: m.Caller, Request: m.Request,
		State: StatePending, Token: idx, Deadline: now.Add(m.Lease),
		Members: slices.Clone(m.Members), Index: idx,
	}
	s.put(r)
	return withRecord(CodeOK, r)
}

// hold makes a claim ID held on the server that commits it, in one write:
// the claim path's acquire and confirm together. A name already held on
// that server under the same request is the same hold (a retried
// commit); held elsewhere, being placed, moving away, held under another
// request, or lost, it is refused, and the owner drops its reservation.
func (s *state) hold(idx uint64, m *holdMessage) Result {
	s.advance(m.Now)
	if r, ok := s.get(m.Key); ok {
		if res, taken := takenFrom(m.Key, r, m.Request); taken {
			return res
		}
		switch {
		case r.State == StatePending:
			return Result{Code: CodeConflict, Record: ptr(r.clone()),
				Detail: fmt.Sprintf("%s is being placed by %s", m.Key, r.Caller)}
		case r.Owner != m.Owner:
			return Result{Code: CodeConflict, Record: ptr(r.clone()),
				Detail: fmt.Sprintf("%s is held on %s", m.Key, r.Owner)}
		case r.Move != nil:
			// On its way to another server (a resize, or a name handed
			// back): a claim committed here under it would lose it when
			// the move is confirmed.
			return Result{Code: CodeConflict, Record: ptr(r.clone()),
				Detail: fmt.Sprintf("%s is moving from %s to %s", m.Key, r.Owner, r.Move.To)}
		}
		return withRecord(CodeSame, r)
	}
	if m.Recall {
		if res, refused := s.recalled(m.Key, m.Owner); refused {
			return res
		}
	}
	if n := m.Limits.HeldPerOwner; n > 0 && s.heldBy[m.Owner] >= n {
		return Result{Code: CodeLimit, Detail: fmt.Sprintf("%s holds %d names already, the most one server may", m.Owner, s.heldBy[m.Owner])}
	}
	r := Record{
		Kind: m.Key.Kind, Name: m.Key.Name,
		Owner: m.Owner, Caller: m.Caller, Request: m.Request,
		State: StateHeld, Token: idx, Index: idx,
	}
	delete(s.recent, m.Key) // it runs again: its next release says where
	s.put(r)
	return withRecord(CodeOK, r)
}

func (s *state) confirm(idx uint64, m *confirmMessage) Result {
	now := s.advance(m.Now)
	r, ok := s.records[m.Key]
	if !ok {
		return Result{Code: CodeNotFound, Detail: fmt.Sprintf("%s is not held: its grant lapsed or was released", m.Key)}
	}
	if m.Caller != "" && m.Caller != m.Owner {
		// Only a move's own coordinator may confirm it for another node.
		if r.Move == nil || r.Move.Token != m.Token || r.Move.Caller != m.Caller || r.State != StateHeld {
			return Result{Code: CodeConflict, Record: ptr(r.clone()),
				Detail: fmt.Sprintf("%s: %s may not confirm it for %s: only a node confirms its own names, or a move's coordinator that move", m.Key, m.Caller, m.Owner)}
		}
	}
	if r.Move != nil && r.Move.Token == m.Token && r.State == StateHeld {
		return s.confirmMove(idx, now, r, m)
	}
	if r.Token != m.Token {
		return Result{Code: CodeStale, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s token %d is not its current token %d: the grant ended", m.Key, m.Token, r.Token)}
	}
	switch r.State {
	case StatePending:
		if !r.live(now) {
			s.remove(m.Key)
			return Result{Code: CodeExpired, Record: ptr(r.clone()),
				Detail: fmt.Sprintf("%s lapsed at %s before it was confirmed", m.Key, r.Deadline.UTC().Format(time.RFC3339Nano))}
		}
		if n := m.Limits.HeldPerOwner; n > 0 && s.heldBy[m.Owner] >= n {
			return Result{Code: CodeLimit, Detail: fmt.Sprintf("%s holds %d names already, the most one server may", m.Owner, s.heldBy[m.Owner])}
		}
		if n := m.Limits.Members; n > 0 && len(m.Members) > n {
			return Result{Code: CodeLimit, Detail: fmt.Sprintf("%s has %d members; at most %d are allowed", m.Key, len(m.Members), n)}
		}
		r.State, r.Owner, r.Deadline, r.Index = StateHeld, m.Owner, time.Time{}, idx
		if m.Members != nil {
			r.Members = slices.Clone(m.Members)
		}
		s.put(r)
		return withRecord(CodeOK, r)
	case StateHeld:
		if r.Owner != m.Owner {
			return Result{Code: CodeConflict, Record: ptr(r.clone()),
				Detail: fmt.Sprintf("%s is held on %s", m.Key, r.Owner)}
		}
		return withRecord(CodeSame, r)
	default: // lost
		return Result{Code: CodeLost, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s was held on %s, which was removed from the cluster", m.Key, r.Owner)}
	}
}

// move starts moving a held name to another server: it stays held where
// it is until the new server confirms the move's token (confirmMove).
func (s *state) move(idx uint64, m *moveMessage) Result {
	now := s.advance(m.Now)
	r, ok := s.get(m.Key)
	switch {
	case !ok:
		return Result{Code: CodeNotFound, Detail: fmt.Sprintf("%s is not held", m.Key)}
	case r.State == StateLost:
		return Result{Code: CodeLost, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s was held on %s, which was removed from the cluster; release it first", m.Key, r.Owner)}
	case r.State != StateHeld:
		return Result{Code: CodeConflict, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s is still being placed by %s; only a held name moves", m.Key, r.Caller)}
	case r.Token != m.Token:
		return Result{Code: CodeStale, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s token %d is not its current token %d: the grant ended", m.Key, m.Token, r.Token)}
	case r.Owner != m.From:
		return Result{Code: CodeConflict, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s is held on %s, not %s", m.Key, r.Owner, m.From)}
	case r.Owner == m.To:
		return Result{Code: CodeInvalid, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s is held on %s already", m.Key, m.To)}
	}
	if mv := r.Move; mv != nil {
		switch {
		case mv.To == m.To && mv.Caller == m.Caller:
			return withRecord(CodeSame, r)
		case mv.Caller != m.Caller:
			return Result{Code: CodeConflict, Record: ptr(r.clone()),
				Detail: fmt.Sprintf("%s is being moved to %s by %s", m.Key, mv.To, mv.Caller)}
		}
		// The same caller tries another server (the first one said no):
		// the new move replaces its own, whose token can no longer be
		// confirmed.
	}
	r.Move = &Move{To: m.To, Token: idx, Deadline: now.Add(m.Lease), Caller: m.Caller}
	r.Index = idx
	s.put(r)
	return withRecord(CodeOK, r)
}

// confirmMove is the new server's confirm of a move: the name is held
// there, under the move's token, in the same step that ends its hold on
// the old server; an older token (the old server's) is stale from then on.
func (s *state) confirmMove(idx uint64, now time.Time, r Record, m *confirmMessage) Result {
	mv := r.Move
	switch {
	case !now.Before(mv.Deadline):
		r.Move, r.Index = nil, idx
		s.put(r)
		return Result{Code: CodeExpired, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s: its move to %s lapsed at %s before it was confirmed; it stays on %s", m.Key, mv.To, mv.Deadline.UTC().Format(time.RFC3339Nano), r.Owner)}
	case mv.To != m.Owner:
		return Result{Code: CodeConflict, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s is moving to %s, not %s", m.Key, mv.To, m.Owner)}
	}
	if n := m.Limits.HeldPerOwner; n > 0 && s.heldBy[m.Owner] >= n {
		return Result{Code: CodeLimit, Detail: fmt.Sprintf("%s holds %d names already, the most one server may", m.Owner, s.heldBy[m.Owner])}
	}
	r.MovedFrom, r.Owner, r.Token, r.Move, r.Index = r.Owner, mv.To, mv.Token, nil, idx
	s.put(r)
	return withRecord(CodeOK, r)
}

func (s *state) release(m *releaseMessage) Result {
	now := s.advance(m.Now)
	r, ok := s.records[m.Key]
	if !ok || !r.live(s.now) {
		return Result{Code: CodeNotFound, Detail: fmt.Sprintf("%s is not held", m.Key)}
	}
	if m.Token != 0 && m.Token != r.Token {
		return Result{Code: CodeStale, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s token %d is not its current token %d: it was granted again since", m.Key, m.Token, r.Token)}
	}
	// A lost name's holder was removed for good and will never release
	// it, and a group belongs to the cluster, not to the agent that
	// created it: whoever brings its current token may release either (an
	// operator's release or group delete through any agent).
	byToken := m.Token == r.Token && (r.State == StateLost || r.Kind == KindGroup)
	if m.Node != "" && m.Node != r.holder() && !byToken {
		return Result{Code: CodeConflict, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s is %s by %s, not %s", m.Key, r.State, r.holder(), m.Node)}
	}
	s.remove(m.Key)
	delete(s.recent, m.Key)
	if m.Remember > 0 && r.Kind == KindClaim && r.State == StateHeld {
		s.remember(m.Key, r.Owner, now.Add(m.Remember))
	}
	r.State = StateReleased
	return withRecord(CodeOK, r)
}

func (s *state) expire(m *expireMessage) Result {
	now := s.advance(m.Now)
	var keys []Key
	for k, r := range s.records {
		if !r.live(now) {
			keys = append(keys, k)
		}
	}
	sortKeys(keys)
	for _, k := range keys {
		s.remove(k)
	}
	return Result{Code: CodeOK, Keys: keys}
}

func (s *state) removeMember(idx uint64, m *removeMemberMessage) Result {
	now := s.advance(m.Now)
	var keys []Key
	for k, r := range s.records {
		switch {
		case r.State == StatePending && (r.Caller == m.Node || !r.live(now)):
			// Its coordinator is gone, and nothing was committed under it
			// (a commit confirms first): drop it.
			keys = append(keys, k)
		case r.State == StateHeld && r.Owner == m.Node:
			keys = append(keys, k)
		}
	}
	// A move to the removed server, or by it, can never be confirmed:
	// the name stays where it is.
	for k, r := range s.records {
		if r.State == StateHeld && r.Owner != m.Node && r.Move != nil && (r.Move.To == m.Node || r.Move.Caller == m.Node) {
			keys = append(keys, k)
		}
	}
	sortKeys(keys)
	for _, k := range keys {
		r, _ := s.remove(k)
		switch {
		case r.State == StatePending:
			// Dropped.
		case r.Owner == m.Node:
			r.State, r.Move, r.Index = StateLost, nil, idx
			s.put(r)
		default:
			r.Move, r.Index = nil, idx
			s.put(r)
		}
	}
	return Result{Code: CodeOK, Keys: keys}
}

func (s *state) setMembers(idx uint64, m *setMembersMessage) Result {
	r, ok := s.get(m.Key)
	if !ok {
		return Result{Code: CodeNotFound, Detail: fmt.Sprintf("%s is not held", m.Key)}
	}
	if r.Token != m.Token {
		return Result{Code: CodeStale, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s token %d is not its current token %d", m.Key, m.Token, r.Token)}
	}
	if n := m.Limits.Members; n > 0 && len(m.Members) > n {
		return Result{Code: CodeLimit, Detail: fmt.Sprintf("%s has %d members; at most %d are allowed", m.Key, len(m.Members), n)}
	}
	if slices.Equal(r.Members, m.Members) {
		return withRecord(CodeSame, r)
	}
	r.Members, r.Index = slices.Clone(m.Members), idx
	s.put(r)
	return withRecord(CodeOK, r)
}

// heldGroup is key's record when it is a group held under token, else
// the refusal: not found, stale, or (still pending) a conflict saying
// that only a held group does what (e.g. "is stamped").
func (s *state) heldGroup(key Key, token uint64, what string) (Record, *Result) {
	r, ok := s.get(key)
	switch {
	case !ok:
		return r, &Result{Code: CodeNotFound, Detail: fmt.Sprintf("%s is not held", key)}
	case r.Token != token:
		return r, &Result{Code: CodeStale, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s token %d is not its current token %d", key, token, r.Token)}
	case r.State != StateHeld:
		return r, &Result{Code: CodeConflict, Record: ptr(r.clone()),
			Detail: fmt.Sprintf("%s is %s; only a held group%s", key, r.State, what)}
	}
	return r, nil
}

// stamp moves a held group's Index to idx under its token: the start of
// a group operation (Registry.Stamp).
func (s *state) stamp(idx uint64, m *stampMessage) Result {
	r, refusal := s.heldGroup(m.Key, m.Token, " is stamped")
	if refusal != nil {
		return *refusal
	}
	r.Index = idx
	s.put(r)
	return withRecord(CodeOK, r)
}

// setRequest replaces a held group's request digest under its token.
func (s *state) setRequest(idx uint64, m *setRequestMessage) Result {
	r, refusal := s.heldGroup(m.Key, m.Token, "'s request changes")
	switch {
	case refusal != nil:
		return *refusal
	case r.Request == m.Request:
		return withRecord(CodeSame, r)
	}
	r.Request, r.Index = m.Request, idx
	s.put(r)
	return withRecord(CodeOK, r)
}

// pendingPast reports whether some pending name lapsed by now: the
// leader proposes an expiry only then, so an idle registry writes nothing.
func (s *state) pendingPast(now time.Time) bool {
	for _, r := range s.records {
		if r.State == StatePending && !now.Before(r.Deadline) {
			return true
		}
	}
	return false
}

func sortKeys(keys []Key) { slices.SortFunc(keys, compareKeys) }

func compareKeys(a, b Key) int {
	if c := cmp.Compare(a.Kind, b.Kind); c != 0 {
		return c
	}
	return cmp.Compare(a.Name, b.Name)
}

func ptr[T any](v T) *T { return &v }
