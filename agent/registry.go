package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/pki"
	"github.com/gpuherd/gpuherd/gossip"
	"github.com/gpuherd/gpuherd/metrics"
)

// registryState runs this agent's part of the name registry
// (docs/names.md): raft over mutual TLS on its own listener when the agent
// is a voter or may become one, or a client that forwards. Server IDs are
// node names; their raft addresses come from gossip.
type registryState struct {
	a   *Agent
	c   *clusterState
	log *slog.Logger
	// reg is set once Open returned; raft's connection checks may run
	// before.
	reg  atomic.Pointer[names.Registry]
	addr string // advertised raft address, "" for a client
	// auto: no names_voters; the registry founds itself and grows.
	auto bool

	stop     chan struct{}
	wg       sync.WaitGroup
	stopOnce sync.Once

	mu sync.Mutex
	// published is what this agent last put in its gossip summary.
	published gossip.NamesInfo
	// registries are the registry IDs the last look at gossip found; more
	// than one is a split (registry_bootstrap.go).
	registries []string
}

// registryTiming is raft's timing in a real cluster; tests shorten it
// (agent's TestMain).
var registryTiming = names.LANTiming

// openRegistry starts the name registry on this agent (start phase
// naming), once gossip runs and before the peer API serves, unless a test
// injected one (WithNames) or the peer API runs in memory (no sockets:
// such tests inject theirs).
func (a *Agent) openRegistry(c *clusterState) error {
	if a.names != nil || a.peerNet != nil {
		return nil
	}
	a.setPhase(phaseNaming)
	cfg := a.cfg
	rs := &registryState{a: a, c: c, log: a.log.With("component", "names"), auto: len(cfg.NamesVoters) == 0, stop: make(chan struct{})}
	ncfg := names.Config{
		Node:      cfg.NodeName,
		Role:      names.RoleClient,
		Forwarder: rs,
		Discover:  rs.discover,
		Timing:    registryTiming(),
		Logger:    rs.log,
		StorageResult: func(part, op string, err error) {
			store := storeRegistryLog
			if part == names.StorageSnapshots {
				store = storeRegistrySnapshots
			}
			a.storageResult(store, op, err)
		},
	}
	if cfg.runsRaft() {
		trans, err := rs.transport()
		if err != nil {
			return err
		}
		ncfg.Transport, ncfg.DataDir = trans, cfg.namesDir()
		ncfg.Role = names.RoleNonVoter // auto: it may be added later
		if !rs.auto {
			ncfg.Role = names.RoleVoter
		}
	}
	for _, v := range cfg.NamesVoters {
		addr := v // resolved through gossip at each connection
		if v == cfg.NodeName && rs.addr != "" {
			addr = rs.addr
		}
		ncfg.Servers = append(ncfg.Servers, names.Server{ID: v, Address: addr})
	}
	reg, err := names.Open(ncfg)
	if err != nil {
		if ncfg.Transport != nil {
			if c, ok := ncfg.Transport.(interface{ Close() error }); ok {
				c.Close()
			}
		}
		return fmt.Errorf("name registry: %w", err)
	}
	rs.reg.Store(reg)
	a.registry = rs
	a.names = reg
	rs.c.names.Store(rs)
	rs.republish()
	a.metrics.Registry().MustRegister(newRegistryCollector(rs))
	st := reg.Status()
	rs.log.Info("name registry open", "role", st.Role, "raft", rs.addr, "voters", cfg.NamesVoters, "registry", st.Registry, "dir", ncfg.DataDir)
	rs.wg.Add(1)
	go rs.run()
	return nil
}

// transport is raft over mutual TLS on the names listener: the node's own
// certificate both ways, and only registry servers accepted at either end.
func (rs *registryState) transport() (raft.Transport, error) {
	a := rs.a
	ln := a.lns.names
	if ln == nil {
		return nil, errors.New("name registry: no raft listener was bound")
	}
	srv, err := pki.ServerConfig(rs.c.files, pki.WithLogger(a.log))
	if err != nil {
		return nil, fmt.Errorf("name registry TLS: %w", err)
	}
	cli, err := pki.ClientConfigAnyNode(rs.c.files, pki.WithLogger(a.log))
	if err != nil {
		return nil, fmt.Errorf("name registry TLS: %w", err)
	}
	layer, err := names.NewTLSStreamLayer(ln, srv, cli, rs.isServer)
	if err != nil {
		return nil, err
	}
	rs.addr = advertisedAddr(ln.Addr(), rs.c.peerAddr)
	if err := layer.Advertise(rs.addr); err != nil {
		return nil, err
	}
	layer.ExpectNodes(rs.nodeAt)
	a.lns.names = nil // the transport closes it from now on
	return names.NewTLSTransportResolving(layer, rs, rs.log), nil
}

// advertisedAddr is the address others reach a listener at: its own,
// unless it listens on every address; then the peer API's advertised host.
func advertisedAddr(ln net.Addr, peerAddr string) string {
	host, port, _ := net.SplitHostPort(ln.String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if h, _, err := net.SplitHostPort(peerAddr); err == nil {
			host = h
		}
	}
	return net.JoinHostPort(host, port)
}

// members is the gossip view, self included.
func (rs *registryState) members() []gossip.Member { return rs.c.g.Members() }

// ServerAddr resolves a registry server's node name to the raft address it
// advertises (raft.ServerAddressProvider); raft falls back to the address
// in its configuration when gossip has none.
func (rs *registryState) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	if string(id) == rs.a.cfg.NodeName && rs.addr != "" {
		return raft.ServerAddress(rs.addr), nil
	}
	for _, m := range rs.members() {
		if m.Name == string(id) && m.Summary.Names.Addr != "" {
			return raft.ServerAddress(m.Summary.Names.Addr), nil
		}
	}
	return "", fmt.Errorf("name registry: no raft address known for %s", id)
}

// nodeAt names the member that advertises address as its raft address.
func (rs *registryState) nodeAt(address string) string {
	for _, m := range rs.members() {
		if m.Summary.Names.Addr == address && m.State != gossip.StateLeft {
			return m.Name
		}
	}
	return ""
}

// isServer decides whom raft talks to, at both ends of a connection. A
// server that belongs to a registry talks only to the servers of its
// configuration (and the configured voters); one that belongs to none yet
// (standby) to the members that gossip shows as registry voters, one of
// which will add it.
func (rs *registryState) isServer(node string) bool {
	reg := rs.reg.Load()
	if reg != nil && (reg.IsServer(node) || reg.InConfiguration(node)) {
		return true
	}
	if reg != nil && reg.HasState() {
		return false
	}
	for _, m := range rs.members() {
		if m.Name == node && (m.Summary.Names.Role == gossip.NamesVoter || m.Summary.Names.Leader) {
			return true
		}
	}
	return false
}

// discover names the registry servers gossip shows, the leader first:
// whom a client, or a server that knows no leader, asks.
func (rs *registryState) discover() []string {
	var lead, rest []string
	for _, m := range rs.members() {
		if m.Self || m.State != gossip.StateAlive {
			continue
		}
		switch {
		case m.Summary.Names.Leader:
			lead = append(lead, m.Name)
		case m.Summary.Names.Role == gossip.NamesVoter:
			rest = append(rest, m.Name)
		}
	}
	slices.Sort(rest)
	return append(lead, rest...)
}

// Forward carries a registry request to server over the peer API
// (names.Forwarder). A request that certainly never reached it — the
// server is not in the view, its connection was refused, its route
// refused it unread — wraps names.ErrNotDelivered, so a write can go
// elsewhere without doubt.
func (rs *registryState) Forward(ctx context.Context, server string, req names.Request) (names.Response, error) {
	addr := ""
	for _, m := range rs.members() {
		if m.Name == server && !m.Self {
			addr = m.Summary.PeerAddr
		}
	}
	if addr == "" {
		return names.Response{}, fmt.Errorf("%s: no peer API address in this agent's gossip view: %w", server, names.ErrNotDelivered)
	}
	var pc *api.PeerClient
	switch o := rs.c.client(server, addr).(type) {
	case *api.PeerClient:
		pc = o
	case brokenOwner:
		return names.Response{}, fmt.Errorf("%s: %w: %w", server, o.err, names.ErrNotDelivered)
	default:
		return names.Response{}, fmt.Errorf("%s: no peer client: %w", server, names.ErrNotDelivered)
	}
	var resp names.Response
	err := pc.Names(ctx, req, &resp)
	if err == nil {
		return resp, nil
	}
	var ae *api.Error
	if errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &ae) {
		return names.Response{}, fmt.Errorf("%s: %w: %w", server, err, names.ErrNotDelivered)
	}
	return names.Response{}, fmt.Errorf("%s: %w", server, err)
}

// ServeNames answers another agent's registry request (POST
// /v1/peer/names); the API has already set who acts from the caller's
// certificate (api.Attribute).
func (a *Agent) ServeNames(ctx context.Context, body json.RawMessage) (any, error) {
	var req names.Request
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, api.Invalid("", "name registry request: %v", err)
	}
	rs := a.registry
	if rs == nil {
		// An injected registry server (WithNames) serves the route as the
		// agent's own would.
		if srv, ok := a.names.(namesServer); ok {
			return srv.Serve(ctx, req), nil
		}
		return names.Response{Error: &names.WireError{Code: names.WireNotLeader, Message: a.cfg.NodeName + " runs no name registry"}}, nil
	}
	return rs.reg.Load().Serve(ctx, req), nil
}

// namesServer is an authority that answers registry requests relayed from
// other agents: *names.Registry, when a test or a benchmark gives each
// agent its own with WithNames.
type namesServer interface {
	Serve(ctx context.Context, req names.Request) names.Response
}

var _ api.NameServer = (*Agent)(nil)

// removeVoter takes node out of the registry's voters, for `members
// remove` of a server gone for good, and reports whether it was one;
// nothing when it is not a voter, as far as this agent's raft
// configuration or its gossip view tell. An injected authority (tests)
// is asked through registryServers.
func (a *Agent) removeVoter(ctx context.Context, node string) (bool, error) {
	rs := a.registry
	if rs == nil {
		if srv, ok := a.names.(registryServers); ok && srv.IsServer(node) {
			return true, srv.RemoveServer(ctx, node)
		}
		return false, nil
	}
	reg := rs.reg.Load()
	voter := slices.ContainsFunc(reg.Voters(), func(s names.Server) bool { return s.ID == node }) ||
		slices.ContainsFunc(rs.members(), func(m gossip.Member) bool {
			return m.Name == node && m.Summary.Names.Role == gossip.NamesVoter
		})
	if !voter {
		return false, nil
	}
	rs.log.Warn("removing a voter from the name registry", "node", node)
	return true, reg.RemoveServer(ctx, node)
}

// transfer hands the leadership over before this agent stops.
func (rs *registryState) transfer() {
	if rs == nil {
		return
	}
	if err := rs.reg.Load().TransferLeadership(3 * time.Second); err != nil {
		rs.log.Warn("name registry: leadership not handed over; the others elect a leader after a timeout", "err", err)
	}
}

// close stops the registry on this agent; its state stays on disk.
func (rs *registryState) close() {
	if rs == nil {
		return
	}
	rs.stopOnce.Do(func() {
		close(rs.stop)
		rs.wg.Wait()
		if err := rs.reg.Load().Close(); err != nil {
			rs.log.Warn("name registry close", "err", err)
		}
	})
}

// newRegistryCollector exports the registry's state (gpuherd_names_*).
func newRegistryCollector(rs *registryState) prometheus.Collector {
	return metrics.NewNamesCollector(func() (metrics.NamesState, bool) {
		reg := rs.reg.Load()
		if reg == nil {
			return metrics.NamesState{}, false
		}
		st := reg.Status()
		return metrics.NamesState{
			Role:        st.Role,
			Leader:      reg.IsLeader(),
			LastContact: st.LastContact.Seconds(),
			HasContact:  st.LastContact > 0,
			Halted:      st.Halted != "",
			Registries:  rs.registryCount(),
		}, true
	})
}

// status is the registry as the status API shows it; nil without one.
func (rs *registryState) status() *api.NamesStatus {
	if rs == nil {
		return nil
	}
	st := rs.reg.Load().Status()
	return &api.NamesStatus{Role: st.Role, Leader: st.Leader, Registry: st.Registry, Voters: st.Voters,
		LastContactSeconds: st.LastContact.Seconds(), Halted: st.Halted}
}

// formingWait bounds how long a new name waits for a registry that is
// still being founded (no member knows one yet), so that a new cluster's
// first claims wait for the founding instead of answering 503; a
// registry that exists but has no leader answers within names' own hold.
const formingWait = 20 * time.Second

// awaitFounding returns once this agent's cluster has a registry, when
// formingWait has passed, or when ctx ends; at once when this agent runs
// no registry of its own (alone, or with an injected authority).
func (rs *registryState) awaitFounding(ctx context.Context) {
	if rs == nil || !rs.forming() {
		return
	}
	wait := rs.a.clk.NewTimer(formingWait)
	defer wait.Stop()
	tick := rs.a.clk.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for rs.forming() {
		select {
		case <-ctx.Done():
			return
		case <-wait.C():
			return
		case <-tick.C():
		}
	}
}

// leaderless reports whether this agent runs the registry and its copy
// knows no leader now.
func (rs *registryState) leaderless() bool {
	if rs == nil {
		return false
	}
	reg := rs.reg.Load()
	return reg != nil && reg.Leader() == ""
}

// forming reports whether no registry exists yet, as far as this agent
// and its gossip view know.
func (rs *registryState) forming() bool {
	if reg := rs.reg.Load(); reg != nil && (reg.ID() != "" || reg.HasState() || reg.Leader() != "") {
		return false
	}
	for _, m := range rs.members() {
		if !m.Self && knowsRegistry(m.Summary.Names) {
			return false
		}
	}
	return true
}
