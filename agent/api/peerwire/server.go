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
	"log"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Limits bound what one connection of a server may ask.
type Limits struct {
	// MaxBodyBytes bounds a request's body.
	MaxBodyBytes int
	// ReadTimeout bounds reading one frame once its length arrived.
	ReadTimeout time.Duration
	// IdleTimeout closes a connection with no request in flight for this
	// long.
	IdleTimeout time.Duration
	// WriteTimeout bounds writing one answer to a caller that stopped
	// reading.
	WriteTimeout time.Duration
	// MaxConcurrent bounds the requests one connection has in flight; the
	// next waits unread.
	MaxConcurrent int

	// drain is how long a connection that said goodbye reads and drops
	// what still arrives before it closes (tests shorten it): closing with
	// unread bytes sends a reset, which could overtake the goodbye.
	drain time.Duration
}

func (l Limits) withDefaults() Limits {
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = 1 << 20
	}
	if l.ReadTimeout <= 0 {
		l.ReadTimeout = 10 * time.Second
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = 2 * time.Minute
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = 10 * time.Second
	}
	if l.MaxConcurrent <= 0 {
		l.MaxConcurrent = 250
	}
	if l.drain <= 0 {
		l.drain = time.Second
	}
	return l
}

// Install makes srv, served with ServeTLS, speak this wire to clients
// that offer it, beside HTTP/2 and HTTP/1.1 for the others. Call it before
// serving. Shutdown tells this wire's callers to send no more (goaway),
// lets the requests in flight finish, and closes.
func Install(srv *http.Server, lim Limits) {
	lim = lim.withDefaults()
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	srv.Protocols = &p
	if srv.TLSConfig == nil {
		srv.TLSConfig = &tls.Config{}
	}
	if !containsString(srv.TLSConfig.NextProtos, Proto) {
		srv.TLSConfig.NextProtos = append([]string{Proto}, srv.TLSConfig.NextProtos...)
	}
	if srv.TLSNextProto == nil {
		srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	}
	conns := &serverConns{live: map[*serverConn]struct{}{}}
	srv.RegisterOnShutdown(conns.shutdown)
	srv.TLSNextProto[Proto] = func(s *http.Server, c *tls.Conn, h http.Handler) {
		base := context.Background()
		if b, ok := h.(interface{ BaseContext() context.Context }); ok {
			base = b.BaseContext()
		}
		sc := &serverConn{conn: c, h: h, lim: lim, errLog: s.ErrorLog, base: base,
			w: bufio.NewWriterSize(c, connBuffer), streams: map[uint32]context.CancelFunc{},
			sem: make(chan struct{}, lim.MaxConcurrent)}
		if !conns.add(sc) {
			_ = c.Close()
			return
		}
		defer conns.remove(sc)
		sc.serve()
	}
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// serverConns is every connection a server serves on this wire.
type serverConns struct {
	mu     sync.Mutex
	live   map[*serverConn]struct{}
	closed bool
}

func (s *serverConns) add(c *serverConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.live[c] = struct{}{}
	return true
}

func (s *serverConns) remove(c *serverConn) {
	s.mu.Lock()
	delete(s.live, c)
	s.mu.Unlock()
}

// shutdown says goodbye on every connection at once: one whose caller
// stopped reading must not hold up the others' goaways.
func (s *serverConns) shutdown() {
	s.mu.Lock()
	s.closed = true
	conns := make([]*serverConn, 0, len(s.live))
	for c := range s.live {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		go c.goAway()
	}
}

// serverConn serves one caller's connection.
type serverConn struct {
	conn   *tls.Conn
	h      http.Handler
	lim    Limits
	errLog *log.Logger
	base   context.Context
	sem    chan struct{}

	wmu sync.Mutex // the writer
	w   *bufio.Writer

	mu       sync.Mutex
	streams  map[uint32]context.CancelFunc // in flight
	last     uint32                        // the last stream read
	stopping bool
	handlers sync.WaitGroup
}

func (sc *serverConn) logf(format string, args ...any) {
	if sc.errLog != nil {
		sc.errLog.Printf(format, args...)
	}
}

// serve reads requests until the caller leaves, the connection breaks,
// it stays idle, the caller breaks the wire's rules, or the server shuts
// down; then it waits for the handlers in flight and closes. When the
// connection broke, the handlers' contexts are canceled: no one hears
// their answers. Otherwise (a goodbye said) the caller waits for the
// answers of what was read.
func (sc *serverConn) serve() {
	r := bufio.NewReaderSize(sc.conn, connBuffer)
	broken := sc.readRequests(r)
	if broken {
		sc.mu.Lock()
		for _, cancel := range sc.streams {
			cancel()
		}
		sc.mu.Unlock()
	}
	sc.handlers.Wait()
	if !broken {
		_ = sc.conn.SetReadDeadline(time.Now().Add(sc.lim.drain))
		_, _ = io.Copy(io.Discard, r)
	}
	_ = sc.conn.Close()
}

// readRequests is serve's loop; broken reports a connection that ended
// without a goodbye (the caller left, or it broke).
func (sc *serverConn) readRequests(r *bufio.Reader) (broken bool) {
	state := sc.conn.ConnectionState()
	max := sc.lim.MaxBodyBytes + MaxHeaderBytes + 1 + 2 + 2
	for {
		// Wait for a frame without reading any of it: a timeout here
		// leaves the stream of frames whole.
		_ = sc.conn.SetReadDeadline(time.Now().Add(sc.lim.IdleTimeout))
		if sc.stopped() {
			// goAway's deadline came before this one replaced it.
			return false
		}
		if _, err := r.Peek(1); err != nil {
			var ne net.Error
			switch {
			case sc.stopped():
				return false
			case errors.As(err, &ne) && ne.Timeout() && sc.inFlight() > 0:
				// Idle, but answers are still being worked on. A timeout
				// of a TLS connection's read is not sticky.
				continue
			case errors.As(err, &ne) && ne.Timeout():
				sc.goAway()
				return false
			}
			return true
		}
		_ = sc.conn.SetReadDeadline(time.Now().Add(sc.lim.ReadTimeout))
		f, err := readFrame(r, max)
		var big *errOversized
		switch {
		case errors.As(err, &big) && big.kind == kindRequest:
			// Read past, answered: the connection stays whole.
			if !sc.refuse(big.stream, http.StatusRequestEntityTooLarge,
				fmt.Sprintf("request of %d bytes: its body is over the limit of %d", big.size, sc.lim.MaxBodyBytes)) {
				return false
			}
			continue
		case err != nil:
			var pe errProtocol
			if errors.As(err, &pe) || big != nil {
				sc.protocolError(err)
				return false
			}
			return !sc.stopped()
		}
		switch f.kind {
		case kindRequest:
			if !sc.start(f, &state) {
				return false
			}
		case kindCancel:
			sc.mu.Lock()
			cancel := sc.streams[f.stream]
			sc.mu.Unlock()
			if cancel != nil {
				cancel()
			}
		case kindPing:
			if err := sc.write(emptyFrame(kindPong, f.stream)); err != nil {
				return true
			}
		default:
			sc.protocolError(fmt.Errorf("a frame of kind %d from a caller", f.kind))
			return false
		}
	}
}

// protocolError ends a connection whose caller broke the wire's rules:
// logged, and a goodbye naming the last stream read, so that what the
// caller sent after it comes back to it as never read.
func (sc *serverConn) protocolError(err error) {
	sc.logf("peer wire: closing the connection from %s: %v", sc.conn.RemoteAddr(), err)
	sc.goAway()
}

func (sc *serverConn) stopped() bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.stopping
}

func (sc *serverConn) inFlight() int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return len(sc.streams)
}

// goAway tells the caller that no stream after the last one read will
// be: the read loop stops at once.
func (sc *serverConn) goAway() {
	sc.mu.Lock()
	if sc.stopping {
		sc.mu.Unlock()
		return
	}
	sc.stopping = true
	last := sc.last
	sc.mu.Unlock()
	// Interrupt the read: what arrives from now on is not read.
	_ = sc.conn.SetReadDeadline(time.Now())
	_ = sc.write(emptyFrame(kindGoAway, last))
}

// admit records stream as read, in order; false (and a goodbye) when it
// does not come after the last one, or the connection said goodbye.
func (sc *serverConn) admit(stream uint32) (context.Context, context.CancelFunc, bool) {
	sc.mu.Lock()
	if sc.stopping {
		sc.mu.Unlock()
		return nil, nil, false
	}
	if stream <= sc.last {
		last := sc.last
		sc.mu.Unlock()
		sc.protocolError(fmt.Errorf("stream %d after %d", stream, last))
		return nil, nil, false
	}
	sc.last = stream
	ctx, cancel := context.WithCancel(sc.base)
	sc.streams[stream] = cancel
	sc.mu.Unlock()
	return ctx, cancel, true
}

// refuse answers stream with status and msg without running the handler.
func (sc *serverConn) refuse(stream uint32, status int, msg string) bool {
	_, cancel, ok := sc.admit(stream)
	if ok {
		sc.finish(stream, cancel, errorResponse(status, msg))
	}
	return ok
}

// start parses a request frame and runs its handler; false when the
// frame breaks the wire's rules (the connection says goodbye) or came
// after the goodbye.
func (sc *serverConn) start(f frame, state *tls.ConnectionState) bool {
	d := decoder{b: f.body}
	method := string(d.take(d.u8("method length"), "method"))
	target := d.str16("target")
	h := d.headers()
	if d.err != nil {
		sc.protocolError(d.err)
		return false
	}
	body := d.b
	if len(body) > sc.lim.MaxBodyBytes {
		return sc.refuse(f.stream, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body of %d bytes: over the limit of %d", len(body), sc.lim.MaxBodyBytes))
	}
	ctx, cancel, ok := sc.admit(f.stream)
	if !ok {
		return false
	}
	req, err := newServerRequest(ctx, method, target, h, body, state, sc.conn.RemoteAddr().String())
	if err != nil {
		sc.finish(f.stream, cancel, errorResponse(http.StatusBadRequest, err.Error()))
		return true
	}
	// A caller keeps at most MaxConcurrent calls in flight; one that
	// sends more waits here, unread, until a handler returns.
	sc.sem <- struct{}{}
	sc.handlers.Add(1)
	spawn(func() {
		defer sc.handlers.Done()
		defer func() { <-sc.sem }()
		sc.finish(f.stream, cancel, sc.run(req))
	})
	return true
}

// run calls the handler. A panic (http.ErrAbortHandler too) resets the
// call, as net/http's HTTP/2 server resets the stream: the caller gets an
// error, not an answer.
func (sc *serverConn) run(req *http.Request) (rw *responseWriter) {
	rw = newResponseWriter(req.Method)
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				buf := make([]byte, 16<<10)
				buf = buf[:runtime.Stack(buf, false)]
				sc.logf("peer wire: panic serving %s %s for %s: %v\n%s", req.Method, req.URL.Path, req.RemoteAddr, v, buf)
			}
			rw = &responseWriter{reset: true}
		}
	}()
	sc.h.ServeHTTP(rw, req)
	return rw
}

// finish writes the answer of stream and forgets it.
func (sc *serverConn) finish(stream uint32, cancel context.CancelFunc, rw *responseWriter) {
	var b []byte
	if !rw.reset {
		b = make([]byte, 0, frameHeader+2+64+rw.body.Len())
		b = appendFrameHeader(b, kindResponse, stream)
		b = binary.BigEndian.AppendUint16(b, uint16(rw.statusCode()))
		var err error
		if b, err = appendHeaders(b, rw.sent()); err != nil {
			sc.logf("peer wire: answering %s: %v", sc.conn.RemoteAddr(), err)
			rw.reset = true
		} else {
			b = append(b, rw.body.Bytes()...)
		}
	}
	if rw.reset {
		b = appendFrameHeader(b[:0], kindReset, stream)
	}
	if err := sc.write(finishFrame(b)); err != nil {
		// The caller cannot hear answers: stop reading its requests.
		_ = sc.conn.Close()
	}
	sc.mu.Lock()
	delete(sc.streams, stream)
	sc.mu.Unlock()
	cancel()
}

func (sc *serverConn) write(b []byte) error {
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	_ = sc.conn.SetWriteDeadline(time.Now().Add(sc.lim.WriteTimeout))
	if _, err := sc.w.Write(b); err != nil {
		return err
	}
	return sc.w.Flush()
}

// newServerRequest builds the request the handler sees, as net/http's
// servers build it.
func newServerRequest(ctx context.Context, method, target string, h http.Header, body []byte, state *tls.ConnectionState, remote string) (*http.Request, error) {
	if method == "" || !httpguts.ValidHeaderFieldName(method) {
		return nil, fmt.Errorf("method %.32q is not a token", method)
	}
	if !strings.HasPrefix(target, "/") {
		return nil, fmt.Errorf("target %.64q is not a path", target)
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil, fmt.Errorf("target %.64q: %v", target, err)
	}
	req := (&http.Request{
		Method:        method,
		URL:           u,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          http.NoBody,
		ContentLength: int64(len(body)),
		Host:          state.ServerName,
		RemoteAddr:    remote,
		RequestURI:    target,
		TLS:           state,
	}).WithContext(ctx)
	if len(body) > 0 {
		req.Body = readCloser{bytes.NewReader(body)}
	}
	return req, nil
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

// responseWriter keeps a handler's answer until it returns, with
// net/http's rules: the headers are those at WriteHeader (or the first
// Write), informational statuses are not the answer, a HEAD answer has
// no body, a body without a Content-Type has one sniffed.
type responseWriter struct {
	header   http.Header
	snapshot http.Header // the headers sent, once WriteHeader ran
	status   int
	head     bool
	body     bytes.Buffer
	// reset: no answer, an error for the caller (a panic, an answer
	// over MaxResponseBytes).
	reset bool
}

func newResponseWriter(method string) *responseWriter {
	return &responseWriter{header: http.Header{}, head: method == http.MethodHead}
}

func (rw *responseWriter) Header() http.Header { return rw.header }

func (rw *responseWriter) WriteHeader(code int) {
	if rw.status != 0 || code < 200 || code > 999 {
		return
	}
	rw.status = code
	rw.snapshot = rw.header.Clone()
}

func (rw *responseWriter) Write(p []byte) (int, error) {
	if rw.status == 0 {
		if rw.header.Get("Content-Type") == "" && len(p) > 0 {
			rw.header.Set("Content-Type", http.DetectContentType(p))
		}
		rw.WriteHeader(http.StatusOK)
	}
	if rw.head {
		return len(p), nil
	}
	if rw.body.Len()+len(p) > MaxResponseBytes {
		rw.reset = true
		return 0, fmt.Errorf("peer wire: answer over %d bytes", MaxResponseBytes)
	}
	return rw.body.Write(p)
}

// sent is the headers of the answer.
func (rw *responseWriter) sent() http.Header {
	if rw.snapshot != nil {
		return rw.snapshot
	}
	return rw.header
}

func (rw *responseWriter) statusCode() int {
	if rw.status == 0 {
		return http.StatusOK
	}
	return rw.status
}

// errorResponse is an answer the wire itself gives, as plain text like
// net/http's own.
func errorResponse(status int, msg string) *responseWriter {
	rw := &responseWriter{header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}}, status: status}
	rw.body.WriteString(msg)
	return rw
}
