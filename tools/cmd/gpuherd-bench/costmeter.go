package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/claimtest"
	"github.com/gpuherd/gpuherd/agent/names"
)

// costMeter counts what one operation costs: the peer API requests and the
// registry's raft RPCs that carry its claim ID, while that operation is the
// one being measured. Requests and RPCs that carry no measured ID (the
// owners' anti-entropy lists, resyncs of other claims, raft heartbeats) are
// counted apart, as background.
type costMeter struct {
	// op is the claim ID being measured, "" between operations.
	op atomic.Pointer[string]

	mu     sync.Mutex
	byPath map[string]int // requests naming op, by request (pathLabel)
	bgPath map[string]int // requests naming no measured ID, by request

	peerOp, peerAll     atomic.Int64 // requests naming op; every request
	appendsOp           atomic.Int64 // AppendEntries RPCs carrying an entry that names op
	appendsAll, beats   atomic.Int64 // AppendEntries RPCs with entries; without (heartbeats)
	votes, raftOther    atomic.Int64 // RequestVote and pre-vote; snapshots and TimeoutNow
	appendsUnattributed atomic.Int64 // entries-carrying RPCs while op was set that did not name it
	redirects           atomic.Int64 // registry forwards naming op answered "not the leader"
}

func newCostMeter() *costMeter {
	m := &costMeter{byPath: map[string]int{}, bgPath: map[string]int{}}
	empty := ""
	m.op.Store(&empty)
	return m
}

// measure makes id the operation whose messages are counted ("" for none).
func (m *costMeter) measure(id string) { m.op.Store(&id) }

func (m *costMeter) current() string { return *m.op.Load() }

// takePaths returns the per-path counts since the last call and clears them.
func (m *costMeter) takePaths() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.byPath
	m.byPath = map[string]int{}
	return out
}

// takeBackground returns the background requests by request since the
// last call and clears them.
func (m *costMeter) takeBackground() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.bgPath
	m.bgPath = map[string]int{}
	return out
}

// pathLabel names a request for the tables: method and path with every
// claim ID (or other name) as {id}, and a registry request's operation.
func pathLabel(method, path string, body []byte) string {
	segs := strings.Split(path, "/")
	for i := 1; i < len(segs); i++ {
		switch segs[i-1] {
		case "claims", "reservations", "directory", "groups", "members":
			segs[i] = "{id}"
		}
	}
	label := method + " " + strings.Join(segs, "/")
	if strings.HasSuffix(path, "/peer/names") {
		var req struct {
			Op names.Op `json:"op"`
		}
		if json.Unmarshal(body, &req) == nil && req.Op != "" {
			label += " " + string(req.Op)
		}
	}
	return label
}

// namesID reports whether a request (path and body) or a raft entry names
// claim id: in a path segment, or as a JSON string.
func namesID(id, path string, body []byte) bool {
	if id == "" {
		return false
	}
	return strings.Contains(path+"/", "/"+id+"/") || bytes.Contains(body, []byte(`"`+id+`"`))
}

// costNet is the agents' in-memory peer network (claimtest) with every
// request counted by the meter.
type costNet struct {
	net *claimtest.Network
	m   *costMeter

	mu      sync.Mutex
	addrs   map[string]string // node → peer address
	clients map[[2]string]*api.PeerClient
}

var _ agent.PeerNetwork = (*costNet)(nil)

func newCostNet(m *costMeter) *costNet {
	return &costNet{net: &claimtest.Network{}, m: m, addrs: map[string]string{}, clients: map[[2]string]*api.PeerClient{}}
}

// Serve makes h reachable as node's peer API and remembers its address.
func (n *costNet) Serve(node string, h http.Handler) (string, func()) {
	addr, stop := n.net.Serve(node, h)
	n.mu.Lock()
	n.addrs[node] = addr
	n.mu.Unlock()
	return addr, stop
}

// Transport is node's way to the others, counted.
func (n *costNet) Transport(node string) http.RoundTripper {
	return countingRoundTripper{next: n.net.Transport(node), m: n.m}
}

type countingRoundTripper struct {
	next http.RoundTripper
	m    *costMeter
}

func (rt countingRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		body = b
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	rt.m.peerAll.Add(1)
	label := pathLabel(req.Method, req.URL.Path, body)
	op := namesID(rt.m.current(), req.URL.Path, body)
	if op {
		rt.m.peerOp.Add(1)
	}
	rt.m.mu.Lock()
	if op {
		rt.m.byPath[label]++
	} else {
		rt.m.bgPath[label]++
	}
	rt.m.mu.Unlock()
	return rt.next.RoundTrip(req)
}

// forwarder carries a registry request from one agent to another over the
// counted peer network's route (POST /v1/peer/names), as the agent's own
// forwarder does over mutual TLS.
func (n *costNet) forwarder(from string) names.Forwarder { return peerForwarder{n: n, from: from} }

type peerForwarder struct {
	n    *costNet
	from string
}

func (f peerForwarder) Forward(ctx context.Context, server string, req names.Request) (names.Response, error) {
	f.n.mu.Lock()
	addr, ok := f.n.addrs[server]
	pc := f.n.clients[[2]string{f.from, server}]
	if ok && pc == nil {
		pc = api.NewPeerClientTransport(addr, f.n.Transport(f.from), 10*time.Second)
		f.n.clients[[2]string{f.from, server}] = pc
	}
	f.n.mu.Unlock()
	if !ok {
		return names.Response{}, fmt.Errorf("%s: not on the peer network yet: %w", server, names.ErrNotDelivered)
	}
	var resp names.Response
	err := pc.Names(ctx, req, &resp)
	if err == nil {
		if resp.Error != nil && resp.Error.Code == names.WireNotLeader && req.Key.Name != "" && req.Key.Name == f.n.m.current() {
			f.n.m.redirects.Add(1)
		}
		return resp, nil
	}
	var ae *api.Error
	if errors.Is(err, claimtest.ErrRefused) || errors.As(err, &ae) {
		return names.Response{}, fmt.Errorf("%s: %w: %w", server, err, names.ErrNotDelivered)
	}
	return names.Response{}, fmt.Errorf("%s: %w", server, err)
}

// countingTransport is a registry voter's raft transport with every RPC it
// sends counted by the meter.
type countingTransport struct {
	raft.Transport
	m *costMeter
}

func (t countingTransport) count(args *raft.AppendEntriesRequest) {
	if len(args.Entries) == 0 {
		t.m.beats.Add(1)
		return
	}
	t.m.appendsAll.Add(1)
	id := t.m.current()
	if id == "" {
		return
	}
	for _, e := range args.Entries {
		if namesID(id, "", e.Data) {
			t.m.appendsOp.Add(1)
			return
		}
	}
	t.m.appendsUnattributed.Add(1)
}

func (t countingTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	t.count(args)
	return t.Transport.AppendEntries(id, target, args, resp)
}

func (t countingTransport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	p, err := t.Transport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	return countingPipeline{AppendPipeline: p, t: t}, nil
}

func (t countingTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	t.m.votes.Add(1)
	return t.Transport.RequestVote(id, target, args, resp)
}

func (t countingTransport) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	t.m.raftOther.Add(1)
	return t.Transport.InstallSnapshot(id, target, args, resp, data)
}

func (t countingTransport) TimeoutNow(id raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	t.m.raftOther.Add(1)
	return t.Transport.TimeoutNow(id, target, args, resp)
}

// RequestPreVote and Close pass on what raft looks for by type assertion
// (raft.WithPreVote, raft.WithClose): without them the wrapper would turn
// pre-vote off and leave the listener open.
func (t countingTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	t.m.votes.Add(1)
	pv, ok := t.Transport.(raft.WithPreVote)
	if !ok {
		return errors.New("raft transport without pre-vote")
	}
	return pv.RequestPreVote(id, target, args, resp)
}

func (t countingTransport) Close() error {
	if c, ok := t.Transport.(raft.WithClose); ok {
		return c.Close()
	}
	return nil
}

var (
	_ raft.WithPreVote = countingTransport{}
	_ raft.WithClose   = countingTransport{}
)

type countingPipeline struct {
	raft.AppendPipeline
	t countingTransport
}

func (p countingPipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	p.t.count(args)
	return p.AppendPipeline.AppendEntries(args, resp)
}
