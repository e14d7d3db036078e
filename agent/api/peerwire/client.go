package peerwire

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNotSent matches the error of a call that no server read: it may be
// sent again, here or elsewhere, without any risk of doing twice what it
// asks.
var ErrNotSent = errors.New("the call was not sent")

// FallbackFor is how long a client sends a server's calls over its
// fallback (HTTP/2) after the server did not choose this wire, before
// offering it again (the server may have been upgraded meanwhile).
const FallbackFor = time.Minute

// Transport sends requests over this wire to the servers that offer it,
// one connection per server, every request of it multiplexed; and through
// its fallback to those that do not. It is an http.RoundTripper.
type Transport struct {
	cfg      *tls.Config
	fallback http.RoundTripper
	dialer   net.Dialer
	// WriteTimeout bounds writing one request to a server that stopped
	// reading; the connection is then closed.
	writeTimeout time.Duration
	// idleTimeout closes a connection with nothing in flight for this
	// long: before the server's (2 minutes) would, so that a call never
	// races the server's goodbye.
	idleTimeout time.Duration
	// maxConcurrent bounds the calls in flight on one connection, as the
	// server's Limits.MaxConcurrent does (the same default).
	maxConcurrent int
	// pingTimeout bounds the wait for the answer to a ping: a connection
	// that carries nothing back for that long is closed.
	pingTimeout time.Duration
	// forgotten, in tests, hears of each connection new calls no longer
	// take; checked, of each ping's outcome.
	forgotten func()
	checked   func(alive bool)

	mu       sync.Mutex
	conns    map[string]*clientConn
	dials    map[string]*dial
	fallBack map[string]time.Time // host -> until when
}

// NewTransport returns a transport whose connections use cfg (which must
// verify the server's identity), connect within connectTimeout, and
// whose calls to servers without this wire go through fallback.
func NewTransport(cfg *tls.Config, fallback http.RoundTripper, connectTimeout time.Duration) *Transport {
	c := &tls.Config{}
	if cfg != nil {
		c = cfg.Clone()
	}
	c.NextProtos = []string{Proto, "h2", "http/1.1"}
	if connectTimeout <= 0 {
		connectTimeout = 30 * time.Second
	}
	return &Transport{
		cfg: c, fallback: fallback,
		dialer:        net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second},
		writeTimeout:  10 * time.Second,
		idleTimeout:   90 * time.Second,
		pingTimeout:   2 * time.Second,
		maxConcurrent: Limits{}.withDefaults().MaxConcurrent,
		conns:         map[string]*clientConn{},
		dials:         map[string]*dial{},
		fallBack:      map[string]time.Time{},
	}
}

// dial is a connection being made, which every caller to that host
// waits for.
type dial struct {
	done chan struct{}
	cc   *clientConn
	err  error
}

// errOtherProto is a server that chose another protocol.
var errOtherProto = errors.New("the server did not choose " + Proto)

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	host := req.URL.Host
	if req.URL.Scheme != "https" || t.fallingBack(host) {
		return t.fallback.RoundTrip(req)
	}
	body, err := readBody(req)
	if err != nil {
		return nil, err
	}
	ctx := req.Context()
	frame, err := requestFrame(req, body)
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		cc, reused, err := t.conn(ctx, host)
		if errors.Is(err, errOtherProto) {
			return t.fallback.RoundTrip(withBody(req, body))
		}
		if err != nil {
			return nil, err
		}
		if trace := httptrace.ContextClientTrace(ctx); trace != nil && trace.GotConn != nil {
			trace.GotConn(httptrace.GotConnInfo{Conn: cc.conn, Reused: reused})
		}
		resp, err := cc.roundTrip(ctx, req, frame)
		if err != nil && attempt == 0 && errors.Is(err, ErrNotSent) && ctx.Err() == nil {
			// The server closed this connection before reading the
			// request (it went idle or shut down): a new one may take it.
			continue
		}
		return resp, err
	}
}

// CloseIdleConnections closes the connections with nothing in flight,
// and those in flight once they are done; the fallback's idle ones too.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	conns := make([]*clientConn, 0, len(t.conns))
	for h, cc := range t.conns {
		conns = append(conns, cc)
		delete(t.conns, h)
	}
	t.mu.Unlock()
	for _, cc := range conns {
		cc.closeWhenIdle()
	}
	if c, ok := t.fallback.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (t *Transport) fallingBack(host string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	until, ok := t.fallBack[host]
	if ok && !time.Now().Before(until) {
		delete(t.fallBack, host)
		return false
	}
	return ok
}

// conn returns the connection to host, made if there is none; reused
// says whether it carried calls before.
func (t *Transport) conn(ctx context.Context, host string) (*clientConn, bool, error) {
	t.mu.Lock()
	if cc := t.conns[host]; cc != nil && cc.usable() {
		t.mu.Unlock()
		return cc, true, nil
	}
	d := t.dials[host]
	if d == nil {
		d = &dial{done: make(chan struct{})}
		t.dials[host] = d
		go t.dial(host, d)
	}
	t.mu.Unlock()
	select {
	case <-d.done:
		return d.cc, false, d.err
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
}

// dial connects to host, on behalf of every caller waiting: none of
// their contexts may cut it short for the others; it is bounded by the
// dialer's timeout.
func (t *Transport) dial(host string, d *dial) {
	ctx, cancel := context.WithTimeout(context.Background(), t.dialer.Timeout)
	defer cancel()
	td := tls.Dialer{NetDialer: &t.dialer, Config: t.cfg}
	c, err := td.DialContext(ctx, "tcp", host)
	var cc *clientConn
	if err == nil {
		tc := c.(*tls.Conn)
		if tc.ConnectionState().NegotiatedProtocol != Proto {
			_ = tc.Close()
			err = errOtherProto
		} else {
			cc = newClientConn(t, host, tc)
		}
	}
	t.mu.Lock()
	delete(t.dials, host)
	switch {
	case cc != nil:
		t.conns[host] = cc
	case errors.Is(err, errOtherProto):
		t.fallBack[host] = time.Now().Add(FallbackFor)
	}
	t.mu.Unlock()
	d.cc, d.err = cc, err
	close(d.done)
	if cc != nil {
		go cc.readLoop()
	}
}

// forgetLocked is forget, called under cc.mu (t.mu is taken after it).
func (t *Transport) forgetLocked(cc *clientConn) { go t.forget(cc) }

// forget drops cc from the connections new calls take.
func (t *Transport) forget(cc *clientConn) {
	t.mu.Lock()
	forgot := t.conns[cc.host] == cc
	if forgot {
		delete(t.conns, cc.host)
	}
	t.mu.Unlock()
	if forgot && t.forgotten != nil {
		t.forgotten()
	}
}

func readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	defer req.Body.Close()
	b, err := io.ReadAll(io.LimitReader(req.Body, MaxResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the request body: %w", err)
	}
	if len(b) > MaxResponseBytes {
		return nil, fmt.Errorf("peer wire: request body over %d bytes", MaxResponseBytes)
	}
	return b, nil
}

func withBody(req *http.Request, body []byte) *http.Request {
	r := req.Clone(req.Context())
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if len(body) == 0 {
		r.Body = http.NoBody
	}
	return r
}

// requestFrame encodes req with a stream of 0, which roundTrip fills in.
func requestFrame(req *http.Request, body []byte) ([]byte, error) {
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	target := req.URL.RequestURI()
	if len(method) > 255 || len(target) > MaxHeaderBytes {
		return nil, fmt.Errorf("peer wire: method or target over the limits")
	}
	b := make([]byte, 0, frameHeader+1+len(method)+2+len(target)+2+64+len(body))
	b = appendFrameHeader(b, kindRequest, 0)
	b = append(b, byte(len(method)))
	b = append(b, method...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(target)))
	b = append(b, target...)
	b, err := appendHeaders(b, req.Header)
	if err != nil {
		return nil, err
	}
	if len(b)-frameHeader > MaxHeaderBytes {
		return nil, fmt.Errorf("peer wire: method, target and headers over %d bytes", MaxHeaderBytes)
	}
	b = append(b, body...)
	return finishFrame(b), nil
}

// clientConn is one connection to a server, every call to it
// multiplexed by stream.
type clientConn struct {
	t     *Transport
	host  string
	conn  *tls.Conn
	state tls.ConnectionState

	// slots bounds the calls in flight to the server's MaxConcurrent, so
	// that the server never stops reading (and so hears pings and
	// cancels). A call waits for a slot before anything is sent; an
	// abandoned call keeps its slot until the server answers it.
	slots chan struct{}
	wlock chan struct{} // held while writing; a caller may give up waiting
	w     *bufio.Writer
	next  uint32 // the last stream sent (under wlock)

	mu sync.Mutex
	// pending is every stream sent and not answered; a nil channel is a
	// call its caller gave up on.
	pending  map[uint32]chan result
	err      error // the connection broke
	goneAway bool  // the server reads no more
	idleStop bool  // close once nothing is in flight
	retired  bool  // its streams ran out: new calls take a new connection
	idle     *time.Timer

	reads    atomic.Uint64 // frames read so far
	pinging  atomic.Bool   // a ping is out
	pongs    chan struct{}
	pingSent uint32 // the last ping's stream (under wlock)
}

// retireAfter is the stream after which a connection takes no new calls:
// streams are 32-bit and must increase.
const retireAfter = 1 << 31

type result struct {
	payload []byte
	err     error
}

func newClientConn(t *Transport, host string, c *tls.Conn) *clientConn {
	cc := &clientConn{t: t, host: host, conn: c, state: c.ConnectionState(),
		slots: make(chan struct{}, t.maxConcurrent), wlock: make(chan struct{}, 1),
		w: bufio.NewWriterSize(c, connBuffer), pending: map[uint32]chan result{}, pongs: make(chan struct{}, 1)}
	cc.idle = time.AfterFunc(t.idleTimeout, cc.idleTimedOut)
	return cc
}

// idleTimedOut closes the connection if nothing went in flight since
// the timer was set.
func (cc *clientConn) idleTimedOut() {
	cc.mu.Lock()
	idle := len(cc.pending) == 0
	if idle {
		cc.idleStop = true
	}
	cc.mu.Unlock()
	if idle {
		cc.t.forget(cc)
		cc.closeIfDone()
	}
}

// remove forgets stream, answered or never to be, and frees its slot; the
// last one arms the idle timer. Under cc.mu.
func (cc *clientConn) remove(stream uint32) {
	if _, ok := cc.pending[stream]; !ok {
		return
	}
	delete(cc.pending, stream)
	<-cc.slots
	if len(cc.pending) == 0 && cc.err == nil && !cc.goneAway && !cc.idleStop {
		cc.idle.Reset(cc.t.idleTimeout)
	}
}

func (cc *clientConn) usable() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.err == nil && !cc.goneAway && !cc.idleStop && !cc.retired
}

// notSent is a call the server never read.
type notSent struct {
	host string
	why  string
}

func (e *notSent) Error() string {
	return fmt.Sprintf("peer wire: %s did not read the call (%s)", e.host, e.why)
}
func (e *notSent) Is(target error) bool { return target == ErrNotSent }

func (cc *clientConn) roundTrip(ctx context.Context, req *http.Request, frame []byte) (*http.Response, error) {
	select {
	case cc.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case cc.wlock <- struct{}{}:
	case <-ctx.Done():
		<-cc.slots
		return nil, ctx.Err()
	}
	ch := make(chan result, 1)
	cc.mu.Lock()
	if cc.err != nil || cc.goneAway || cc.idleStop || cc.retired {
		cc.mu.Unlock()
		<-cc.wlock
		<-cc.slots
		return nil, &notSent{host: cc.host, why: "the connection closed before it was sent"}
	}
	cc.next++
	stream := cc.next
	if stream >= retireAfter {
		cc.retired = true
		cc.t.forgetLocked(cc)
	}
	cc.pending[stream] = ch
	cc.idle.Stop()
	cc.mu.Unlock()
	binary.BigEndian.PutUint32(frame[5:], stream)
	readsBefore := cc.reads.Load()
	err := cc.writeHeld(frame, cc.t.writeTimeout)
	<-cc.wlock
	if err != nil {
		// A frame not written whole is never read.
		cc.fail(err)
		return nil, &notSent{host: cc.host, why: err.Error()}
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		return cc.response(req, r.payload)
	case <-ctx.Done():
		cc.mu.Lock()
		waiting := cc.pending[stream] != nil
		if waiting {
			// Its slot is kept until the server answers.
			cc.pending[stream] = nil
		}
		cc.mu.Unlock()
		if waiting {
			go cc.cancel(stream)
		}
		if cc.reads.Load() == readsBefore {
			// Nothing came back since this call went out: is the far end
			// still there?
			go cc.ping()
		}
		return nil, ctx.Err()
	}
}

// cancel tells the server the caller gave up on stream.
func (cc *clientConn) cancel(stream uint32) {
	timer := time.NewTimer(cc.t.writeTimeout)
	defer timer.Stop()
	select {
	case cc.wlock <- struct{}{}:
	case <-timer.C:
		return // a write is stuck: its deadline ends the connection
	}
	defer func() { <-cc.wlock }()
	cc.mu.Lock()
	_, inFlight := cc.pending[stream]
	cc.mu.Unlock()
	if !inFlight {
		return // answered meanwhile
	}
	_ = cc.writeHeld(emptyFrame(kindCancel, stream), cc.t.writeTimeout)
}

// writeHeld writes frame b, wlock held, within timeout.
func (cc *clientConn) writeHeld(b []byte, timeout time.Duration) error {
	_ = cc.conn.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := cc.w.Write(b); err != nil {
		return err
	}
	return cc.w.Flush()
}

// ping checks that the connection still carries frames back, and
// closes it when nothing at all arrives within the transport's
// pingTimeout: the far end went away without closing (a server
// powered off, a cable pulled), and every call on it would wait out its
// whole timeout. Calls in flight then fail; new ones connect anew. A
// ping that cannot be written for as long (a write in progress, stuck)
// proves nothing: the write's own deadline ends a connection that takes
// nothing.
func (cc *clientConn) ping() {
	if !cc.pinging.CompareAndSwap(false, true) {
		return
	}
	defer cc.pinging.Store(false)
	select {
	case <-cc.pongs: // a stale one
	default:
	}
	since := cc.reads.Load()
	timer := time.NewTimer(cc.t.pingTimeout)
	defer timer.Stop()
	select {
	case cc.wlock <- struct{}{}:
	case <-timer.C:
		return
	}
	cc.pingSent++
	err := cc.writeHeld(emptyFrame(kindPing, cc.pingSent), cc.t.pingTimeout)
	<-cc.wlock
	if err != nil {
		cc.fail(err)
		cc.report(false)
		return
	}
	select {
	case <-cc.pongs:
		cc.report(true)
	case <-timer.C:
		cc.pingFailed(since)
	}
}

// pingFailed closes the connection unless a frame arrived since the
// ping began (since: the frames read then).
func (cc *clientConn) pingFailed(since uint64) {
	if cc.reads.Load() != since {
		cc.report(true)
		return
	}
	cc.fail(fmt.Errorf("no answer to a ping within %s", cc.t.pingTimeout))
	cc.report(false)
}

func (cc *clientConn) report(alive bool) {
	if cc.t.checked != nil {
		cc.t.checked(alive)
	}
}

// response is the answer to req in payload.
func (cc *clientConn) response(req *http.Request, payload []byte) (*http.Response, error) {
	resp, err := parseResponse(req, payload)
	if err == nil {
		resp.TLS = &cc.state
	}
	return resp, err
}

func parseResponse(req *http.Request, payload []byte) (*http.Response, error) {
	d := decoder{b: payload}
	status := d.u16("status")
	h := d.headers()
	if d.err != nil {
		return nil, d.err
	}
	if status < 100 || status > 999 {
		return nil, errProtocol(fmt.Sprintf("status %d", status))
	}
	return &http.Response{
		Status:        strconv.Itoa(status) + " " + http.StatusText(status),
		StatusCode:    status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          io.NopCloser(bytes.NewReader(d.b)),
		ContentLength: int64(len(d.b)),
		Request:       req,
	}, nil
}

// readLoop hands each answer to its caller until the connection ends.
func (cc *clientConn) readLoop() {
	r := bufio.NewReaderSize(cc.conn, connBuffer)
	for {
		f, err := readFrame(r, MaxResponseBytes+MaxHeaderBytes+4)
		if err != nil {
			cc.fail(err)
			return
		}
		cc.reads.Add(1)
		switch f.kind {
		case kindPong:
			select {
			case cc.pongs <- struct{}{}:
			default:
			}
		case kindResponse, kindReset:
			res := result{payload: f.body}
			if f.kind == kindReset {
				res = result{err: fmt.Errorf("peer wire: %s reset the call: its handler gave no answer", cc.host)}
			}
			cc.mu.Lock()
			if ch := cc.pending[f.stream]; ch != nil {
				ch <- res
			}
			cc.remove(f.stream)
			cc.mu.Unlock()
			cc.closeIfDone()
		case kindGoAway:
			cc.goAway(f.stream)
		default:
			cc.fail(errProtocol(fmt.Sprintf("a frame of kind %d from the server", f.kind)))
			return
		}
	}
}

// goAway: the server read every stream up to last and no more. Those
// after it are answered as not sent, to be sent again elsewhere.
func (cc *clientConn) goAway(last uint32) {
	cc.t.forget(cc)
	cc.mu.Lock()
	cc.goneAway = true
	cc.idle.Stop()
	for s, ch := range cc.pending {
		if s > last {
			if ch != nil {
				ch <- result{err: &notSent{host: cc.host, why: "the server closed the connection before reading it"}}
			}
			cc.remove(s)
		}
	}
	cc.mu.Unlock()
	cc.closeIfDone()
}

// closeIfDone closes a connection that takes no more calls once its last
// call is answered.
func (cc *clientConn) closeIfDone() {
	cc.mu.Lock()
	done := (cc.goneAway || cc.idleStop || cc.retired) && len(cc.pending) == 0
	if done {
		cc.idle.Stop()
	}
	cc.mu.Unlock()
	if done {
		_ = cc.conn.Close()
	}
}

func (cc *clientConn) closeWhenIdle() {
	cc.mu.Lock()
	cc.idleStop = true
	cc.mu.Unlock()
	cc.closeIfDone()
}

// fail ends the connection: every call in flight gets err, the server
// may have read them.
func (cc *clientConn) fail(err error) {
	cc.t.forget(cc)
	cc.mu.Lock()
	if cc.err == nil {
		cc.err = err
	}
	gone, idle := cc.goneAway, cc.idleStop
	pending := cc.pending
	cc.pending = map[uint32]chan result{}
	for range pending {
		<-cc.slots
	}
	cc.mu.Unlock()
	cc.idle.Stop()
	_ = cc.conn.Close()
	if len(pending) == 0 {
		return
	}
	if (gone || idle) && errors.Is(err, net.ErrClosed) {
		err = io.ErrUnexpectedEOF
	}
	lost := fmt.Errorf("peer wire: connection to %s lost before the answer: %w", cc.host, noEOF(err))
	for _, ch := range pending {
		if ch != nil {
			ch <- result{err: lost}
		}
	}
}
