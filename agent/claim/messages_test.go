package claim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

func apiErr(t *testing.T, err error) *api.Error {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) {
		t.Fatalf("want an *api.Error, got %T: %v", err, err)
	}
	return ae
}

func TestOwnerFailureInWords(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&api.Error{Code: api.CodeNotFound, Message: `claim "vm-1": not found on b`}, "on b the reservation was gone before its commit"},
		{&api.Error{Code: api.CodeLeaseExpired, Message: "reservation lease expired"}, "on b the reservation was gone before its commit"},
		{&api.Error{Code: api.CodeBindFailed, Message: "0000:18:00.0: write driver_override: timeout"}, "on b a GPU could not be bound to vfio-pci (gpuherd status there shows it): 0000:18:00.0"},
		{errors.New("disk full"), "b: disk full"},
	} {
		if got := ownerFailure("b", tc.err); !strings.HasPrefix(got, tc.want) {
			t.Errorf("ownerFailure(b, %v) = %q, want it to start %q", tc.err, got, tc.want)
		}
	}
}

// An owner that does not answer a get or a release is a retryable 503
// naming it, whichever way the coordinator found it (the registry, the
// home, every server); its own answers and a caller that gave up pass
// through as they are.
func TestUnansweredOwnerIsAServiceUnavailable(t *testing.T) {
	ctx := context.Background()
	down := fmt.Errorf("%w at b:1: the gpuherd agent on that server is down or cannot be reached (connection refused)", api.ErrAgentDown)
	e := apiErr(t, unanswered(ctx, "vm-1", "b", down))
	if e.Code != api.CodeUnavailable || !strings.Contains(e.Message, "vm-1 is held on b, and b did not answer") || !strings.Contains(e.Message, "connection refused") ||
		!strings.Contains(e.Message, "gpuherd members remove b") {
		t.Fatalf("unanswered owner: %s %q; want unavailable naming b and why", e.Code, e.Message)
	}
	fault := &api.Error{Code: api.CodeInternal, Message: "disk full"}
	if e := apiErr(t, unanswered(ctx, "vm-1", "b", fault)); e.Code != api.CodeUnavailable {
		t.Fatalf("owner's server fault: %s; want unavailable", e.Code)
	}
	own := &api.Error{Code: api.CodeInUse, Message: "in use"}
	if err := unanswered(ctx, "vm-1", "b", own); err != own {
		t.Fatalf("owner's answer became %v", err)
	}
	if err := unanswered(ctx, "vm-1", "b", nil); err != nil {
		t.Fatalf("no error became %v", err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if err := unanswered(gone, "vm-1", "b", down); !errors.Is(err, context.Canceled) {
		t.Fatalf("a caller that gave up: %v; want its context's error", err)
	}
}
