package agent

import (
	"context"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/names"
)

// holdWatch is a name authority whose name releases run a hook first, and
// which reports every hold it answered.
type holdWatch struct {
	*releaseHook
	held chan names.Record
}

func (h *holdWatch) Hold(ctx context.Context, key names.Key, caller, owner, request string, recall bool) (names.Record, error) {
	rec, err := h.releaseHook.Hold(ctx, key, caller, owner, request, recall)
	if err == nil {
		select {
		case h.held <- rec:
		default:
		}
	}
	return rec, err
}

// A claim of an ID placed at once on the owner that is releasing the ID
// must not be committed under the name that release lets go. The owner's
// release freed the ledger, then let the name go; a hold of the ID made
// in between was answered "same" with the old token (the name was still
// held there, for the same request), and the new claim was committed
// under a name that vanished a moment later (the simulation found it,
// seed 533). The release now keeps the ID's holds out until its name is
// gone, and the new claim holds the ID under a token of its own.
func TestReleaseLetsItsNameGoBeforeTheIDIsHeldAgain(t *testing.T) {
	dir := t.TempDir()
	w := &holdWatch{releaseHook: &releaseHook{NameAuthority: soloRegistry(t, "test-node")}, held: make(chan names.Record, 4)}
	m := machine(t, "dgx-h100", dir)
	a, err := New(context.Background(), testConfig(t, dir), quietLog(), WithSysfs(m.Kernel, m.NVML), WithNames(w))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()
	req := api.ClaimRequest{GPUs: []api.Item{{Model: "H100 80GB", Count: 1}}}
	if _, err := a.Claim(ctx, "vm-r", req); err != nil {
		t.Fatal(err)
	}
	<-w.held // the first claim's hold
	old, err := a.ledger.Get("vm-r")
	if err != nil || old.NameToken == 0 {
		t.Fatalf("first claim in the ledger: %+v, %v", old, err)
	}

	done := make(chan error, 1)
	during := func() {
		go func() {
			_, err := a.Reserve(ctx, "vm-r", api.ReserveRequest{Items: []api.Item{{Model: "NVIDIA H100 80GB", Count: 1}}, Coordinator: a.cfg.NodeName, Commit: true})
			done <- err
		}()
		// Without the fix the new claim's hold is answered here, before
		// the name is let go; with it, the hold waits for the release.
		select {
		case rec := <-w.held:
			t.Logf("a hold of vm-r was answered while its release let the name go (token %d)", rec.Token)
		case <-time.After(500 * time.Millisecond):
		}
	}
	w.hook.Store(&during)
	if _, err := a.Release(ctx, "vm-r"); err != nil {
		t.Fatal(err)
	}
	if w.hook.Load() != nil {
		t.Fatal("the release let go of no name")
	}
	if err := <-done; err != nil {
		t.Fatalf("claim of vm-r again during its release: %v", err)
	}
	c, err := a.ledger.Get("vm-r")
	if err != nil {
		t.Fatalf("vm-r after the new claim: %v", err)
	}
	rec, err := w.Lookup(ctx, names.Claim("vm-r"), names.Linearizable)
	if err != nil || rec.State != names.StateHeld || rec.Owner != a.cfg.NodeName || rec.Token != c.NameToken {
		t.Fatalf("vm-r committed under token %d (the first claim's was %d), but the registry has %+v, %v", c.NameToken, old.NameToken, rec, err)
	}
	if c.NameToken == old.NameToken {
		t.Fatalf("the new claim of vm-r took the first claim's token %d", old.NameToken)
	}
}
