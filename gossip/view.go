package gossip

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Member states, as Member.State shows them.
const (
	StateAlive   = "alive"   // answering; its summary may be used for placement
	StateSuspect = "suspect" // this agent's probe got no ack and no sign of life since; not yet declared dead
	StateDead    = "dead"    // declared failed by the cluster
	StateLeft    = "left"    // left gracefully (Cluster.Leave)
)

// Member is one server as this agent sees it.
type Member struct {
	Name       string  // memberlist node name
	Addr       string  // ip:port of its gossip endpoint
	State      string  // StateAlive, StateSuspect, StateDead or StateLeft
	Summary    Summary // its last known capacity summary
	SummaryErr error   // why its metadata did not decode (a newer or broken agent): list it, do not place on it
	Self       bool    // this agent
}

// Usable reports whether the member's summary may guide placement: it is
// alive and its summary decoded. Even then it is only a hint.
func (m Member) Usable() bool {
	return m.State == StateAlive && m.SummaryErr == nil
}

// view is this agent's picture of the cluster, built from memberlist's events.
// It remembers departed members for a while so operators can see who went away.
type view struct {
	self     string
	remember time.Duration
	now      func() time.Time

	mu      sync.Mutex
	members map[string]*viewEntry
	subs    map[int]subscriber
	nextSub int
	// snap is list's last answer, until a change (notifyLocked drops it) or
	// snapUntil, when a departed member is due to be forgotten. Coordinators
	// read the view on every claim; it changes far less often.
	snap      []Member
	snapUntil time.Time
	// deadForgotten are members forgotten while dead (see deadCount):
	// until one comes back or leaves, it is still dead.
	deadForgotten map[string]struct{}
}

type viewEntry struct {
	Member
	changed time.Time // when State last changed
}

func newView(self string, remember time.Duration) *view {
	return &view{
		self:     self,
		remember: remember,
		now:      time.Now,
		members:  make(map[string]*viewEntry),
		subs:     make(map[int]subscriber),

		deadForgotten: make(map[string]struct{}),
	}
}

// alive records a member memberlist reports as joined or updated.
func (v *view) alive(name string, ip net.IP, port uint16, meta []byte) {
	s, err := DecodeSummary(meta)
	v.mu.Lock()
	defer v.mu.Unlock()
	_, known := v.members[name]
	e := v.entry(name)
	addr := net.JoinHostPort(ip.String(), strconv.Itoa(int(port)))
	membership := !known || e.State != StateAlive || e.Addr != addr ||
		(e.SummaryErr == nil) != (err == nil) || !sameBesidesCapacity(e.Summary, s)
	if known && err == nil && e.SummaryErr == nil {
		s = keepLearned(e.Summary, s)
	}
	e.Addr = addr
	e.Summary, e.SummaryErr = s, err
	v.setState(e, StateAlive)
	v.notifyLocked(membership)
}

// sameBesidesCapacity reports whether two summaries of a member differ at
// most in its capacity (free counts, ledger revision): what most of its
// re-advertisements change, and what no membership subscriber reads.
func sameBesidesCapacity(a, b Summary) bool {
	return a.AgentVersion == b.AgentVersion && a.PeerAddr == b.PeerAddr && a.Drained == b.Drained &&
		a.Leaving == b.Leaving && a.Boot == b.Boot && a.Names == b.Names
}

// gone records a member memberlist reports as dead or left. memberlist does
// not say which; a member that announced its leave in its summary left.
func (v *view) gone(name string, meta []byte) {
	v.mu.Lock()
	defer v.mu.Unlock()
	e := v.entry(name)
	if s, err := DecodeSummary(meta); err == nil {
		e.Summary, e.SummaryErr = s, nil
	}
	state := StateDead
	if e.SummaryErr == nil && e.Summary.Leaving {
		state = StateLeft
	}
	v.setState(e, state)
	v.notifyLocked(true)
}

// suspect records that this agent's probe of name failed.
func (v *view) suspect(name string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if e, ok := v.members[name]; ok && e.State == StateAlive {
		v.setState(e, StateSuspect)
		v.notifyLocked(true)
	}
}

// acked records a sign of life from name (an ack to our probe, an alive
// message), which ends this agent's suspicion of it.
func (v *view) acked(name string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if e, ok := v.members[name]; ok && e.State == StateSuspect {
		v.setState(e, StateAlive)
		v.notifyLocked(true)
	}
}

func (v *view) entry(name string) *viewEntry {
	e, ok := v.members[name]
	if !ok {
		e = &viewEntry{Member: Member{Name: name, Self: name == v.self}}
		v.members[name] = e
	}
	return e
}

func (v *view) setState(e *viewEntry, state string) {
	if e.State != state {
		e.State = state
		e.changed = v.now()
	}
	if state != StateDead {
		delete(v.deadForgotten, e.Name)
	}
}

// list returns the members sorted by name, forgetting departed ones older
// than the remember period.
//
// The slice is shared between callers until the next change, and must not
// be modified (ranging over it copies each member, which is fine); the
// summaries are never modified after they were decoded. Coordinators read
// the view on every claim, so it is not copied for each reader.
func (v *view) list() []Member {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	if v.snap != nil && now.Before(v.snapUntil) {
		return v.snap
	}
	out := make([]Member, 0, len(v.members))
	until := now.Add(v.remember)
	for name, e := range v.members {
		departed := e.State == StateDead || e.State == StateLeft
		if departed && !e.Self {
			forget := e.changed.Add(v.remember)
			if now.After(forget) {
				if e.State == StateDead {
					v.deadForgotten[name] = struct{}{}
				}
				delete(v.members, name)
				continue
			}
			if forget.Before(until) {
				until = forget
			}
		}
		out = append(out, e.Member)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	v.snap, v.snapUntil = slices.Clip(out), until.Add(time.Nanosecond)
	return v.snap
}

// subscriber is one subscription: its channel, and whether it wants every
// change or membership changes only (see subscribe).
type subscriber struct {
	ch         chan struct{}
	membership bool
}

// member returns one member by name, as list would show it, without
// building the whole list: a watcher of one server reads it cheaply.
func (v *view) member(name string) (Member, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	e, ok := v.members[name]
	if !ok {
		return Member{}, false
	}
	departed := e.State == StateDead || e.State == StateLeft
	if departed && !e.Self && v.now().After(e.changed.Add(v.remember)) {
		return Member{}, false // list forgets it on its next call
	}
	m := e.Member
	m.Summary.Models = slices.Clone(m.Summary.Models)
	return m, true
}

// subscribe returns a channel that receives a value after any change, with
// changes in a row merged into one, and a function that ends the
// subscription. With membership, only changes of membership count: a member
// joining, going or changing state, address or anything in its summary but
// its capacity. A capacity change of some member is what every claim
// anywhere causes, and most readers of the view do not care.
func (v *view) subscribe(membership bool) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	v.mu.Lock()
	id := v.nextSub
	v.nextSub++
	v.subs[id] = subscriber{ch: ch, membership: membership}
	v.mu.Unlock()
	return ch, func() {
		v.mu.Lock()
		defer v.mu.Unlock()
		if _, ok := v.subs[id]; ok {
			delete(v.subs, id)
			close(ch)
		}
	}
}

// notifyLocked drops the snapshot and tells the subscribers; membership
// says whether the change is one of membership (see subscribe).
func (v *view) notifyLocked(membership bool) {
	v.snap = nil
	for _, sub := range v.subs {
		if sub.membership && !membership {
			continue
		}
		select {
		case sub.ch <- struct{}{}:
		default: // a change is already pending; the reader re-reads everything
		}
	}
}
