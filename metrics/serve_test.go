package metrics

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// startServer serves a fixture on 127.0.0.1 with a readiness the test
// flips, and returns its base URL and the result of Serve.
func startServer(t *testing.T, ctx context.Context, ready *atomic.Pointer[error]) (string, <-chan error) {
	t.Helper()
	m := New(SourceFunc(fixture))
	srv, err := Listen("127.0.0.1:0", m, func() error {
		if err := ready.Load(); err != nil {
			return *err
		}
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	return "http://" + srv.Addr().String(), done
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func TestServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ready atomic.Pointer[error]
	notYet := errors.New("ledger not open")
	ready.Store(&notYet)
	base, done := startServer(t, ctx, &ready)

	code, body := get(t, base+"/metrics")
	if code != http.StatusOK || !strings.Contains(body, "gpuherd_build_info{") || !strings.Contains(body, "go_goroutines ") {
		t.Errorf("/metrics: %d, body without gpuherd_build_info or go_goroutines:\n%.500s", code, body)
	}
	if code, body := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "ledger not open") {
		t.Errorf("/readyz before ready: %d %q, want 503 with the reason", code, body)
	}
	ready.Store(nil)
	if code, body := get(t, base+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz when ready: %d %q", code, body)
	}

	resp, err := http.Post(base+"/metrics", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics: %d, want 405", resp.StatusCode)
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve after cancel: %v, want nil", err)
	}
	if _, err := net.Dial("tcp", strings.TrimPrefix(base, "http://")); err == nil {
		t.Error("still accepting connections after shutdown")
	}
}

func TestServeNilReady(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := Listen("127.0.0.1:0", New(SourceFunc(fixture)), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	if code, body := get(t, "http://"+srv.Addr().String()+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz with nil ready: %d %q", code, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Error(err)
	}
}

func TestListenErrors(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	m := New(SourceFunc(fixture), WithoutRuntimeMetrics())
	for _, addr := range []string{"9100", "127.0.0.1", taken.Addr().String()} {
		srv, err := Listen(addr, m, nil, nil)
		if err == nil {
			srv.Close()
			t.Errorf("Listen(%q) succeeded", addr)
			continue
		}
		if !strings.Contains(err.Error(), addr) {
			t.Errorf("Listen(%q): %v does not name the address", addr, err)
		}
	}
}

func TestServeCancelledBeforeStart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	srv, err := Listen("127.0.0.1:0", New(SourceFunc(fixture), WithoutRuntimeMetrics()), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(ctx); err != nil {
		t.Errorf("Serve with a cancelled context: %v, want nil", err)
	}
}
