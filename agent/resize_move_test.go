package agent

import (
	"context"
	"errors"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/groups"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/owner"
)

var _ owner.NameMover = (*testNames)(nil)

func (n *testNames) Move(ctx context.Context, key names.Key, token uint64, from, to, caller string) (names.Record, error) {
	if err := n.unavailable(names.OpMove, key); err != nil {
		return names.Record{}, err
	}
	return n.reg.Move(ctx, key, token, from, to, caller)
}

var _ groups.Requester = (*testNames)(nil)

func (n *testNames) ConfirmMove(ctx context.Context, key names.Key, token uint64, owner, caller string) (names.Record, error) {
	if n.beforeConfirm != nil {
		n.beforeConfirm()
	}
	if err := n.unavailable(names.OpConfirm, key); err != nil {
		return names.Record{}, err
	}
	return n.reg.ConfirmMove(ctx, key, token, owner, caller)
}

func (n *testNames) SetRequest(ctx context.Context, key names.Key, token uint64, request string) (names.Record, error) {
	if err := n.unavailable(names.OpSetRequest, key); err != nil {
		return names.Record{}, err
	}
	return n.reg.SetRequest(ctx, key, token, request)
}

// nameClaim returns the name of claim id, which the claim path gave it
// when it was placed on owner.
func nameClaim(t *testing.T, n *testNames, id, owner string) names.Record {
	t.Helper()
	r, err := n.Lookup(context.Background(), names.Claim(id), names.Linearizable)
	if err != nil || r.State != names.StateHeld || r.Owner != owner {
		t.Fatalf("name of %s: %+v, %v; want held on %s", id, r, err, owner)
	}
	return r
}

// Issue 11, point 5: a claim resized onto another server commits there
// before its old GPUs go, and its name moves with it: held on the new
// server under a newer token, the old server's token stale.
func TestClaimMoveCarriesItsName(t *testing.T) {
	_, n, ag := namedAgents(t, nil, "l40s-4", "a100-pcie-4")
	a, b := ag[0], ag[1]
	ctx := context.Background()
	if c, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}}); err != nil || c.Node != "a" {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	old := nameClaim(t, n, "vm-1", "a")
	moved, err := b.Resize(ctx, "vm-1", api.ResizeRequest{GPUs: []api.Item{{Model: "A100 80GB", Count: 2}}})
	if err != nil || moved.Node != "b" || len(moved.GPUs) != 2 {
		t.Fatalf("move to b: %+v, %v", moved, err)
	}
	r, err := n.Lookup(ctx, names.Claim("vm-1"), names.Linearizable)
	if err != nil || r.Owner != "b" || r.MovedFrom != "a" || r.Token <= old.Token || r.Move != nil || r.State != names.StateHeld {
		t.Fatalf("the name after the move: %+v, %v", r, err)
	}
	if _, err := a.Lookup(ctx, "vm-1"); !api.IsCode(err, api.CodeNotFound) {
		t.Fatalf("a still holds vm-1: %v", err)
	}
	if _, err := n.Release(ctx, names.Claim("vm-1"), old.Token, ""); err == nil {
		t.Fatal("the old server's token still releases the moved name")
	}
}

// A move the registry cannot take part in does not happen: the answer is
// a retryable unavailable and the claim stays where it was.
func TestClaimMoveWithoutTheRegistryChangesNothing(t *testing.T) {
	_, n, ag := namedAgents(t, nil, "l40s-4", "a100-pcie-4")
	a := ag[0]
	ctx := context.Background()
	c, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	nameClaim(t, n, "vm-1", "a")
	n.SetDown(true)
	_, err = a.Resize(ctx, "vm-1", api.ResizeRequest{GPUs: []api.Item{{Model: "A100 80GB", Count: 1}}})
	n.SetDown(false)
	if e := apiErr(t, err); e.Code != api.CodeUnavailable {
		t.Fatalf("move while the registry is down: %+v", e)
	}
	now, err := a.Lookup(ctx, "vm-1")
	if err != nil || now.Node != "a" || !now.CommittedAt.Equal(c.CommittedAt) {
		t.Fatalf("vm-1 after the refused move: %+v, %v", now, err)
	}
	if f := ledgersFree(ag, "NVIDIA A100 80GB"); f != 4 {
		t.Fatalf("%d A100 free, want 4", f)
	}
}

// A move whose old GPUs cannot be released (a VM holds them) is undone:
// the new copy is released, the name goes back to the old server, and
// the answer says why.
func TestClaimMoveUndoneWhenTheOldGPUsStay(t *testing.T) {
	_, n, ag := namedAgents(t, nil, "l40s-4", "a100-pcie-4")
	a := ag[0]
	ctx := context.Background()
	c, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	nameClaim(t, n, "vm-1", "a")
	stop, err := a.sim.Kernel.OpenGroup(c.GPUs[0].IOMMUGroup, qemu(4242, "vm-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	_, err = a.Resize(ctx, "vm-1", api.ResizeRequest{GPUs: []api.Item{{Model: "A100 80GB", Count: 1}}})
	if e := apiErr(t, err); e.Code != api.CodeInUse {
		t.Fatalf("move of a claim a VM uses: %+v", e)
	}
	r, err := n.Lookup(ctx, names.Claim("vm-1"), names.Linearizable)
	if err != nil || r.Owner != "a" || r.State != names.StateHeld {
		t.Fatalf("the name after the undone move: %+v, %v", r, err)
	}
	if _, err := ag[1].Lookup(ctx, "vm-1"); !api.IsCode(err, api.CodeNotFound) {
		t.Fatalf("b keeps a copy of vm-1: %v", err)
	}
	if now, err := a.Lookup(ctx, "vm-1"); err != nil || !now.CommittedAt.Equal(c.CommittedAt) {
		t.Fatalf("vm-1 on a after the undone move: %+v, %v", now, err)
	}
}

func (n *testNames) Stamp(ctx context.Context, key names.Key, token uint64) (names.Record, error) {
	if err := n.unavailable(names.OpStamp, key); err != nil {
		return names.Record{}, err
	}
	return n.reg.Stamp(ctx, key, token)
}

// A release whose owner let the name go reads the registry once (to find
// the owner), not again to look for a copy the name moved to: once the
// owner's release of the name succeeded, nothing can hold it elsewhere.
// The released name is free, and the answer carries no owner-only field.
func TestReleaseLetGoReadsTheRegistryOnce(t *testing.T) {
	_, n, ag := namedAgents(t, nil, "l40s-4", "a100-pcie-4")
	a, b := ag[0], ag[1]
	ctx := context.Background()
	if c, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}}); err != nil || c.Node != "a" {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	nameClaim(t, n, "vm-1", "a")
	before := n.lookups.Load()
	rel, err := b.Release(ctx, "vm-1")
	if err != nil || rel.Node != "a" || rel.NameReleased {
		t.Fatalf("release: %+v, %v", rel, err)
	}
	if got := n.lookups.Load() - before; got != 1 {
		t.Errorf("the release read the registry %d times, want 1", got)
	}
	if r, err := n.Lookup(ctx, names.Claim("vm-1"), names.Linearizable); !errors.Is(err, names.ErrNotFound) {
		t.Errorf("the name after the release: %+v, %v; want it free", r, err)
	}
}

// A move whose reservation on the new server is gone before its commit
// (that server was paused past the lease and its sweep dropped it)
// changes nothing and says so retryably: "not found" would tell the
// client the claim is gone (a chaos run's group resize answered
// not_found for a group that existed).
func TestClaimMoveWhoseReservationWentIsRetryable(t *testing.T) {
	_, n, ag := namedAgents(t, nil, "l40s-4", "a100-pcie-4")
	a, b := ag[0], ag[1]
	ctx := context.Background()
	c, err := a.Claim(ctx, "vm-1", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	nameClaim(t, n, "vm-1", "a")
	dropped := false
	n.beforeConfirm = func() {
		if cur, err := b.ledger.Get("vm-1"); err == nil && cur.State == ledger.StateReserved && !dropped {
			dropped = true
			if _, err := b.ledger.AbortReservation("vm-1", cur.CreatedAt); err != nil {
				t.Errorf("dropping b's reservation: %v", err)
			}
		}
	}
	_, err = a.Resize(ctx, "vm-1", api.ResizeRequest{GPUs: []api.Item{{Model: "A100 80GB", Count: 1}}})
	n.beforeConfirm = nil
	if !dropped {
		t.Fatal("the move's commit never asked to confirm with b's reservation in place")
	}
	if e := apiErr(t, err); e.Code != api.CodeUnavailable {
		t.Fatalf("move whose reservation went before its commit: %+v", e)
	}
	now, err := a.Lookup(ctx, "vm-1")
	if err != nil || now.Node != "a" || !now.CommittedAt.Equal(c.CommittedAt) {
		t.Fatalf("vm-1 after the failed move: %+v, %v", now, err)
	}
}
