package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/claimtest"
	"github.com/gpuherd/gpuherd/agent/ledger"
)

// commitSweeper is the in-memory peer network where every commit from one
// node to another finds its reservation gone, as when the owner's sweep
// took it (its lease expired under load) or the owner restarted.
type commitSweeper struct {
	*claimtest.Network
	from, to string
	swept    atomic.Int32
}

func (n *commitSweeper) Transport(from string) http.RoundTripper {
	rt := n.Network.Transport(from)
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if from == n.from && strings.HasPrefix(r.URL.Host, n.to+".") && isCommit(r) {
			n.swept.Add(1)
			body := fmt.Sprintf(`{"error":{"code":"not_found","message":"claim \"%s\": not found on %s"}}`, strings.TrimSuffix(strings.TrimPrefix(r.URL.Path[strings.Index(r.URL.Path, "/reservations/"):], "/reservations/"), "/commit"), n.to)
			return &http.Response{StatusCode: http.StatusNotFound, Header: http.Header{"Content-Type": {"application/json"}},
				Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
		}
		return rt.RoundTrip(r)
	})
}

// The claim of issue 25: every server that fits failed to take it (its
// reservation was gone at commit). The answer says what happened on which
// server, that nothing was claimed and what to do, and is retryable (503),
// not the owner's own "not found on this server".
func TestClaimRefusalSaysWhatFailedAndWhatToDo(t *testing.T) {
	tc := newTestCluster(t)
	tc.names = nil // the directory path: reserve and commit are two calls
	tc.adjust = func(c *Config) { c.DirectorySettle = 0 }
	sweeper := &commitSweeper{Network: tc.peers, from: "a", to: "b"}
	tc.opts = []Option{WithPeerNetwork(sweeper)}
	a := tc.start("a", "rtx6000pro-2")
	tc.start("b", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 4 && len(x.targets()) == 2 })

	_, err := a.Claim(context.Background(), "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}})
	if sweeper.swept.Load() == 0 {
		t.Fatalf("no commit reached b (claim: %v): the fault did not happen", err)
	}
	e := apiErr(t, err)
	t.Logf("refusal: %s", e.Message)
	if e.Code != api.CodeUnavailable {
		t.Fatalf("claim: %s %q; want unavailable (retryable)", e.Code, e.Message)
	}
	for _, want := range []string{
		"claim vm-1 was not placed",
		"on b the reservation was gone before its commit (its lease expired, or that agent restarted)",
		"nothing was claimed: retry the claim",
	} {
		if !strings.Contains(e.Message, want) {
			t.Errorf("message %q lacks %q", e.Message, want)
		}
	}
	if strings.Contains(e.Message, "this server") || strings.Contains(e.Message, "could take it") {
		t.Errorf("message %q still speaks as the owner, or in the old words", e.Message)
	}
}

// The ledger speaks of "this server"; its errors leave the owner with the
// owner's name instead.
func TestLedgerErrorsNameTheirServer(t *testing.T) {
	a := &Agent{cfg: Config{NodeName: "gpu-17"}}
	e := apiErr(t, a.apiError(fmt.Errorf("claim %q: %w on this server", "vm-1", ledger.ErrNotFound)))
	if e.Code != api.CodeNotFound || e.Message != `claim "vm-1": not found on gpu-17` {
		t.Fatalf("apiError = %s %q", e.Code, e.Message)
	}
}
