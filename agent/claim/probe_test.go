package claim

import (
	"context"
	"sync"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/placement"
)

// capOwner is an owner with free GPUs of one model: it reserves from them
// and answers its capacity, counting the reads.
type capOwner struct {
	fakeOwner
	model string
	mu    sync.Mutex
	free  int
	reads int
}

func (o *capOwner) Capacity(context.Context) (api.Capacity, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.reads++
	return api.Capacity{Free: map[string]int{o.model: o.free}}, nil
}

func (o *capOwner) Reserve(_ context.Context, id string, rr api.ReserveRequest) (api.Claim, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := rr.Items[0].Count
	if o.free < n {
		return api.Claim{}, &api.Error{Code: api.CodeNotAvailable, Message: "not available"}
	}
	o.free -= n
	return api.Claim{ID: id, Node: o.name, State: api.StateReserved, Items: rr.Items}, nil
}

func (o *capOwner) Commit(_ context.Context, id string) (api.Claim, error) {
	return api.Claim{ID: id, Node: o.name, State: api.StateClaimed}, nil
}

// capServer is a server of model H100 as the view shows it (free as
// gossip last said) and as it is now.
type capServer struct {
	name      string
	view, now int
}

// capServers builds an owner and a target, 8 healthy GPUs each, for
// every server.
func capServers(servers []capServer) ([]*capOwner, []Target) {
	var owners []*capOwner
	var targets []Target
	for _, s := range servers {
		o := &capOwner{fakeOwner: fakeOwner{name: s.name}, model: "H100", free: s.now}
		owners = append(owners, o)
		targets = append(targets, NewTarget(s.name, false, o, map[string]int{"H100": s.view}, false,
			map[string]ledger.ModelTotals{"H100": {Total: 8, Healthy: 8, Free: s.view}}))
	}
	return owners, targets
}

// probeCase places count GPUs of model H100 on servers whose view (free
// as gossip last said) differs from what they hold now (free now), 8
// healthy GPUs each, and returns where the claim went and the capacity
// reads each server answered.
func probeCase(t *testing.T, count int, servers []capServer) (string, map[string]int) {
	t.Helper()
	owners, targets := capServers(servers)
	co := newFakeCoordinator(&owners[0].fakeOwner)
	want := []placement.Want{{Model: "H100", Count: count}}
	at := &attempt{Coordinator: co, id: "vm-1", rr: api.ReserveRequest{Items: want, Coordinator: co.cfg.NodeName},
		want: want, view: targets, vouch: func(string) bool { return true }}
	c, err := at.place(context.Background())
	if err != nil {
		t.Fatalf("place: %v", err)
	}
	reads := map[string]int{}
	for _, o := range owners {
		reads[o.name] = o.reads
	}
	return c.Node, reads
}

// Under load the view lags: a server gossip last saw one GPU short of the
// request has had a release since and now holds exactly what is asked.
// Best fit is that server, not the one with room by the view that would
// be left with a hole too small for the next big request.
func TestProbeFindsTheBestFitTheViewShowsTooFull(t *testing.T) {
	node, reads := probeCase(t, 2, []capServer{
		{"exact", 1, 2}, // a release not yet gossiped
		{"roomy", 4, 4},
		{"big", 6, 6},
	})
	if node != "exact" {
		t.Errorf("claim went to %s, want exact (the best fit now; %v capacity reads)", node, reads)
	}
}

// The view's six best candidates may all have been freed since, and one
// it ranks behind them have taken claims: the servers read before choosing
// reach past the view's best, and the fresh figures decide.
func TestProbeRanksOnFreshFiguresBeyondTheViewsBest(t *testing.T) {
	servers := []capServer{
		{"s1", 2, 6}, {"s2", 2, 6}, {"s3", 2, 6}, {"s4", 2, 6}, {"s5", 2, 6}, {"s6", 2, 6}, // best by the view; freed since
		{"later", 4, 2}, // claims since: exactly the request now
		{"full", 0, 0},
	}
	node, _ := probeCase(t, 2, servers)
	if node != "later" {
		t.Errorf("claim went to %s, want later (the best fit now)", node)
	}
}

// An unloaded platform is not probed: a claim its first candidate can
// hold costs no capacity read.
func TestNoProbeWhenNotBusy(t *testing.T) {
	node, reads := probeCase(t, 1, []capServer{
		{"a", 8, 8}, {"b", 7, 7}, {"c", 8, 8},
	})
	if node != "b" {
		t.Errorf("claim went to %s, want b (best fit)", node)
	}
	for n, r := range reads {
		if r != 0 {
			t.Errorf("%s answered %d capacity reads on an unloaded platform", n, r)
		}
	}
}

// A claim that must stay on its server reads no other server's capacity.
func TestProbeKeepsPinnedClaimsOnTheirServer(t *testing.T) {
	owners, targets := capServers([]capServer{{"a", 1, 1}, {"pinned", 2, 2}, {"c", 1, 2}})
	co := newFakeCoordinator(&owners[0].fakeOwner)
	want := []placement.Want{{Model: "H100", Count: 2}}
	at := &attempt{Coordinator: co, id: "vm-1", rr: api.ReserveRequest{Items: want, Coordinator: co.cfg.NodeName},
		want: want, view: targets, prefer: "pinned", stay: true, vouch: func(string) bool { return true }}
	c, err := at.place(context.Background())
	if err != nil || c.Node != "pinned" {
		t.Fatalf("claim that must stay: on %q, %v; want pinned", c.Node, err)
	}
	for _, o := range owners {
		if o.name != "pinned" && o.reads != 0 {
			t.Errorf("%s read for a claim that must stay on pinned", o.name)
		}
	}
}

// A refusal on a platform with room does not make the coordinator read
// capacity before its next claims: below half load a stale candidate
// costs one refused reservation, less than the probe's reads.
func TestRefusalWithRoomProbesNothing(t *testing.T) {
	owners, targets := capServers([]capServer{{"stale", 1, 0}, {"b", 6, 6}, {"c", 7, 7}})
	co := newFakeCoordinator(&owners[0].fakeOwner)
	want := []placement.Want{{Model: "H100", Count: 1}}
	for i, id := range []string{"vm-1", "vm-2"} {
		at := &attempt{Coordinator: co, id: id, rr: api.ReserveRequest{Items: want, Coordinator: co.cfg.NodeName},
			want: want, view: targets, vouch: func(string) bool { return true }}
		c, err := at.place(context.Background())
		if err != nil || c.Node != "b" {
			t.Fatalf("claim %d: %+v, %v; want it on b after stale's refusal", i+1, c, err)
		}
	}
	for _, o := range owners {
		if o.reads != 0 {
			t.Errorf("%s answered %d capacity reads; want none below half load", o.name, o.reads)
		}
	}
}
