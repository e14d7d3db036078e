package claimtest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// echo answers with the caller's address, so a test sees who reached whom.
func echo(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, name+" from "+r.RemoteAddr)
	})
}

func call(t *testing.T, n *Network, from, addr string, within time.Duration) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/v1/peer/capacity", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := n.Transport(from).RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestFaultHooks(t *testing.T) {
	var n Network
	aAddr, _ := n.Serve("a", echo("a"))
	bAddr, stopB := n.Serve("b", echo("b"))
	const short = 30 * time.Millisecond

	if got, err := call(t, &n, "a", bAddr, time.Second); err != nil || got != "b from a.claimtest:0" {
		t.Fatalf("healthy call: %q, %v", got, err)
	}

	n.Block("a", "b")
	if _, err := call(t, &n, "a", bAddr, short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a call across a one-way block: %v, want the caller's deadline", err)
	}
	if _, err := call(t, &n, "b", aAddr, time.Second); err != nil {
		t.Errorf("the other direction of a one-way block: %v", err)
	}
	n.Heal()

	n.Partition([]string{"a"}, []string{"b"})
	if _, err := call(t, &n, "b", aAddr, short); err == nil {
		t.Error("a call crossed a partition")
	}
	n.Heal()

	n.Pause("b")
	resumed := make(chan error, 1)
	go func() { _, err := call(t, &n, "a", bAddr, 5*time.Second); resumed <- err }()
	select {
	case err := <-resumed:
		t.Fatalf("a call to a paused member returned: %v", err)
	case <-time.After(short):
	}
	n.Resume("b")
	if err := <-resumed; err != nil {
		t.Errorf("a call held by a pause failed after Resume: %v", err)
	}

	n.SetDelay(short)
	start := time.Now()
	if _, err := call(t, &n, "a", bAddr, time.Second); err != nil || time.Since(start) < short {
		t.Errorf("a delayed call: %v after %v", err, time.Since(start))
	}
	n.Heal()

	n.SetLoss(0, 1, 3) // every answer lost: the handler runs, the caller times out
	before := n.Calls("a", "b")
	if _, err := call(t, &n, "a", bAddr, short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a call whose answer is lost: %v", err)
	}
	if n.Calls("a", "b") != before+1 {
		t.Error("Calls did not count the call")
	}
	n.Heal()

	n.Kill("b")
	if _, err := call(t, &n, "a", bAddr, time.Second); !errors.Is(err, ErrRefused) {
		t.Errorf("a call to a killed member: %v, want ErrRefused", err)
	}
	stopB()
	if _, err := call(t, &n, "a", "nobody.claimtest:9", time.Second); !errors.Is(err, ErrRefused) {
		t.Errorf("a call to an unknown address: %v, want ErrRefused", err)
	}
}

// A handler that aborts the connection gives the caller no answer.
func TestAbortedHandlerGivesNoAnswer(t *testing.T) {
	var n Network
	addr, _ := n.Serve("b", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }))
	if _, err := call(t, &n, "a", addr, time.Second); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("aborted handler: %v, want io.ErrUnexpectedEOF", err)
	}
}

// The handler learns which member called, as from a client certificate.
func TestCallerIsTheMemberThatCalled(t *testing.T) {
	var n Network
	addr, _ := n.Serve("b", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		node, _ := api.CallerOf(r.Context())
		io.WriteString(w, node)
	}))
	for _, from := range []string{"a", "c"} {
		got, err := call(t, &n, from, addr, time.Second)
		if err != nil || got != from {
			t.Fatalf("caller seen by b: %q, %v; want %q", got, err, from)
		}
	}
}

// A vanished member's address makes no connection (the caller's trace
// never hears GotConn) until it reappears; a live one reports its
// connection before the request waits on a pause.
func TestVanishedAddressMakesNoConnection(t *testing.T) {
	var n Network
	addr, _ := n.Serve("b", echo("b"))
	traced := func(within time.Duration) (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		got := make(chan struct{}, 1)
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { got <- struct{}{} }})
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/v1/peer/capacity", nil)
		resp, err := n.Transport("a").RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		select {
		case <-got:
			return true, err
		default:
			return false, err
		}
	}
	n.Vanish("b")
	if conn, err := traced(30 * time.Millisecond); conn || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a call to a vanished address: connected %v, %v; want no connection and the caller's deadline", conn, err)
	}
	n.Heal() // lifts faults on connections, not a vanished address
	if conn, _ := traced(30 * time.Millisecond); conn {
		t.Error("Heal brought a vanished address back")
	}
	n.Reappear("b")
	if conn, err := traced(time.Second); !conn || err != nil {
		t.Errorf("after Reappear: connected %v, %v", conn, err)
	}
	n.Block("a", "b")
	if conn, err := traced(30 * time.Millisecond); !conn || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a blocked call: connected %v, %v; want a connection, then the caller's deadline", conn, err)
	}
}
