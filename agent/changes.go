package agent

import (
	"context"
	"sync"
)

// changeFeed counts this server's changes and wakes whoever waits for the
// next one (api.Watcher): the Kubernetes driver republishes its devices
// within moments of a claim, a release, a drain or a readiness change,
// without polling the agent.
type changeFeed struct {
	mu   sync.Mutex
	gen  uint64
	next chan struct{} // closed at the next change
}

// bump records a change and wakes every waiter.
func (f *changeFeed) bump() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	if f.next != nil {
		close(f.next)
		f.next = nil
	}
}

// current is the count of changes so far.
func (f *changeFeed) current() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gen
}

// wait returns once the count is not after (it moved on, or this is
// another run of the agent), or when ctx ends.
func (f *changeFeed) wait(ctx context.Context, after uint64) uint64 {
	for {
		f.mu.Lock()
		if f.gen != after {
			g := f.gen
			f.mu.Unlock()
			return g
		}
		if f.next == nil {
			f.next = make(chan struct{})
		}
		ch := f.next
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return f.current()
		}
	}
}

// Generation is the count of this server's changes (api.Watcher).
func (a *Agent) Generation() uint64 { return a.feed.current() }

// WaitChange returns once this server changed past after, or when ctx
// ends (api.Watcher).
func (a *Agent) WaitChange(ctx context.Context, after uint64) uint64 {
	return a.feed.wait(ctx, after)
}
