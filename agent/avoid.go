package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// Members whose peer API does not answer (docs/protocol.md, "Who may say
// what"). Gossip is a hint, and anyone with the gossip key can advertise
// free GPUs at an address that never answers. Such a member must cost a
// claim one short attempt — connecting is bounded by
// api.PeerConnectTimeout, whatever the call's own deadline — and then be
// avoided for a while: ranked last, and called not at all until its
// backoff passes, a call to it succeeds, or gossip shows it changed (it
// restarted, or advertises another address).

const (
	avoidFirst = 5 * time.Second // the first backoff after a failed connect
	avoidMax   = time.Minute     // the longest; each failure in a row doubles it
)

// avoidance is the per-member backoff of this agent's peer calls.
type avoidance struct {
	clk clock.Clock
	// boot returns the gossiped boot of a member, to tell a restart.
	boot func(name string) uint64
	log  *slog.Logger
	n    atomic.Int32 // len(m), read without the lock on every ranking
	mu   sync.Mutex
	m    map[string]*avoidEntry
}

type avoidEntry struct {
	until time.Time
	wait  time.Duration
	addr  string // the address that did not answer
	boot  uint64 // the member's boot then
	err   error  // why
}

func newAvoidance(clk clock.Clock, boot func(string) uint64, log *slog.Logger) *avoidance {
	return &avoidance{clk: clk, boot: boot, log: log, m: map[string]*avoidEntry{}}
}

// failed records that connecting to name at addr failed.
func (v *avoidance) failed(name, addr string, err error) {
	boot := v.boot(name)
	v.mu.Lock()
	defer v.mu.Unlock()
	e := v.m[name]
	if e == nil || e.addr != addr || e.boot != boot {
		e = &avoidEntry{addr: addr, boot: boot}
		v.m[name] = e
		v.n.Store(int32(len(v.m)))
	}
	e.wait = min(max(2*e.wait, avoidFirst), avoidMax)
	e.until = v.clk.Now().Add(e.wait)
	e.err = err
	v.log.Warn("peer API did not answer; not calling it until the backoff passes, it restarts or moves",
		"node", name, "addr", addr, "backoff", e.wait, "err", err)
}

// succeeded forgets name's backoff: it answered.
func (v *avoidance) succeeded(name string) {
	if v.n.Load() == 0 {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.m[name]; ok {
		delete(v.m, name)
		v.n.Store(int32(len(v.m)))
	}
}

// forgetUnless drops the backoff of every member for which listed is
// false (gone from the view: clusterState.forgetGone).
func (v *avoidance) forgetUnless(listed func(name string) bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for name := range v.m {
		if !listed(name) {
			delete(v.m, name)
		}
	}
	v.n.Store(int32(len(v.m)))
}

// avoiding returns why calls to name at addr are not made now, or nil.
// A member that gossip shows at another address or with another boot is
// tried again at once.
func (v *avoidance) avoiding(name, addr string) error {
	if v.n.Load() == 0 {
		return nil
	}
	v.mu.Lock()
	var e avoidEntry
	p := v.m[name]
	if p != nil {
		e = *p // failed changes the entry under the lock
	}
	v.mu.Unlock()
	if p == nil {
		return nil
	}
	if e.boot != v.boot(name) {
		v.succeeded(name) // it restarted
		return nil
	}
	if e.addr != addr {
		return nil // another address: it gets its own try
	}
	if !v.clk.Now().Before(e.until) {
		return nil // one more try; a failure doubles the backoff
	}
	return &avoidedError{name: name, addr: addr, until: e.until, err: e.err}
}

// last moves the members now avoided to the end of ranked, keeping the
// order of the others: a claim asks them only when nobody else can take it.
func (v *avoidance) last(ranked []string, addrOf func(string) string) []string {
	if v.n.Load() == 0 {
		return ranked
	}
	v.mu.Lock()
	listed := make(map[string]bool, len(v.m))
	for name := range v.m {
		listed[name] = true
	}
	v.mu.Unlock()
	var ok, avoided []string
	for _, name := range ranked {
		if listed[name] && v.avoiding(name, addrOf(name)) != nil {
			avoided = append(avoided, name)
		} else {
			ok = append(ok, name)
		}
	}
	return append(ok, avoided...)
}

// avoidedError is a call not made: the member's peer API did not answer
// recently.
type avoidedError struct {
	name, addr string
	until      time.Time
	err        error
}

func (e *avoidedError) Error() string {
	return fmt.Sprintf("not calling %s until %s: the last try failed: %v", e.name, e.until.Format(time.TimeOnly), e.err)
}

// connectError: no connection to a member's peer API within the bound.
type connectError struct {
	name, addr string
	after      time.Duration
}

func (e *connectError) Error() string {
	return fmt.Sprintf("no connection to %s at %s within %s", e.name, e.addr, e.after)
}

// dialError: the call failed before any connection carried it (refused,
// a handshake that failed).
type dialError struct {
	name string
	err  error
}

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// A peer call that never left this agent (the member was avoided, or no
// connection to it was made) matches api.ErrNotSent: nothing it asked for
// can have happened there.
func (e *avoidedError) Is(target error) bool { return target == api.ErrNotSent }
func (e *connectError) Is(target error) bool { return target == api.ErrNotSent }
func (e *dialError) Is(target error) bool    { return target == api.ErrNotSent }

// avoidingTransport carries calls to one member: it fails at once while
// the member is avoided, bounds connecting by api.PeerConnectTimeout, and
// tells the backoff how each call went. Whether a connection was made it
// learns from the transport's httptrace GotConn (net/http's transport, and
// agent/claimtest's in-memory one, report it).
type avoidingTransport struct {
	name, addr string
	next       http.RoundTripper
	v          *avoidance
	connect    time.Duration
}

func (v *avoidance) transport(name, addr string, next http.RoundTripper) *avoidingTransport {
	return &avoidingTransport{name: name, addr: addr, next: next, v: v, connect: api.PeerConnectTimeout}
}

// Connection states of one call.
const (
	dialing int32 = iota
	connected
	timedOut
)

var errConnectTimeout = errors.New("connect timeout")

func (t *avoidingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := t.v.avoiding(t.name, t.addr); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	var state atomic.Int32
	ctx, cancel := context.WithCancelCause(req.Context())
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { state.CompareAndSwap(dialing, connected) },
	})
	timer := t.v.clk.AfterFunc(t.connect, func() {
		if state.CompareAndSwap(dialing, timedOut) {
			cancel(errConnectTimeout)
		}
	})
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	timer.Stop()
	if err != nil {
		cancel(nil)
		switch {
		case state.Load() == timedOut:
			err = &connectError{name: t.name, addr: t.addr, after: t.connect}
			t.v.failed(t.name, t.addr, err)
		case state.Load() == dialing && req.Context().Err() == nil:
			// Refused, or a handshake that failed: no connection either.
			t.v.failed(t.name, t.addr, err)
			err = &dialError{name: t.name, err: err}
		}
		return nil, err
	}
	t.v.succeeded(t.name)
	// The body is read after RoundTrip returns: the context lives until
	// it is closed.
	resp.Body = &closeCancels{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// transport underneath.
func (t *avoidingTransport) CloseIdleConnections() {
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

type closeCancels struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (c *closeCancels) Close() error {
	err := c.ReadCloser.Close()
	c.cancel(nil)
	return err
}

// rankAvoidedLast is attempt.rank's last step: members whose peer API did
// not answer recently go to the end.
func (a *Agent) rankAvoidedLast(ranked []string) []string {
	if a.cluster == nil || a.cluster.avoid == nil {
		return ranked
	}
	return a.cluster.avoid.last(ranked, a.cluster.peerAddrOf)
}

// peerAddrOf is the peer API address gossip gives for name ("" if none).
func (c *clusterState) peerAddrOf(name string) string {
	for _, m := range c.g.Members() {
		if m.Name == name {
			return m.Summary.PeerAddr
		}
	}
	return ""
}

// bootOf is the boot gossip gives for name (0 if none).
func (c *clusterState) bootOf(name string) uint64 {
	for _, m := range c.g.Members() {
		if m.Name == name {
			return m.Summary.Boot
		}
	}
	return 0
}
