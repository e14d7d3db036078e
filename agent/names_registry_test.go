package agent

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuherd/gpuherd/agent/names"
)

// testNames is one in-process name registry that a test's agents share
// (pass it with WithNames): a single voter on raft's in-memory transport,
// kept in memory. SetDown makes every call answer unavailable, as a
// registry that lost its quorum does.
type testNames struct {
	reg  *names.Registry
	down atomic.Bool
	// lookups and holds count the calls of every agent, answered or not.
	lookups, holds atomic.Int64
	// beforeConfirm, when set, runs as a confirm (or a move's) arrives.
	beforeConfirm func()
}

var _ NameAuthority = (*testNames)(nil)

func newTestNames(t testing.TB, adjust ...func(*names.Config)) *testNames {
	t.Helper()
	_, trans := raft.NewInmemTransportWithTimeout(raft.ServerAddress("registry"), 500*time.Millisecond)
	cfg := names.Config{
		Node:      "registry",
		Role:      names.RoleVoter,
		Servers:   []names.Server{{ID: "registry", Address: "registry"}},
		Transport: trans,
		Timing:    names.FastTiming(),
	}
	for _, f := range adjust {
		f(&cfg)
	}
	reg, err := names.Open(cfg)
	if err != nil {
		t.Fatalf("opening the test name registry: %v", err)
	}
	t.Cleanup(func() { reg.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Wait for its leader: the first call of a test must not pay for the
	// election.
	if _, err := reg.Lookup(ctx, names.Claim("warm-up"), names.Linearizable); err != nil && !errors.Is(err, names.ErrNotFound) {
		t.Fatalf("test name registry has no leader: %v", err)
	}
	return &testNames{reg: reg}
}

// SetDown makes every call unavailable (down) or answered (up).
func (n *testNames) SetDown(down bool) { n.down.Store(down) }

func (n *testNames) unavailable(op names.Op, key names.Key) error {
	if !n.down.Load() {
		return nil
	}
	return &names.UnavailableError{Op: op, Key: key, Reason: "the test registry is down", Unreached: []string{"registry"}}
}

func (n *testNames) Acquire(ctx context.Context, key names.Key, caller, owner, request string, members []string) (names.Grant, error) {
	if err := n.unavailable(names.OpAcquire, key); err != nil {
		return names.Grant{}, err
	}
	return n.reg.Acquire(ctx, key, caller, owner, request, members)
}

func (n *testNames) Confirm(ctx context.Context, key names.Key, token uint64, owner string, members []string) (names.Record, error) {
	if n.beforeConfirm != nil {
		n.beforeConfirm()
	}
	if err := n.unavailable(names.OpConfirm, key); err != nil {
		return names.Record{}, err
	}
	return n.reg.Confirm(ctx, key, token, owner, members)
}

func (n *testNames) Hold(ctx context.Context, key names.Key, caller, owner, request string, recall bool) (names.Record, error) {
	n.holds.Add(1)
	if err := n.unavailable(names.OpHold, key); err != nil {
		return names.Record{}, err
	}
	return n.reg.Hold(ctx, key, caller, owner, request, recall)
}

func (n *testNames) Release(ctx context.Context, key names.Key, token uint64, node string) (names.Record, error) {
	if err := n.unavailable(names.OpRelease, key); err != nil {
		return names.Record{}, err
	}
	return n.reg.Release(ctx, key, token, node)
}

func (n *testNames) ReleaseRemembering(ctx context.Context, key names.Key, token uint64, node string, keep time.Duration) (names.Record, error) {
	if err := n.unavailable(names.OpRelease, key); err != nil {
		return names.Record{}, err
	}
	return n.reg.ReleaseRemembering(ctx, key, token, node, keep)
}

func (n *testNames) SetMembers(ctx context.Context, key names.Key, token uint64, members []string) (names.Record, error) {
	if err := n.unavailable(names.OpSetMembers, key); err != nil {
		return names.Record{}, err
	}
	return n.reg.SetMembers(ctx, key, token, members)
}

func (n *testNames) Lookup(ctx context.Context, key names.Key, mode names.ReadMode) (names.Record, error) {
	n.lookups.Add(1)
	if err := n.unavailable(names.OpLookup, key); err != nil {
		return names.Record{}, err
	}
	return n.reg.Lookup(ctx, key, mode)
}

func (n *testNames) RemoveMember(ctx context.Context, node string) ([]names.Key, error) {
	if err := n.unavailable(names.OpRemoveMember, names.Key{}); err != nil {
		return nil, err
	}
	return n.reg.RemoveMember(ctx, node)
}

func TestTestNamesGrantsAndGoesDown(t *testing.T) {
	n := newTestNames(t)
	ctx := context.Background()
	g, err := n.Acquire(ctx, names.Claim("vm-1"), "a", "", "req", nil)
	if err != nil || g.Record.Token == 0 {
		t.Fatalf("acquire: %+v, %v", g, err)
	}
	n.SetDown(true)
	if _, err := n.Lookup(ctx, names.Claim("vm-1"), names.Linearizable); !names.IsUnavailable(err) {
		t.Fatalf("lookup while down: %v, want unavailable", err)
	}
	n.SetDown(false)
	if r, err := n.Lookup(ctx, names.Claim("vm-1"), names.Linearizable); err != nil || r.State != names.StatePending {
		t.Fatalf("lookup after: %+v, %v", r, err)
	}
}

// as is n seen through node's peer API route: like agent/api's names route,
// it takes the acting node from the caller, never from the arguments, so
// in-memory tests meet the registry's identity rules as real agents do.
func (n *testNames) as(node string) NameAuthority { return nodeNames{n, node} }

type nodeNames struct {
	*testNames
	node string
}

func (n nodeNames) Acquire(ctx context.Context, key names.Key, _, owner, request string, members []string) (names.Grant, error) {
	return n.testNames.Acquire(ctx, key, n.node, owner, request, members)
}

func (n nodeNames) Confirm(ctx context.Context, key names.Key, token uint64, owner string, members []string) (names.Record, error) {
	if owner != "" && owner != n.node {
		if len(members) > 0 {
			return names.Record{}, fmt.Errorf("test registry: %s confirms members for %s", n.node, owner)
		}
		return n.testNames.ConfirmMove(ctx, key, token, owner, n.node)
	}
	return n.testNames.Confirm(ctx, key, token, n.node, members)
}

func (n nodeNames) Hold(ctx context.Context, key names.Key, caller, _, request string, recall bool) (names.Record, error) {
	return n.testNames.Hold(ctx, key, caller, n.node, request, recall)
}

func (n nodeNames) ConfirmMove(ctx context.Context, key names.Key, token uint64, owner, _ string) (names.Record, error) {
	return n.testNames.ConfirmMove(ctx, key, token, owner, n.node)
}

func (n nodeNames) Release(ctx context.Context, key names.Key, token uint64, _ string) (names.Record, error) {
	return n.testNames.Release(ctx, key, token, n.node)
}

func (n nodeNames) ReleaseRemembering(ctx context.Context, key names.Key, token uint64, _ string, keep time.Duration) (names.Record, error) {
	return n.testNames.ReleaseRemembering(ctx, key, token, n.node, keep)
}

func (n nodeNames) Move(ctx context.Context, key names.Key, token uint64, from, to, _ string) (names.Record, error) {
	return n.testNames.Move(ctx, key, token, from, to, n.node)
}
