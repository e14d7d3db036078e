package gossip

import (
	"sync"
	"sync/atomic"
	"time"
)

// Refreshing one member's summary on demand.
//
// A coordinator learns that its view of a server is stale when the server
// refuses a claim its view said fits. Its view would catch up with the
// server's next re-advertisement or the next full-state exchange (tens of
// seconds); meanwhile every claim through it ranks that server by the old
// figures. Refresh runs one push/pull with that server at once instead: a
// TCP round trip that brings the server's current summary (and its view
// of the others).

// refreshGap is the least time between two refreshes of one member, so
// that a burst of refusals costs one exchange.
const refreshGap = time.Second

type refresher struct {
	mu     sync.Mutex
	last   map[string]time.Time // member → when its last refresh began
	closed bool                 // drain has begun
	wg     sync.WaitGroup
	count  atomic.Int64 // refreshes started
}

// Refreshes is how many exchanges Refresh has started; for tests and
// diagnostics.
func (c *Cluster) Refreshes() int64 { return c.refresh.count.Load() }

// Refresh runs, in the background, one full-state exchange with member
// name so that its summary in this view is its current one; at most one a
// second per member. A member the view does not list as alive or suspect
// is skipped. It reports whether an exchange was started.
func (c *Cluster) Refresh(name string) bool {
	var addr string
	for _, m := range c.view.list() {
		if m.Name == name && !m.Self && (m.State == StateAlive || m.State == StateSuspect) {
			addr = m.Addr
		}
	}
	if addr == "" {
		return false
	}
	r := &c.refresh
	r.mu.Lock()
	if r.closed || c.closing.Load() {
		r.mu.Unlock()
		return false
	}
	if r.last == nil {
		r.last = map[string]time.Time{}
	}
	if t, ok := r.last[name]; ok && time.Since(t) < refreshGap {
		r.mu.Unlock()
		return false
	}
	r.last[name] = time.Now()
	r.count.Add(1)
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		if _, err := c.ml.Join([]string{addr}); err != nil {
			c.log.Debug("refreshing a member's summary failed; its next re-advertisement will do", "member", name, "err", oneLine(err))
			return
		}
		c.log.Debug("refreshed a member's summary after a stale answer", "member", name)
	}()
	return true
}

// drain refuses further refreshes and waits for those in flight.
func (r *refresher) drain() {
	r.mu.Lock()
	r.closed = true // under r.mu: no Refresh adds itself to r.wg after this
	r.mu.Unlock()
	r.wg.Wait()
}
