package agent

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/gossip"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// peerState is what c keeps for node: its peer clients' addresses, whether
// a target is cached for it, and whether it is backed off.
func (c *clusterState) peerState(node string) (addrs []string, target, avoided bool) {
	c.mu.Lock()
	for k := range c.clients {
		if k.name == node {
			addrs = append(addrs, k.addr)
		}
	}
	_, target = c.targets[node]
	c.mu.Unlock()
	c.avoid.mu.Lock()
	_, avoided = c.avoid.m[node]
	c.avoid.mu.Unlock()
	return addrs, target, avoided
}

// What an agent keeps per member goes with the member: a server gossip no
// longer lists leaves no client, target or backoff behind, and a server
// that moved leaves no client at its old address. Members still listed,
// and a member whose summary gives no address, keep theirs.
func TestForgetGoneDropsWhatLeftMembersLeftBehind(t *testing.T) {
	c := &clusterState{
		clients: map[peerKey]*api.PeerClient{},
		targets: map[string]cachedTarget{},
		avoid:   newAvoidance(clock.WithNow(time.Now), func(string) uint64 { return 1 }, quietLog()),
	}
	for _, k := range []peerKey{{"gone", "10.0.0.1:7001"}, {"moved", "10.0.0.2:7001"}, {"moved", "10.0.0.2:7002"}, {"kept", "10.0.0.3:7001"}, {"unread", "10.0.0.4:7001"}} {
		c.clients[k] = api.NewPeerClientTransport(k.addr, http.DefaultTransport, time.Second)
	}
	for _, n := range []string{"gone", "moved", "kept", "unread"} {
		c.targets[n] = cachedTarget{}
		c.avoid.failed(n, "10.0.0.9:7001", errors.New("connection refused"))
	}
	member := func(name, addr string) gossip.Member {
		m := gossip.Member{Name: name, State: gossip.StateAlive}
		m.Summary.PeerAddr = addr
		return m
	}
	c.forgetGone([]gossip.Member{member("moved", "10.0.0.2:7002"), member("kept", "10.0.0.3:7001"), member("unread", "")})

	for _, want := range []struct {
		node    string
		addrs   []string
		target  bool
		avoided bool
	}{
		{"gone", nil, false, false},
		{"moved", []string{"10.0.0.2:7002"}, true, true},
		{"kept", []string{"10.0.0.3:7001"}, true, true},
		{"unread", []string{"10.0.0.4:7001"}, true, true},
	} {
		addrs, target, avoided := c.peerState(want.node)
		if len(addrs) != len(want.addrs) || len(addrs) > 0 && addrs[0] != want.addrs[0] || target != want.target || avoided != want.avoided {
			t.Errorf("%s: clients at %v, target %v, backed off %v; want %v, %v, %v", want.node, addrs, target, avoided, want.addrs, want.target, want.avoided)
		}
	}
	if n := c.avoid.n.Load(); n != 3 {
		t.Errorf("backoff count %d after forgetting one of four, want 3", n)
	}
}

// The same in a running agent: once a dead server is removed from its
// gossip view, the agent no longer keeps a client or a target for it.
func TestAgentForgetsWhatARemovedMemberLeftBehind(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start("a", "a100-pcie-4")
	tc.start("b", "l40s-4")
	tc.start("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return len(x.targets()) == 3 })
	if addrs, target, _ := a.cluster.peerState("c"); len(addrs) == 0 || !target {
		t.Fatalf("a keeps clients %v and target %v for c before it goes: nothing to test", addrs, target)
	}
	tc.cutOff("c")
	a.cluster.Forget("c")
	waitFor(t, "a to drop what it kept for c", 10*time.Second, func() bool {
		addrs, target, avoided := a.cluster.peerState("c")
		return len(addrs) == 0 && !target && !avoided
	})
	if addrs, target, _ := a.cluster.peerState("b"); len(addrs) != 1 || !target {
		t.Errorf("a keeps clients %v and target %v for b, which is still there", addrs, target)
	}
}
