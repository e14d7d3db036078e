package peerwire

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"time"
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
			w: bufio.NewWriterSize(c, 16<<10), streams: map[uint32]context.CancelFunc{},
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

func (s *serverConns) shutdown() {
	s.mu.Lock()
	s.closed = true
	for c := range s.live {
		c.goAway()
	}
	s.mu.Unlock()
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
// it stays idle, or the server shuts down; then it waits for the
// handlers in flight and closes.
func (sc *serverConn) serve() {
	defer func() {
		sc.handlers.Wait()
		_ = sc.conn.Close()
	}()
	state := sc.conn.ConnectionState()
	r := bufio.NewReaderSize(sc.conn, 16<<10)
	max := sc.lim.MaxBodyBytes + MaxHeaderBytes + 1 + 2 + 2
	for {
		// Wait for a frame without reading any of it: a timeout here
		// leaves the stream of frames whole.
		_ = sc.conn.SetReadDeadline(time.Now().Add(sc.lim.IdleTimeout))
		if _, err := r.Peek(1); err != nil {
			var ne net.Error
			switch {
			case sc.stopped():
			case errors.As(err, &ne) && ne.Timeout() && sc.inFlight() > 0:
				// Idle, but answers are still being worked on. A timeout
				// of a TLS connection's read is not sticky.
				continue
			case errors.As(err, &ne) && ne.Timeout():
				sc.goAway()
			}
			return
		}
		_ = sc.conn.SetReadDeadline(time.Now().Add(sc.lim.ReadTimeout))
		f, err := readFrame(r, max)
		if err != nil {
			var pe errProtocol
			if errors.As(err, &pe) {
				sc.logf("peer wire: closing the connection from %s: %v", sc.conn.RemoteAddr(), err)
			}
			return
		}
		switch f.kind {
		case kindRequest:
			if !sc.start(f, &state) {
				return
			}
		case kindCancel:
			sc.mu.Lock()
			cancel := sc.streams[f.stream]
			sc.mu.Unlock()
			if cancel != nil {
				cancel()
			}
		case kindPing:
			pong := finishFrame(appendFrameHeader(make([]byte, 0, frameHeader), kindPong, f.stream), 0)
			if err := sc.write(pong); err != nil {
				return
			}
		default:
			sc.logf("peer wire: closing the connection from %s: a frame of kind %d from a caller", sc.conn.RemoteAddr(), f.kind)
			return
		}
	}
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
	b := appendFrameHeader(make([]byte, 0, frameHeader), kindGoAway, last)
	_ = sc.write(finishFrame(b, 0))
}

// start parses a request frame and runs its handler; false when the
// frame breaks the wire's rules and the connection must close.
func (sc *serverConn) start(f frame, state *tls.ConnectionState) bool {
	d := decoder{b: f.body}
	method := string(d.take(d.u8("method length"), "method"))
	target := d.str16("target")
	h := d.headers()
	if d.err != nil {
		sc.logf("peer wire: closing the connection from %s: %v", sc.conn.RemoteAddr(), d.err)
		return false
	}
	body := d.b
	sc.mu.Lock()
	if f.stream <= sc.last || sc.stopping {
		stopping := sc.stopping
		sc.mu.Unlock()
		if !stopping {
			sc.logf("peer wire: closing the connection from %s: stream %d after %d", sc.conn.RemoteAddr(), f.stream, sc.last)
		}
		return false
	}
	sc.last = f.stream
	ctx, cancel := context.WithCancel(sc.base)
	sc.streams[f.stream] = cancel
	sc.mu.Unlock()

	if len(body) > sc.lim.MaxBodyBytes {
		sc.finish(f.stream, cancel, errorResponse(http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", sc.lim.MaxBodyBytes)))
		return true
	}
	req, err := newServerRequest(ctx, method, target, h, body, state, sc.conn.RemoteAddr().String())
	if err != nil {
		sc.finish(f.stream, cancel, errorResponse(http.StatusBadRequest, err.Error()))
		return true
	}
	// At the limit, the next frames wait unread until a handler returns.
	sc.sem <- struct{}{}
	sc.handlers.Add(1)
	go func() {
		defer sc.handlers.Done()
		defer func() { <-sc.sem }()
		sc.finish(f.stream, cancel, sc.run(req))
	}()
	return true
}

// run calls the handler, and turns a panic into a 500 as net/http's
// servers log and drop one.
func (sc *serverConn) run(req *http.Request) (rw *responseWriter) {
	rw = &responseWriter{header: http.Header{}}
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				buf := make([]byte, 16<<10)
				buf = buf[:runtime.Stack(buf, false)]
				sc.logf("peer wire: panic serving %s %s for %s: %v\n%s", req.Method, req.URL.Path, req.RemoteAddr, v, buf)
			}
			rw = errorResponse(http.StatusInternalServerError, "the handler failed")
		}
	}()
	sc.h.ServeHTTP(rw, req)
	return rw
}

// finish writes the answer of stream and forgets it.
func (sc *serverConn) finish(stream uint32, cancel context.CancelFunc, rw *responseWriter) {
	b := make([]byte, 0, frameHeader+2+64+rw.body.Len())
	b = appendFrameHeader(b, kindResponse, stream)
	b = binary.BigEndian.AppendUint16(b, uint16(rw.statusCode()))
	b, err := appendHeaders(b, rw.header)
	if err != nil {
		sc.logf("peer wire: answering %s: %v", sc.conn.RemoteAddr(), err)
		b = appendFrameHeader(b[:0], kindResponse, stream)
		b = binary.BigEndian.AppendUint16(b, http.StatusInternalServerError)
		b = binary.BigEndian.AppendUint16(b, 0)
	} else {
		b = append(b, rw.body.Bytes()...)
	}
	if err := sc.write(finishFrame(b, 0)); err != nil {
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
	if method == "" || !validHeaderName(method) {
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

// responseWriter keeps a handler's answer until it returns.
type responseWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (rw *responseWriter) Header() http.Header { return rw.header }

func (rw *responseWriter) WriteHeader(code int) {
	if rw.status == 0 && code >= 100 && code <= 999 {
		rw.status = code
	}
}

func (rw *responseWriter) Write(p []byte) (int, error) {
	if rw.status == 0 {
		rw.status = http.StatusOK
	}
	if rw.body.Len()+len(p) > MaxResponseBytes {
		return 0, fmt.Errorf("peer wire: answer over %d bytes", MaxResponseBytes)
	}
	return rw.body.Write(p)
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
