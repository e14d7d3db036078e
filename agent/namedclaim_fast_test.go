package agent

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/events"
)

// bindCounter counts the GPUs bound to vfio-pci by every agent it is given
// to (WithRecorder).
type bindCounter struct {
	nopRecorder
	binds atomic.Int64
}

func (r *bindCounter) VFIOOperation(op string, _ time.Duration, _ error) {
	if op == events.VFIOBind {
		r.binds.Add(1)
	}
}

// A claim of a new ID reads nothing from the registry before the owner's
// hold, its one registry write, which is the check: before, every claim
// first read its ID (through the leader, on an agent that keeps no copy of
// the registry), one request more on every claim's path. A retry of the
// placed claim through another agent, asked of a server that does not hold
// it, is answered with the claim: that server's hold is refused, and it
// moves no driver for it (its idle driver is nvidia here, so binding would
// have moved its GPUs to vfio-pci and back).
func TestClusterNamedClaimReadsNothingBeforeItsHold(t *testing.T) {
	rec := &bindCounter{}
	tc := newTestCluster(t)
	tc.opts = append(tc.opts, WithRecorder(rec))
	a, b, c := tc.start("a", "a100-pcie-4"), tc.start("b", "l40s-4"), tc.start("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, l40s) == 8 })
	ctx := context.Background()

	lookups, holds, binds := tc.names.lookups.Load(), tc.names.holds.Load(), rec.binds.Load()
	first, err := a.Claim(ctx, "vm-new", l40sReq(2))
	if err != nil {
		t.Fatal(err)
	}
	if n := tc.names.lookups.Load() - lookups; n != 0 {
		t.Errorf("a claim of a new ID read the registry %d times; want none before its hold", n)
	}
	if n := tc.names.holds.Load() - holds; n != 1 {
		t.Errorf("a claim of a new ID made %d holds; want 1", n)
	}
	if n := rec.binds.Load() - binds; n != 2 {
		t.Fatalf("the claim bound %d GPUs, want its 2", n)
	}

	other := b
	if first.Node == "b" {
		other = c
	}
	binds = rec.binds.Load()
	req := l40sReq(2)
	req.PreferNode = other.cfg.NodeName // asked of the server that does not hold it
	again, err := a.Claim(ctx, "vm-new", req)
	if err != nil || again.Node != first.Node || !slices.Equal(gpuAddrs(again), gpuAddrs(first)) {
		t.Fatalf("retry asked of %s: %+v, %v; want the claim on %s", other.cfg.NodeName, again, err, first.Node)
	}
	if n := rec.binds.Load() - binds; n != 0 {
		t.Errorf("the retry bound %d GPUs; want none: %s's hold was refused before any driver moved", n, other.cfg.NodeName)
	}
	if on := copiesOf("vm-new", a, b, c); len(on) != 1 {
		t.Fatalf("vm-new held on %v, want exactly one server", on)
	}
	if got := localFree(other, l40s); got != 4 {
		t.Errorf("%d L40S free on %s after the refused retry, want all 4", got, other.cfg.NodeName)
	}
	checkInvariants(t, a, b, c)
}

// A coordinator whose placement could not be confirmed because the
// registry did not answer reads the IDs of its next claims first, for a
// while, so that they answer a 503 naming the registry at once instead of
// reserving; other coordinators go on placing at once.
func TestClusterNamedReadsFirstAfterTheRegistryFailed(t *testing.T) {
	tc, a, b, c := namedThree(t)
	ctx := context.Background()
	tc.names.SetDown(true)
	if _, err := a.Claim(ctx, "vm-down", l40sReq(1)); !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), "registry") {
		t.Fatalf("claim with the registry down: %v; want a 503 naming the registry", err)
	}
	tc.names.SetDown(false)

	lookups := tc.names.lookups.Load()
	if _, err := a.Claim(ctx, "vm-after", l40sReq(1)); err != nil {
		t.Fatal(err)
	}
	if n := tc.names.lookups.Load() - lookups; n != 1 {
		t.Errorf("the next claim through a read the registry %d times; want once, before placing", n)
	}
	lookups = tc.names.lookups.Load()
	if _, err := b.Claim(ctx, "vm-elsewhere", l40sReq(1)); err != nil {
		t.Fatal(err)
	}
	if n := tc.names.lookups.Load() - lookups; n != 0 {
		t.Errorf("a claim through b, which saw no failure, read the registry %d times; want none", n)
	}
	checkInvariants(t, a, b, c)
}
