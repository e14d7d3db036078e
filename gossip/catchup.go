package gossip

import (
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// Catching up after membership changes.
//
// A member's arrival or departure spreads as an epidemic broadcast with a
// bounded number of retransmissions. When dozens of servers start within a
// second, a member can miss one, and memberlist repairs that only with its
// periodic full-state exchange (push/pull): every 30 s on a LAN, every 60 s
// above 32 members, every 90 s above 64. Meanwhile that member does not see
// the server at all. So once a burst of membership changes has settled, this
// member runs one extra push/pull, with a member that was not part of the
// burst when there is one: the members that joined exchanged their whole
// state when they joined; the ones that did not change are those that may
// have missed them.

// catchUpTimings say when the extra exchange happens.
type catchUpTimings struct {
	quiet time.Duration // after the last change of a burst
	most  time.Duration // after the first, however long the burst goes on
	gap   time.Duration // at least between two exchanges, so a flapping member costs little
	// exchanged, when set, is told the member of each exchange that went
	// through; for tests.
	exchanged func(with string)
}

var defaultCatchUp = catchUpTimings{quiet: time.Second, most: 5 * time.Second, gap: 10 * time.Second}

type catchUp struct {
	c       *Cluster
	t       catchUpTimings
	log     *slog.Logger
	mu      sync.Mutex
	changed map[string]bool // members that joined, came back, left or died since the last exchange
	kick    chan struct{}
	quit    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// newCatchUp is ready for note before memberlist starts (it reports members
// from then on); start runs the loop once c.ml is set.
func newCatchUp(c *Cluster, t catchUpTimings, log *slog.Logger) *catchUp {
	return &catchUp{c: c, t: t, log: log, changed: map[string]bool{},
		kick: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
}

func (u *catchUp) start() { go u.run() }

// note records a membership change of member name. memberlist calls it with
// its node lock held: it only marks and wakes the loop.
func (u *catchUp) note(name string) {
	if name == u.c.view.self {
		return
	}
	u.mu.Lock()
	u.changed[name] = true
	u.mu.Unlock()
	select {
	case u.kick <- struct{}{}:
	default:
	}
}

// stop ends the loop without waiting; wait waits for it to end (an exchange
// in flight ends with memberlist's shutdown or its TCP timeout).
func (u *catchUp) stop() { u.once.Do(func() { close(u.quit) }) }
func (u *catchUp) wait() { <-u.done }

func (u *catchUp) run() {
	defer close(u.done)
	var last time.Time
	for {
		select {
		case <-u.quit:
			return
		case <-u.kick:
		}
		// Let the burst settle.
		first := time.Now()
		t := time.NewTimer(u.t.quiet)
		for settled := false; !settled; {
			select {
			case <-u.quit:
				t.Stop()
				return
			case <-u.kick:
				t.Reset(max(min(u.t.quiet, u.t.most-time.Since(first)), 0))
			case <-t.C:
				settled = true
			}
		}
		if wait := u.t.gap - time.Since(last); !last.IsZero() && wait > 0 {
			t.Reset(wait)
			select {
			case <-u.quit:
				t.Stop()
				return
			case <-t.C:
			}
		}
		u.exchange()
		last = time.Now()
	}
}

// exchange runs one push/pull with a member that was not part of the
// changes since the last one, or with any member when all were.
func (u *catchUp) exchange() {
	u.mu.Lock()
	changed := u.changed
	u.changed = map[string]bool{}
	u.mu.Unlock()
	if u.c.closing.Load() {
		return
	}
	// The view, not memberlist.Members: Members hands out memberlist's own
	// node structs, whose Addr and Port an alive message rewrites under
	// memberlist's lock while we would read them without it (a data race
	// the race detector reported in go test ./agent). The view copied them
	// in the event delegate, under that lock.
	var steady, fresh []Member
	for _, m := range u.c.view.list() {
		switch {
		case m.Self || (m.State != StateAlive && m.State != StateSuspect):
		case changed[m.Name]:
			fresh = append(fresh, m)
		default:
			steady = append(steady, m)
		}
	}
	pool := steady
	if len(pool) == 0 {
		pool = fresh
	}
	if len(pool) == 0 {
		return
	}
	n := pool[rand.IntN(len(pool))]
	if _, err := u.c.ml.Join([]string{n.Addr}); err != nil {
		u.log.Debug("catch-up exchange after membership changes failed; memberlist's periodic one will do", "with", n.Name, "err", oneLine(err))
		return
	}
	u.log.Debug("caught up after membership changes", "with", n.Name, "changes", len(changed))
	if u.t.exchanged != nil {
		u.t.exchanged(n.Name)
	}
}
