package peerwire

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/pki"
)

// testPKI is a CA with certificates for a server and a caller.
type testPKI struct{ dir string }

func newPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca")
	if err := pki.CreateCA(ca, "peer wire test CA", 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"server", "caller"} {
		if err := pki.IssueCert(ca, dir, n, []string{"127.0.0.1"}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	return testPKI{dir: dir}
}

func (p testPKI) files(node string) pki.Files {
	cert, key := pki.NodeFiles(p.dir, node)
	return pki.Files{CA: filepath.Join(p.dir, "ca", pki.CACertFile), Cert: cert, Key: key}
}

func (p testPKI) serverConfig(t *testing.T) *tls.Config {
	t.Helper()
	cfg, err := pki.ServerConfig(p.files("server"))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func (p testPKI) clientConfig(t *testing.T) *tls.Config {
	t.Helper()
	cfg, err := pki.ClientConfigFor(p.files("caller"), "server")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// testServer serves h on loopback with mutual TLS, with the wire
// installed unless plain; conns counts the connections it accepted.
type testServer struct {
	srv    *http.Server
	addr   string
	conns  atomic.Int32
	closed chan struct{} // a value per connection closed
	logs   *logBuffer
}

type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func serve(t *testing.T, p testPKI, h http.Handler, plain bool, lim Limits) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{addr: ln.Addr().String(), closed: make(chan struct{}, 1000), logs: &logBuffer{}}
	ts.srv = &http.Server{
		Handler:   h,
		TLSConfig: p.serverConfig(t),
		ErrorLog:  log.New(ts.logs, "", 0),
		ConnState: func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				ts.conns.Add(1)
			case http.StateClosed, http.StateHijacked:
				ts.closed <- struct{}{}
			}
		},
	}
	if !plain {
		Install(ts.srv, lim)
	}
	go func() { _ = ts.srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = ts.srv.Close() })
	return ts
}

func newClient(t *testing.T, p testPKI) (*http.Client, *Transport) {
	t.Helper()
	cfg := p.clientConfig(t)
	h2 := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
	tr := NewTransport(cfg, h2, time.Second)
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}, tr
}

// echo answers with what it was asked and who asked.
func echo(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	caller, err := pki.PeerName(r)
	if err != nil {
		caller = "none: " + err.Error()
	}
	w.Header().Set("X-Caller", caller)
	w.Header().Set("X-Proto", r.Proto+" "+r.TLS.NegotiatedProtocol)
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "%s %s q=%s ct=%s body=%s", r.Method, r.URL.Path, r.URL.Query().Get("q"), r.Header.Get("Content-Type"), body)
}

func call(t *testing.T, c *http.Client, ctx context.Context, method, url, body string) (*http.Response, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestCallsGoOverTheWireWithTheCallersIdentity(t *testing.T) {
	p := newPKI(t)
	ts := serve(t, p, http.HandlerFunc(echo), false, Limits{})
	c, _ := newClient(t, p)
	resp, body := call(t, c, context.Background(), http.MethodPut, "https://"+ts.addr+"/v1/peer/reservations/vm%2F1?q=x", `{"a":1}`)
	if resp.StatusCode != http.StatusCreated || resp.Status != "201 Created" {
		t.Errorf("status %q", resp.Status)
	}
	if got, want := body, `PUT /v1/peer/reservations/vm/1 q=x ct=application/json body={"a":1}`; got != want {
		t.Errorf("body %q, want %q", got, want)
	}
	if got := resp.Header.Get("X-Caller"); got != "caller" {
		t.Errorf("caller %q, want the client certificate's node", got)
	}
	if got := resp.Header.Get("X-Proto"); got != "HTTP/1.1 "+Proto {
		t.Errorf("protocol %q, want the peer wire", got)
	}
}

func TestConcurrentCallsShareOneConnection(t *testing.T) {
	p := newPKI(t)
	ts := serve(t, p, http.HandlerFunc(echo), false, Limits{})
	c, _ := newClient(t, p)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("https://%s/n/%d", ts.addr, i), strings.NewReader(fmt.Sprint(i)))
			resp, err := c.Do(req)
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if want := fmt.Sprintf("POST /n/%d q= ct= body=%d", i, i); string(b) != want {
				errs <- fmt.Errorf("call %d answered %q, want %q", i, b, want)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := ts.conns.Load(); n != 1 {
		t.Errorf("%d connections, want 1 shared by every call", n)
	}
}

func TestHandlersRunOnReusedGoroutines(t *testing.T) {
	p := newPKI(t)
	ts := serve(t, p, http.HandlerFunc(echo), false, Limits{})
	c, _ := newClient(t, p)
	call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/warm", "")
	before := workersStarted.Load()
	const calls = 100
	for i := range calls {
		call(t, c, context.Background(), http.MethodGet, fmt.Sprintf("https://%s/n/%d", ts.addr, i), "")
	}
	// One after the other, each call finds the goroutine of the call
	// before waiting, but for the rare one answered before that
	// goroutine was back.
	if n := workersStarted.Load() - before; n > calls/4 {
		t.Errorf("%d goroutines started for %d calls one after the other, want the handlers' goroutines reused", n, calls)
	}
}

func TestAServerWithoutTheWireIsCalledOverHTTP2(t *testing.T) {
	p := newPKI(t)
	ts := serve(t, p, http.HandlerFunc(echo), true, Limits{})
	c, _ := newClient(t, p)
	for range 3 {
		resp, _ := call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/x", "")
		if got := resp.Header.Get("X-Proto"); got != "HTTP/2.0 h2" {
			t.Errorf("protocol %q, want HTTP/2", got)
		}
	}
	// One connection offered the wire and was refused it; the fallback's
	// one carried the calls, without offering it again each time.
	if n := ts.conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

func TestHTTP2CallersAreStillServed(t *testing.T) {
	p := newPKI(t)
	ts := serve(t, p, http.HandlerFunc(echo), false, Limits{})
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: p.clientConfig(t), ForceAttemptHTTP2: true}}
	defer c.CloseIdleConnections()
	resp, body := call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/x?q=1", "")
	if got := resp.Header.Get("X-Proto"); got != "HTTP/2.0 h2" {
		t.Errorf("protocol %q, want HTTP/2", got)
	}
	if body != "GET /x q=1 ct= body=" || resp.Header.Get("X-Caller") != "caller" {
		t.Errorf("answer %q from %q", body, resp.Header.Get("X-Caller"))
	}
}

func TestACallerGivingUpCancelsTheHandler(t *testing.T) {
	p := newPKI(t)
	started, canceled := make(chan struct{}), make(chan error, 1)
	ts := serve(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/block" {
			echo(w, r)
			return
		}
		close(started)
		<-r.Context().Done()
		canceled <- r.Context().Err()
	}), false, Limits{})
	c, _ := newClient(t, p)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+ts.addr+"/block", nil)
		_, err := c.Do(req)
		done <- err
	}()
	<-started
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("the call returned %v, want context.Canceled", err)
	}
	select {
	case err := <-canceled:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("handler's context: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's context was never canceled")
	}
	// The connection still carries calls.
	call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/x", "")
	if n := ts.conns.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

func TestAnIdleConnectionIsClosedAndReplaced(t *testing.T) {
	p := newPKI(t)
	ts := serve(t, p, http.HandlerFunc(echo), false, Limits{IdleTimeout: 20 * time.Millisecond, drain: 10 * time.Millisecond})
	c, tr := newClient(t, p)
	forgotten := make(chan struct{}, 10)
	tr.forgotten = func() { forgotten <- struct{}{} }
	call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/x", "")
	await(t, forgotten, "the server's goodbye") // heard by the caller
	await(t, ts.closed, "the connection's end")
	call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/x", "")
	if n := ts.conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}

	// The caller closes its idle connections before the server would.
	ts = serve(t, p, http.HandlerFunc(echo), false, Limits{})
	c, tr = newClient(t, p)
	tr.idleTimeout = 20 * time.Millisecond
	tr.forgotten = func() { forgotten <- struct{}{} }
	call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/x", "")
	await(t, forgotten, "the idle connection's end")
	await(t, ts.closed, "the connection's end")
	call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/x", "")
	if n := ts.conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

func TestShutdownLetsCallsInFlightFinish(t *testing.T) {
	p := newPKI(t)
	started, release := make(chan struct{}), make(chan struct{})
	ts := serve(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		echo(w, r)
	}), false, Limits{})
	c, _ := newClient(t, p)
	got := make(chan string, 1)
	go func() {
		_, body := call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/slow", "")
		got <- body
	}()
	<-started
	shut := make(chan error, 1)
	go func() { shut <- ts.srv.Shutdown(context.Background()) }()
	close(release)
	if body := <-got; body != "GET /slow q= ct= body=" {
		t.Errorf("answer %q", body)
	}
	if err := <-shut; err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// fakeServer accepts connections on the wire and runs each through fn.
func fakeServer(t *testing.T, p testPKI, fn func(n int, c *tls.Conn)) string {
	t.Helper()
	cfg := p.serverConfig(t)
	cfg.NextProtos = []string{Proto}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fn(n, c.(*tls.Conn))
			}()
		}
	}()
	return ln.Addr().String()
}

// writeFrame sends a frame; a server that closes the connection on a
// hostile one may do so before it is all written.
func writeFrame(t *testing.T, c net.Conn, kind byte, stream uint32, payload []byte) {
	t.Helper()
	b := appendFrameHeader(nil, kind, stream)
	b = append(b, payload...)
	_, _ = c.Write(finishFrame(b))
}

func okPayload(body string) []byte {
	b := binary.BigEndian.AppendUint16(nil, 200)
	b = binary.BigEndian.AppendUint16(b, 0)
	return append(b, body...)
}

func TestACallTheServerNeverReadIsSentAgain(t *testing.T) {
	p := newPKI(t)
	addr := fakeServer(t, p, func(n int, c *tls.Conn) {
		f, err := readFrame(bufio.NewReader(c), 1<<20)
		if err != nil {
			t.Error(err)
			return
		}
		if n == 0 {
			// Going away having read nothing.
			writeFrame(t, c, kindGoAway, 0, nil)
			return
		}
		writeFrame(t, c, kindResponse, f.stream, okPayload("second"))
	})
	c, _ := newClient(t, p)
	_, body := call(t, c, context.Background(), http.MethodPost, "https://"+addr+"/x", "{}")
	if body != "second" {
		t.Errorf("answer %q", body)
	}
}

func TestAConnectionLostInFlightIsNotCalledUnsent(t *testing.T) {
	p := newPKI(t)
	addr := fakeServer(t, p, func(n int, c *tls.Conn) {
		_, _ = readFrame(bufio.NewReader(c), 1<<20)
		// Read, then gone without an answer: it may have been done.
	})
	c, _ := newClient(t, p)
	req, _ := http.NewRequest(http.MethodPost, "https://"+addr+"/x", strings.NewReader("{}"))
	_, err := c.Do(req)
	if err == nil || errors.Is(err, ErrNotSent) || !strings.Contains(err.Error(), "lost before the answer") {
		t.Errorf("err = %v, want the connection lost, not a call unsent", err)
	}
}

// rawConn is a caller speaking the wire byte by byte.
func rawConn(t *testing.T, p testPKI, addr string) *tls.Conn {
	t.Helper()
	cfg := p.clientConfig(t)
	cfg.NextProtos = []string{Proto}
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ConnectionState().NegotiatedProtocol; got != Proto {
		t.Fatalf("negotiated %q", got)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func requestPayload(method, target string, headers [][2]string, body string) []byte {
	b := []byte{byte(len(method))}
	b = append(b, method...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(target)))
	b = append(b, target...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(headers)))
	for _, h := range headers {
		b = binary.BigEndian.AppendUint16(b, uint16(len(h[0])))
		b = append(b, h[0]...)
		b = binary.BigEndian.AppendUint16(b, uint16(len(h[1])))
		b = append(b, h[1]...)
	}
	return append(b, body...)
}

// expectGoodbye reads until the server closes the connection: it must
// say goodbye first, naming last as the last stream it read, and answer
// only the streams in answered.
func expectGoodbye(t *testing.T, c *tls.Conn, what string, last uint32, answered ...uint32) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	goodbye := false
	var got []uint32
	for {
		f, err := readFrame(r, MaxResponseBytes)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("%s: the connection stayed open", what)
			}
			break
		}
		switch f.kind {
		case kindGoAway:
			goodbye = true
			if f.stream != last {
				t.Errorf("%s: goodbye after stream %d, want %d", what, f.stream, last)
			}
		case kindResponse:
			got = append(got, f.stream)
		default:
			t.Errorf("%s: a frame of kind %d", what, f.kind)
		}
	}
	if !goodbye {
		t.Errorf("%s: closed without a goodbye", what)
	}
	if fmt.Sprint(got) != fmt.Sprint(answered) {
		t.Errorf("%s: answered streams %v, want %v", what, got, answered)
	}
}

// expectClosed reads until the server closes the connection, which must
// not answer anything.
func expectClosed(t *testing.T, c *tls.Conn, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := readFrame(bufio.NewReader(c), MaxResponseBytes)
	if err == nil {
		t.Errorf("%s: a frame of kind %d, want the connection closed", what, f.kind)
		return
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("%s: the connection stayed open", what)
	}
}

func TestHostileFramesCloseTheConnectionOnly(t *testing.T) {
	p := newPKI(t)
	ts := serve(t, p, http.HandlerFunc(echo), false, Limits{MaxBodyBytes: 1024, ReadTimeout: 50 * time.Millisecond, drain: 10 * time.Millisecond})
	// Two headers over MaxHeaderBytes together, in a frame under the
	// limit of one.
	long := strings.Repeat("a", MaxHeaderBytes/2+100)
	ok := func(c *tls.Conn, stream uint32) {
		writeFrame(t, c, kindRequest, stream, requestPayload("GET", "/x", nil, ""))
	}
	cases := []struct {
		name string
		send func(c *tls.Conn)
		// the last stream the goodbye names, and the streams answered
		last     uint32
		answered []uint32
	}{
		{"a frame over what it reads past", func(c *tls.Conn) {
			_, _ = c.Write([]byte{0x7f, 0xff, 0xff, 0xff, kindRequest, 0, 0, 0, 1})
		}, 0, nil},
		{"a frame shorter than its header", func(c *tls.Conn) { _, _ = c.Write([]byte{0, 0, 0, 2, 1, 0}) }, 0, nil},
		{"an unknown kind", func(c *tls.Conn) { ok(c, 1); writeFrame(t, c, 9, 2, nil) }, 1, []uint32{1}},
		{"a response from a caller", func(c *tls.Conn) { writeFrame(t, c, kindResponse, 1, okPayload("")) }, 0, nil},
		{"a method cut short", func(c *tls.Conn) { writeFrame(t, c, kindRequest, 1, []byte{10, 'G'}) }, 0, nil},
		{"a header name that is no token", func(c *tls.Conn) {
			writeFrame(t, c, kindRequest, 1, requestPayload("GET", "/x", [][2]string{{"Bad Name", "v"}}, ""))
		}, 0, nil},
		{"a header value with a newline", func(c *tls.Conn) {
			writeFrame(t, c, kindRequest, 1, requestPayload("GET", "/x", [][2]string{{"X-A", "v\r\nX-B: w"}}, ""))
		}, 0, nil},
		{"headers over the limit", func(c *tls.Conn) {
			writeFrame(t, c, kindRequest, 1, requestPayload("GET", "/x", [][2]string{{"X-A", long}, {"X-B", long}}, ""))
		}, 0, nil},
		{"a target over the limit", func(c *tls.Conn) {
			writeFrame(t, c, kindRequest, 1, requestPayload("GET", "/"+strings.Repeat("t", MaxHeaderBytes), nil, ""))
		}, 0, nil},
		{"a stream that goes back", func(c *tls.Conn) {
			ok(c, 5)
			ok(c, 5)
			ok(c, 6)
		}, 5, []uint32{5}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := rawConn(t, p, ts.addr)
			tc.send(c)
			expectGoodbye(t, c, tc.name, tc.last, tc.answered...)
		})
	}
	t.Run("a frame stalled half-way", func(t *testing.T) {
		c := rawConn(t, p, ts.addr)
		_, _ = c.Write([]byte{0, 0, 0, 100, kindRequest})
		expectClosed(t, c, "a frame stalled half-way")
	})
	// Answered, the connection kept: a bad target, a body over the limit
	// (in a frame under it, and in one over it, read past).
	c := rawConn(t, p, ts.addr)
	r := bufio.NewReader(c)
	for i, tc := range []struct {
		payload []byte
		status  int
	}{
		{requestPayload("GET", "no-slash", nil, ""), http.StatusBadRequest},
		{requestPayload("G\x00T", "/x", nil, ""), http.StatusBadRequest},
		{requestPayload("POST", "/x", nil, strings.Repeat("b", 1025)), http.StatusRequestEntityTooLarge},
		{requestPayload("POST", "/x", nil, strings.Repeat("b", 100<<10)), http.StatusRequestEntityTooLarge},
		{requestPayload("POST", "/x", nil, "ok"), http.StatusCreated},
	} {
		writeFrame(t, c, kindRequest, uint32(i+1), tc.payload)
		f, err := readFrame(r, MaxResponseBytes)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if status := int(binary.BigEndian.Uint16(f.body)); f.kind != kindResponse || f.stream != uint32(i+1) || status != tc.status {
			t.Errorf("call %d: kind %d stream %d status %d, want %d", i, f.kind, f.stream, status, tc.status)
		}
	}
	// And the server serves well-behaved callers throughout.
	cl, _ := newClient(t, p)
	call(t, cl, context.Background(), http.MethodGet, "https://"+ts.addr+"/x", "")
	if !strings.Contains(ts.logs.String(), "closing the connection") {
		t.Errorf("no hostile frame was logged: %q", ts.logs.String())
	}
}

func TestACallOverTheLimitsIsRefusedBeforeItIsSent(t *testing.T) {
	p := newPKI(t)
	ts := serve(t, p, http.HandlerFunc(echo), false, Limits{})
	c, _ := newClient(t, p)
	for name, set := range map[string]func(h http.Header){
		"headers over the limit":     func(h http.Header) { h.Set("X-A", strings.Repeat("a", MaxHeaderBytes)) },
		"a value with a newline":     func(h http.Header) { h["X-A"] = []string{"v\nw"} },
		"a name that is not a token": func(h http.Header) { h["Bad Name"] = []string{"v"} },
	} {
		req, _ := http.NewRequest(http.MethodGet, "https://"+ts.addr+"/x", nil)
		set(req.Header)
		if _, err := c.Do(req); err == nil || !strings.Contains(err.Error(), "peer wire") {
			t.Errorf("%s: err = %v, want the wire's refusal", name, err)
		}
	}
	if n := ts.conns.Load(); n != 0 {
		t.Errorf("%d connections: a call refused here reached the server", n)
	}
}

func TestAPanickingHandlerResetsTheCall(t *testing.T) {
	p := newPKI(t)
	ts := serve(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/panic":
			panic("boom")
		case "/abort":
			panic(http.ErrAbortHandler)
		}
		echo(w, r)
	}), false, Limits{})
	c, _ := newClient(t, p)
	for _, path := range []string{"/panic", "/abort"} {
		req, _ := http.NewRequest(http.MethodGet, "https://"+ts.addr+path, nil)
		_, err := c.Do(req)
		if err == nil || errors.Is(err, ErrNotSent) || !strings.Contains(err.Error(), "reset the call") {
			t.Errorf("%s: err = %v, want the call reset, its outcome unknown", path, err)
		}
	}
	call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/x", "")
	if logs := ts.logs.String(); !strings.Contains(logs, "boom") || strings.Contains(logs, "abort") {
		t.Errorf("the panic, and it alone, should be logged: %q", logs)
	}
	if n := ts.conns.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

func TestAnswersFollowNetHTTPsRules(t *testing.T) {
	p := newPKI(t)
	ts := serve(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/sniff":
			_, _ = w.Write([]byte("<html><body>x</body></html>"))
		case "/late":
			w.Header().Set("X-Before", "1")
			w.WriteHeader(http.StatusAccepted)
			w.Header().Set("X-After", "1")
			_, _ = w.Write([]byte("body"))
		case "/early":
			w.WriteHeader(http.StatusContinue)
			w.WriteHeader(http.StatusTeapot)
		}
	}), false, Limits{})
	c, _ := newClient(t, p)
	resp, body := call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/sniff", "")
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") || body != "<html><body>x</body></html>" {
		t.Errorf("content type %q of %q, want it sniffed", ct, body)
	}
	if resp.TLS == nil || resp.TLS.NegotiatedProtocol != Proto {
		t.Errorf("the answer's TLS state: %+v", resp.TLS)
	}
	resp, body = call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/late", "")
	if resp.StatusCode != http.StatusAccepted || resp.Header.Get("X-Before") != "1" || resp.Header.Get("X-After") != "" || body != "body" {
		t.Errorf("late headers: %d %v %q", resp.StatusCode, resp.Header, body)
	}
	resp, _ = call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/early", "")
	if resp.StatusCode != http.StatusTeapot {
		t.Errorf("status %d, want the final one after an informational", resp.StatusCode)
	}
	resp, body = call(t, c, context.Background(), http.MethodHead, "https://"+ts.addr+"/late", "")
	if resp.StatusCode != http.StatusAccepted || body != "" {
		t.Errorf("HEAD: %d %q, want no body", resp.StatusCode, body)
	}
}

func TestACallerWaitsForASlotInsteadOfFillingTheServer(t *testing.T) {
	p := newPKI(t)
	started, release := make(chan struct{}, 4), make(chan struct{})
	ts := serve(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		echo(w, r)
	}), false, Limits{MaxConcurrent: 1})
	c, tr := newClient(t, p)
	tr.maxConcurrent = 1
	tr.pingTimeout = 20 * time.Millisecond
	checked := make(chan bool, 4)
	tr.checked = func(alive bool) { checked <- alive }
	first := make(chan string, 1)
	go func() {
		_, body := call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/first", "")
		first <- body
	}()
	await(t, started, "the first call's handler")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+ts.addr+"/second", nil)
	if _, err := c.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second call: %v, want its deadline while waiting for a slot", err)
	}
	close(release)
	if body := await(t, first, "the first call's answer"); body != "GET /first q= ct= body=" {
		t.Errorf("first call: %q", body)
	}
	select {
	case alive := <-checked:
		t.Errorf("a call that was never sent pinged the server (alive %v)", alive)
	default:
	}
	if len(started) != 0 {
		t.Error("the server ran the call that timed out waiting for a slot")
	}
}

func TestALostConnectionCancelsItsHandlers(t *testing.T) {
	p := newPKI(t)
	started, canceled := make(chan struct{}), make(chan struct{})
	ts := serve(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
		close(canceled)
	}), false, Limits{})
	c := rawConn(t, p, ts.addr)
	writeFrame(t, c, kindRequest, 1, requestPayload("GET", "/x", nil, ""))
	await(t, started, "the handler")
	c.Close()
	await(t, canceled, "the handler's context canceled")
}

func TestAConnectionRetiresBeforeItsStreamsRunOut(t *testing.T) {
	p := newPKI(t)
	ts := serve(t, p, http.HandlerFunc(echo), false, Limits{})
	c, tr := newClient(t, p)
	call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/x", "")
	tr.mu.Lock()
	cc := tr.conns[ts.addr]
	tr.mu.Unlock()
	cc.wlock <- struct{}{}
	cc.next = retireAfter - 1
	<-cc.wlock
	// The server checks only that streams increase: it takes the jump.
	call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/x", "")
	call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/x", "")
	if n := ts.conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2: the first one retired", n)
	}
}

func TestAnUnreachableServerFailsTheCall(t *testing.T) {
	p := newPKI(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c, _ := newClient(t, p)
	req, _ := http.NewRequest(http.MethodGet, "https://"+addr+"/x", nil)
	if _, err := c.Do(req); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("err = %v, want the connection refused", err)
	}
}

func TestAFarEndThatStoppedAnsweringIsLeft(t *testing.T) {
	p := newPKI(t)
	addr := fakeServer(t, p, func(n int, c *tls.Conn) {
		r := bufio.NewReader(c)
		for {
			f, err := readFrame(r, 1<<20)
			if err != nil {
				return
			}
			if n > 0 && f.kind == kindRequest {
				writeFrame(t, c, kindResponse, f.stream, okPayload("answered"))
			}
			// The first connection swallows everything, pings too.
		}
	})
	c, tr := newClient(t, p)
	tr.pingTimeout = 50 * time.Millisecond
	checked := make(chan bool, 10)
	tr.checked = func(alive bool) { checked <- alive }
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/x", nil)
	if _, err := c.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the call's deadline", err)
	}
	if alive := await(t, checked, "the ping's outcome"); alive {
		t.Fatal("a connection that answered nothing was kept")
	}
	if _, body := call(t, c, context.Background(), http.MethodGet, "https://"+addr+"/x", ""); body != "answered" {
		t.Errorf("answer %q", body)
	}
}

func TestASlowHandlerKeepsItsConnection(t *testing.T) {
	p := newPKI(t)
	release := make(chan struct{})
	ts := serve(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
		echo(w, r)
	}), false, Limits{})
	defer close(release)
	c, tr := newClient(t, p)
	checked := make(chan bool, 10)
	tr.checked = func(alive bool) { checked <- alive }
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+ts.addr+"/slow", nil)
	if _, err := c.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the call's deadline", err)
	}
	if alive := await(t, checked, "the ping's outcome"); !alive {
		t.Fatal("the server answered the ping, yet the connection was closed")
	}
	call(t, c, context.Background(), http.MethodGet, "https://"+ts.addr+"/x", "")
	if n := ts.conns.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

// await is the next value of ch, failing the test after 10 s: an event
// that never comes fails the test instead of hanging it.
func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s never came", what)
		panic("unreachable")
	}
}
