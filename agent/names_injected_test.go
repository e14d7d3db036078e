package agent

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuherd/gpuherd/agent/names"
)

// TestInjectedRegistryServesThePeerRoute: an agent given a registry server
// with WithNames answers the registry requests other agents forward to it
// (POST /v1/peer/names), as one running its own registry does; before, it
// answered that it runs none, so no other agent could reach a registry
// injected this way.
func TestInjectedRegistryServesThePeerRoute(t *testing.T) {
	reg := soloRegistry(t, "a")
	tc := newTestCluster(t)
	tc.names = nil
	tc.opts = []Option{WithNames(reg)}
	a := tc.start("a", "l40s-4")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Its leader first: Lookup waits for the election.
	if _, err := reg.Lookup(ctx, names.Claim("warm-up"), names.Linearizable); !errors.Is(err, names.ErrNotFound) {
		t.Fatalf("registry has no leader: %v", err)
	}
	body, err := json.Marshal(names.Request{Op: names.OpAcquire, Key: names.Claim("vm-1"), Caller: "b", Request: "v1:req"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := a.ServeNames(ctx, body)
	if err != nil {
		t.Fatalf("ServeNames: %v", err)
	}
	resp := out.(names.Response)
	if resp.Error != nil || resp.Result == nil || resp.Result.Code != names.CodeOK || resp.Result.Record == nil || resp.Result.Record.Caller != "b" {
		t.Fatalf("acquire relayed to the injected registry: %+v (error %+v)", resp.Result, resp.Error)
	}
	if rec, err := reg.Lookup(ctx, names.Claim("vm-1"), names.Linearizable); err != nil || rec.State != names.StatePending {
		t.Fatalf("registry after the relayed acquire: %+v, %v", rec, err)
	}
}

// soloRegistry is a name registry whose only voter is node, on raft's
// in-memory transport, closed when the test ends.
func soloRegistry(t *testing.T, node string) *names.Registry {
	t.Helper()
	_, trans := raft.NewInmemTransportWithTimeout(raft.ServerAddress(node), 500*time.Millisecond)
	reg, err := names.Open(names.Config{Node: node, Role: names.RoleVoter, Servers: []names.Server{{ID: node, Address: node}},
		Transport: trans, Timing: names.FastTiming()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	return reg
}
