// Package claimtest carries the agents' peer API in memory, for tests: an
// agent serves its peer handler on a Network and reaches the others through
// it, without sockets or TLS, with hooks to drop, delay, partition (both
// ways or one way), pause and kill a member, or make its address answer
// nothing (Vanish). It implements the agent's
// PeerNetwork; pass it with agent.WithPeerNetwork.
package claimtest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"slices"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// ErrRefused is what a call to a killed member, or to an address nobody
// serves, fails with at once (as a refused TCP connection).
var ErrRefused = errors.New("claimtest: connection refused")

// Network connects the members' peer APIs. The zero Network is ready to
// use; it is safe for concurrent use.
type Network struct {
	mu      sync.Mutex
	byAddr  map[string]member
	addrOf  map[string]string        // node → address
	blocked map[[2]string]bool       // from node → to node: requests vanish
	paused  map[string]chan struct{} // node → closed on Resume
	silent  map[string]bool          // node → its address answers nothing: no connection is ever made
	loss    float64                  // share of requests lost on the way
	lossRep float64                  // share of answers lost on the way back
	delay   time.Duration            // added to every request
	rnd     *rand.Rand
	calls   map[[2]string]int      // from → to: requests sent
	paths   map[[2]string][]string // from → to: "METHOD path" of each request sent
}

type member struct {
	node string
	h    http.Handler
}

// Serve makes h reachable as node's peer API and returns its address; stop
// removes it (the member's listener closed).
func (n *Network) Serve(node string, h http.Handler) (addr string, stop func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.byAddr == nil {
		n.byAddr, n.addrOf = map[string]member{}, map[string]string{}
	}
	addr = fmt.Sprintf("%s.claimtest:%d", node, len(n.byAddr)+1)
	n.byAddr[addr] = member{node: node, h: h}
	n.addrOf[node] = addr
	return addr, func() { n.kill(addr) }
}

// Transport is how node calls the others.
func (n *Network) Transport(from string) http.RoundTripper {
	return roundTripper{n: n, from: from}
}

// Block makes every request from one node to another vanish (the caller
// waits for its deadline); the other way is untouched.
func (n *Network) Block(from, to string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.blocked == nil {
		n.blocked = map[[2]string]bool{}
	}
	n.blocked[[2]string{from, to}] = true
}

// Partition blocks both ways between every node of side and of other.
func (n *Network) Partition(side, other []string) {
	for _, a := range side {
		for _, b := range other {
			n.Block(a, b)
			n.Block(b, a)
		}
	}
}

// Pause holds every request to node, and every request node sends, until
// Resume (as a stopped process); a caller whose deadline passes first gets
// its context's error.
func (n *Network) Pause(node string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.paused == nil {
		n.paused = map[string]chan struct{}{}
	}
	if _, ok := n.paused[node]; !ok {
		n.paused[node] = make(chan struct{})
	}
}

// Resume lets node's held requests through.
func (n *Network) Resume(node string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ch, ok := n.paused[node]; ok {
		close(ch)
		delete(n.paused, node)
	}
}

// Vanish makes node's peer address answer nothing, as an address whose
// packets are dropped before any connection is made: a call to it waits,
// never connected, until the caller gives up; gossip, carried elsewhere,
// is untouched (a member that advertises an address nobody answers at).
// Block and Pause act on a connection already made instead: the caller's
// transport reports the connection (httptrace GotConn) and the request
// then waits. Heal does not lift it; Reappear does.
func (n *Network) Vanish(node string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.silent == nil {
		n.silent = map[string]bool{}
	}
	n.silent[node] = true
}

// Reappear makes node's address answer again.
func (n *Network) Reappear(node string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.silent, node)
}

// Kill removes node from the network: calls to it are refused at once.
// Serving it again (an agent restarted) brings it back.
func (n *Network) Kill(node string) {
	n.mu.Lock()
	addr := n.addrOf[node]
	n.mu.Unlock()
	n.kill(addr)
}

func (n *Network) kill(addr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.byAddr, addr)
}

// SetLoss loses each request with probability request on the way (the
// handler never runs) and each answer with probability answer on the way
// back (the handler ran: the owner acted, the caller never learns it);
// the caller waits for its deadline either way. Draws come from a
// generator seeded with seed, so that a schedule can be replayed.
func (n *Network) SetLoss(request, answer float64, seed uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.loss, n.lossRep, n.rnd = request, answer, rand.New(rand.NewPCG(seed, seed))
}

// SetDelay delays every request by d.
func (n *Network) SetDelay(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.delay = d
}

// Heal lifts every block, pause, loss and delay (not kills).
func (n *Network) Heal() {
	n.mu.Lock()
	paused := n.paused
	n.blocked, n.paused, n.loss, n.lossRep, n.delay = nil, nil, 0, 0, 0
	n.mu.Unlock()
	for _, ch := range paused {
		close(ch)
	}
}

// Calls counts the requests from sent to node to, whatever became of them.
func (n *Network) Calls(from, to string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.calls[[2]string{from, to}]
}

// Requests lists, in order, the method and path ("PUT /v1/peer/...") of
// every request from sent to node to, whatever became of it.
func (n *Network) Requests(from, to string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.paths[[2]string{from, to}])
}

type roundTripper struct {
	n    *Network
	from string
}

// fate is what the network does with one request, decided when it is sent.
type fate struct {
	to           member
	refused      bool
	silent       bool
	vanish       bool
	loseAnswer   bool
	delay        time.Duration
	pausedFrom   chan struct{}
	pausedTarget chan struct{}
}

func (n *Network) fate(from string, req *http.Request) fate {
	n.mu.Lock()
	defer n.mu.Unlock()
	m, ok := n.byAddr[req.URL.Host]
	if !ok {
		return fate{refused: true}
	}
	if n.calls == nil {
		n.calls, n.paths = map[[2]string]int{}, map[[2]string][]string{}
	}
	n.calls[[2]string{from, m.node}]++
	n.paths[[2]string{from, m.node}] = append(n.paths[[2]string{from, m.node}], req.Method+" "+req.URL.Path)
	f := fate{to: m, silent: n.silent[m.node], delay: n.delay, pausedFrom: n.paused[from], pausedTarget: n.paused[m.node]}
	f.vanish = n.blocked[[2]string{from, m.node}]
	if n.rnd != nil {
		f.vanish = f.vanish || n.rnd.Float64() < n.loss
		f.loseAnswer = n.rnd.Float64() < n.lossRep
	}
	return f
}

// RoundTrip runs the target's handler in memory, after the faults.
func (rt roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		body = b
	}
	f := rt.n.fate(rt.from, req)
	if f.refused {
		return nil, fmt.Errorf("dial %s: %w", req.URL.Host, ErrRefused)
	}
	if f.silent {
		<-ctx.Done()
		return nil, fmt.Errorf("dial %s: %w", req.URL.Host, ctx.Err())
	}
	// Connected, as net/http's transport reports it once its dial and TLS
	// handshake are done.
	if tr := httptrace.ContextClientTrace(ctx); tr != nil && tr.GotConn != nil {
		tr.GotConn(httptrace.GotConnInfo{})
	}
	for _, ch := range []chan struct{}{f.pausedFrom, f.pausedTarget} {
		if ch != nil {
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	if f.vanish {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if f.delay > 0 {
		select {
		case <-time.After(f.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	// The member that called, as a mutual-TLS listener reads it from the
	// client certificate.
	sreq := req.Clone(api.WithCaller(ctx, rt.from))
	sreq.Body = io.NopCloser(bytes.NewReader(body))
	sreq.ContentLength = int64(len(body))
	sreq.RequestURI = req.URL.RequestURI()
	sreq.RemoteAddr = rt.from + ".claimtest:0"
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	aborted := false
	go func() {
		defer close(done)
		defer func() {
			// A handler that aborts (http.ErrAbortHandler) drops the
			// connection: the caller gets no answer.
			if r := recover(); r != nil {
				if r != http.ErrAbortHandler {
					panic(r)
				}
				aborted = true
			}
		}()
		f.to.h.ServeHTTP(rec, sreq)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if aborted {
		return nil, fmt.Errorf("%s: connection closed before an answer: %w", req.URL.Host, io.ErrUnexpectedEOF)
	}
	if f.loseAnswer {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	resp := rec.Result()
	resp.Request = req
	return resp, nil
}
