package api_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// TestRemoteAgentDown: an agent on another server that does not answer is
// reported as that agent, by address, not with the local socket's hint
// ("set --socket"), which points at the wrong machine.
func TestRemoteAgentDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there any more
	cfg := &tls.Config{MinVersion: tls.VersionTLS13}
	ctx := context.Background()

	_, err1 := api.NewRemoteClient(addr, cfg).Status(ctx)
	_, err2 := api.NewPeerClient(addr, cfg, 2*time.Second).Lookup(ctx, "vm-1")
	for _, err := range []error{err1, err2} {
		if err == nil || !errors.Is(err, api.ErrAgentDown) {
			t.Fatalf("err = %v, want api.ErrAgentDown", err)
		}
		msg := err.Error()
		if !strings.Contains(msg, addr) || !strings.Contains(msg, "down or cannot be reached") || strings.Contains(msg, "--socket") {
			t.Errorf("err = %q; want the remote address %s said to be down, and no --socket hint", msg, addr)
		}
	}
	t.Logf("remote agent down: %v", err1)
}
