package api_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// waitingOwner is an owner whose reservations wait for their caller to
// stop waiting, and report that they saw it.
type waitingOwner struct {
	api.Owner
	entered chan struct{}
	gone    chan error
}

func (o *waitingOwner) Reserve(ctx context.Context, id string, rr api.ReserveRequest) (api.Claim, error) {
	close(o.entered)
	select {
	case <-ctx.Done():
		o.gone <- ctx.Err()
	case <-time.After(30 * time.Second):
		o.gone <- errors.New("the request's context was not cancelled within 30s of its caller giving up")
	}
	return api.Claim{}, ctx.Err()
}

// The owner writes nothing for a caller that stopped waiting
// (owner.callerGone): that rests on the peer API cancelling a request's
// context when its caller gives up. A coordinator's owner call over HTTP/2
// and TLS, as between agents, cancelled while the owner works on it.
func TestPeerRequestIsCancelledWhenItsCallerGivesUp(t *testing.T) {
	o := &waitingOwner{entered: make(chan struct{}), gone: make(chan error, 1)}
	h := api.NewPeerHandler(nil, o, slog.New(slog.DiscardHandler))
	proto := make(chan int, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proto <- r.ProtoMajor
		h.ServeHTTP(w, r.WithContext(api.WithCaller(r.Context(), "coordinator-1")))
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	client := api.NewPeerClientTransport(strings.TrimPrefix(srv.URL, "https://"), srv.Client().Transport, time.Minute)
	defer client.Close()

	ctx, cancel := context.WithCancel(context.Background())
	answered := make(chan error, 1)
	go func() {
		_, err := client.Reserve(ctx, "vm-1", api.ReserveRequest{Items: []api.Item{{Model: "NVIDIA L40S", Count: 1}}, Coordinator: "coordinator-1"})
		answered <- err
	}()
	<-o.entered
	cancel()
	if err := <-o.gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("owner's view of a request whose caller gave up: %v", err)
	}
	if err := <-answered; !errors.Is(err, context.Canceled) {
		t.Fatalf("caller's answer: %v, want its own cancellation", err)
	}
	if p := <-proto; p != 2 {
		t.Fatalf("the call went over HTTP/%d, want HTTP/2 as between agents", p)
	}
}

// A peer client's timeout bounds each call: the owner sees the call's
// context end, and the caller, whose own context has no deadline, gets a
// deadline error.
func TestPeerCallEndsAtTheClientsTimeout(t *testing.T) {
	o := &waitingOwner{entered: make(chan struct{}), gone: make(chan error, 1)}
	h := api.NewPeerHandler(nil, o, slog.New(slog.DiscardHandler))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(api.WithCaller(r.Context(), "coordinator-1")))
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	client := api.NewPeerClientTransport(strings.TrimPrefix(srv.URL, "https://"), srv.Client().Transport, 50*time.Millisecond)
	defer client.Close()

	_, err := client.Reserve(context.Background(), "vm-1", api.ReserveRequest{Items: []api.Item{{Model: "NVIDIA L40S", Count: 1}}, Coordinator: "coordinator-1"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("caller's answer: %v, want the client's timeout", err)
	}
	if err := <-o.gone; err == nil {
		t.Fatal("the owner's call went on after the client's timeout")
	}
}
