package registry

import (
	"context"
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

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/pki"
	"github.com/gpuherd/gpuherd/gossip"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// Registry runs this agent's part of the name registry: raft over mutual
// TLS on its own listener when the agent is a voter or may become one, or
// a client that forwards. Server IDs are node names; their raft addresses
// come from gossip.
type Registry struct {
	cfg      Config
	gossip   Gossip
	joined   func() bool
	publish  func()
	peer     func(node, addr string) (Peer, error)
	clk      clock.Clock
	log      *slog.Logger
	files    pki.Files
	peerAddr string

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
	// than one is a split (founding.go).
	registries []string
}

// Open opens the name registry on this agent (the agent's start phase
// naming), once gossip runs and before the peer API serves; Start then
// runs it.
func Open(d Deps) (*Registry, error) {
	cfg := d.Config
	if cfg.FoundingSettle == 0 {
		cfg.FoundingSettle = DefaultFoundingSettle
	}
	rs := &Registry{cfg: cfg, gossip: d.Gossip, joined: d.Joined, publish: d.Publish, peer: d.Peer, clk: d.Clock,
		log: d.Log.With("component", "names"), files: d.TLS, peerAddr: d.PeerAddr,
		auto: len(cfg.Voters) == 0, stop: make(chan struct{})}
	ncfg := names.Config{
		Node:          cfg.Node,
		Role:          names.RoleClient,
		Forwarder:     rs,
		Discover:      rs.discover,
		Timing:        cfg.Timing,
		Logger:        rs.log,
		StorageResult: d.StorageResult,
		StorageTime:   d.StorageTime,
	}
	if cfg.RunsRaft {
		trans, err := rs.transport(d.Listener, d.Log)
		if err != nil {
			return nil, err
		}
		ncfg.Transport, ncfg.DataDir = trans, cfg.Dir
		ncfg.Role = names.RoleNonVoter // auto: it may be added later
		if !rs.auto {
			ncfg.Role = names.RoleVoter
		}
	} else if d.Listener != nil {
		d.Listener.Close()
	}
	for _, v := range cfg.Voters {
		addr := v // resolved through gossip at each connection
		if v == cfg.Node && rs.addr != "" {
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
		return nil, fmt.Errorf("name registry: %w", err)
	}
	rs.reg.Store(reg)
	return rs, nil
}

// Start tells gossip this agent's part in the registry and runs the
// registry's loop (founding.go) until Close. The agent's gossip summary
// must read Info by now.
func (rs *Registry) Start() {
	rs.republish()
	reg := rs.reg.Load()
	st := reg.Status()
	rs.log.Info("name registry open", "role", st.Role, "raft", rs.addr, "voters", rs.cfg.Voters, "registry", st.Registry, "dir", rs.dirOrNone())
	rs.wg.Add(1)
	go rs.run()
}

// dirOrNone is the raft state's directory, "" for a client.
func (rs *Registry) dirOrNone() string {
	if !rs.cfg.RunsRaft {
		return ""
	}
	return rs.cfg.Dir
}

// Names is the registry itself, the agent's name authority.
func (rs *Registry) Names() *names.Registry { return rs.reg.Load() }

// transport is raft over mutual TLS on the names listener: the node's own
// certificate both ways, and only registry servers accepted at either end.
func (rs *Registry) transport(ln net.Listener, log *slog.Logger) (raft.Transport, error) {
	if ln == nil {
		return nil, errors.New("name registry: no raft listener was bound")
	}
	srv, err := pki.ServerConfig(rs.files, pki.WithLogger(log))
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("name registry TLS: %w", err)
	}
	cli, err := pki.ClientConfigAnyNode(rs.files, pki.WithLogger(log))
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("name registry TLS: %w", err)
	}
	layer, err := names.NewTLSStreamLayer(ln, srv, cli, rs.isServer)
	if err != nil {
		ln.Close()
		return nil, err
	}
	rs.addr = advertisedAddr(ln.Addr(), rs.peerAddr)
	if err := layer.Advertise(rs.addr); err != nil {
		ln.Close()
		return nil, err
	}
	layer.ExpectNodes(rs.nodeAt)
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
func (rs *Registry) members() []gossip.Member { return rs.gossip.Members() }

// ServerAddr resolves a registry server's node name to the raft address it
// advertises (raft.ServerAddressProvider); raft falls back to the address
// in its configuration when gossip has none.
func (rs *Registry) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	if string(id) == rs.cfg.Node && rs.addr != "" {
		return raft.ServerAddress(rs.addr), nil
	}
	if m, ok := rs.gossip.Member(string(id)); ok && m.Summary.Names.Addr != "" {
		return raft.ServerAddress(m.Summary.Names.Addr), nil
	}
	return "", fmt.Errorf("name registry: no raft address known for %s", id)
}

// nodeAt names the member that advertises address as its raft address.
func (rs *Registry) nodeAt(address string) string {
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
func (rs *Registry) isServer(node string) bool {
	reg := rs.reg.Load()
	if reg != nil && (reg.IsServer(node) || reg.InConfiguration(node)) {
		return true
	}
	if reg != nil && reg.HasState() {
		return false
	}
	m, ok := rs.gossip.Member(node)
	return ok && (m.Summary.Names.Role == gossip.NamesVoter || m.Summary.Names.Leader)
}

// discover names the registry servers gossip shows, the leader first:
// whom a client, or a server that knows no leader, asks.
func (rs *Registry) discover() []string {
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
func (rs *Registry) Forward(ctx context.Context, server string, req names.Request) (names.Response, error) {
	addr := ""
	if m, ok := rs.gossip.Member(server); ok && !m.Self {
		addr = m.Summary.PeerAddr
	}
	if addr == "" {
		return names.Response{}, fmt.Errorf("%s: no peer API address in this agent's gossip view: %w", server, names.ErrNotDelivered)
	}
	pc, err := rs.peer(server, addr)
	if err != nil {
		return names.Response{}, fmt.Errorf("%s: %w: %w", server, err, names.ErrNotDelivered)
	}
	var resp names.Response
	err = pc.Names(ctx, req, &resp)
	if err == nil {
		return resp, nil
	}
	var ae *api.Error
	if errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &ae) {
		return names.Response{}, fmt.Errorf("%s: %w: %w", server, err, names.ErrNotDelivered)
	}
	return names.Response{}, fmt.Errorf("%s: %w", server, err)
}

// RemoveVoter takes node out of the registry's voters, for `members
// remove` of a server gone for good, and reports whether it was one;
// nothing when it is not a voter, as far as this agent's raft
// configuration or its gossip view tell.
func (rs *Registry) RemoveVoter(ctx context.Context, node string) (bool, error) {
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

// Transfer hands the leadership over before this agent stops.
func (rs *Registry) Transfer() {
	if rs == nil {
		return
	}
	if err := rs.reg.Load().TransferLeadership(3 * time.Second); err != nil {
		rs.log.Warn("name registry: leadership not handed over; the others elect a leader after a timeout", "err", err)
	}
}

// Close stops the registry on this agent; its state stays on disk.
func (rs *Registry) Close() {
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

// Status is the registry as the status API shows it; nil without one.
func (rs *Registry) Status() *api.NamesStatus {
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

// AwaitFounding returns once this agent's cluster has a registry, when
// formingWait has passed, or when ctx ends; at once when this agent runs
// no registry of its own (rs is nil: alone, or with an injected
// authority).
func (rs *Registry) AwaitFounding(ctx context.Context) {
	if rs == nil || !rs.forming() {
		return
	}
	wait := rs.clk.NewTimer(formingWait)
	defer wait.Stop()
	tick := rs.clk.NewTicker(50 * time.Millisecond)
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

// Leaderless reports whether this agent runs the registry and its copy
// knows no leader now.
func (rs *Registry) Leaderless() bool {
	if rs == nil {
		return false
	}
	reg := rs.reg.Load()
	return reg != nil && reg.Leader() == ""
}

// forming reports whether no registry exists yet, as far as this agent
// and its gossip view know.
func (rs *Registry) forming() bool {
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
