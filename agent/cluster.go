package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/api/peerwire"
	"github.com/gpuherd/gpuherd/agent/claim"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/pki"
	"github.com/gpuherd/gpuherd/agent/registry"
	"github.com/gpuherd/gpuherd/gossip"
)

// clusterState is this agent's part in the platform: gossip out and in, the
// mutual-TLS listener for coordinators, and the clients to other owners.
type clusterState struct {
	a        *Agent
	g        *gossip.Cluster
	files    pki.Files
	peerAddr string // host:port others reach our peer API at
	server   *http.Server
	ln       net.Listener
	// unserve stops serving the peer API on a PeerNetwork (server is nil then).
	unserve func()

	mu      sync.Mutex
	clients map[peerKey]*api.PeerClient
	// peerTLS reads this agent's TLS files once for every peer client:
	// a client per member, thousands of them, each with its own parsed
	// CA, certificate and key, was most of an agent's heap.
	peerTLS *pki.PeerConfigs
	// targets is each member's target as last built (targetOf), reused
	// while its summary is the same one: a claim reads every member's.
	targets map[string]cachedTarget
	// avoid is the backoff of members whose peer API did not answer
	// (avoid.go).
	avoid *avoidance

	stopOnce sync.Once
	// joined turns true once a seed answered (or there is none to ask):
	// before that this agent's view may lack servers that hold claims.
	joined atomic.Bool
	// names is this agent's part in the name registry, once it runs.
	names atomic.Pointer[registry.Registry]
	// known is every server this agent has seen, kept on disk
	// (knownmembers.go).
	known *knownMembers
}

// PeerNetwork carries the peer API without sockets or TLS: an agent serves
// its peer handler on it and reaches the other agents through it. Tests use
// agent/claimtest's in-memory network; production uses mutual TLS.
type PeerNetwork interface {
	// Serve makes h reachable as node's peer API at the address it
	// returns; stop ends that.
	Serve(node string, h http.Handler) (addr string, stop func())
	// Transport carries node's requests to the others.
	Transport(node string) http.RoundTripper
}

// startCluster opens the peer listener and joins gossip. The caller joins
// the seeds (Join may wait for them).
func (a *Agent) startCluster() error {
	cfg := a.cfg
	files := pki.Files{CA: cfg.TLSCA, Cert: cfg.TLSCert, Key: cfg.TLSKey}
	if a.peerNet != nil {
		return a.startClusterOn(files)
	}
	srvTLS, err := pki.ServerConfig(files, pki.WithLogger(a.log))
	if err != nil {
		return fmt.Errorf("peer API TLS: %w", err)
	}
	ln := a.lns.peer // bound before any driver moved (listeners.go)
	c := &clusterState{a: a, files: files, ln: ln, clients: map[peerKey]*api.PeerClient{}, known: a.openKnownMembers()}
	c.avoid = newAvoidance(a.clk, c.bootOf, a.log.With("component", "peer-api"))

	gcfg := gossip.Config{
		NodeName:     cfg.NodeName,
		Join:         cfg.Join,
		KeyFile:      cfg.GossipKeyFile,
		Insecure:     cfg.InsecureGossip,
		Log:          a.log.With("component", "gossip"),
		Tune:         a.gossipTune,
		JoinRetryMax: 0,
	}
	host, port, err := net.SplitHostPort(cfg.GossipAddr)
	if err != nil {
		ln.Close()
		return fmt.Errorf("gossip_addr %q: %w", cfg.GossipAddr, err)
	}
	gcfg.BindAddr = host
	gcfg.BindPort, _ = strconv.Atoi(port)
	adv := cfg.AdvertiseAddr
	if adv == "" {
		ip, err := gossip.AdvertiseAddr(cfg.AdvertiseInterface)
		if err != nil {
			ln.Close()
			return err
		}
		adv = ip.String()
	}
	gcfg.AdvertiseAddr = adv
	_, pport, _ := net.SplitHostPort(ln.Addr().String())
	c.peerAddr = net.JoinHostPort(adv, pport)

	g, err := gossip.New(gcfg, c.summary)
	if err != nil {
		ln.Close()
		return err
	}
	c.g = g
	// The registry before the peer API serves: its handlers read a.names.
	if err := a.openRegistry(c); err != nil {
		_ = g.Shutdown()
		ln.Close()
		return err
	}
	c.server = &http.Server{
		Handler:           withCertCaller(api.NewPeerHandler(a, peerOwner{a}, a.log)),
		TLSConfig:         srvTLS,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       a.requestReadTimeout(),
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
		// Refused handshakes (no certificate, another CA) go to the log at
		// debug level: a scanner must not flood the journal.
		ErrorLog: slog.NewLogLogger(a.log.With("component", "peer-api").Handler(), slog.LevelDebug),
	}
	// Other agents' calls come over the peer wire; HTTP/2 and HTTP/1.1
	// stay for the callers that do not offer it.
	peerwire.Install(c.server, peerwire.Limits{
		MaxBodyBytes: api.MaxBodyBytes,
		ReadTimeout:  a.requestReadTimeout(),
		IdleTimeout:  2 * time.Minute,
	})
	go func() {
		if err := c.server.ServeTLS(ln, "", ""); err != nil && err != http.ErrServerClosed {
			a.log.Error("peer API stopped", "addr", cfg.PeerAddr, "err", err)
		}
	}()
	a.cluster = c
	a.log.Info("cluster: gossip and peer API up", "gossip", g.LocalAddr(), "peer_api", c.peerAddr)
	return nil
}

// startClusterOn is startCluster with the peer API on a.peerNet instead of
// a mutual-TLS listener.
func (a *Agent) startClusterOn(files pki.Files) error {
	cfg := a.cfg
	c := &clusterState{a: a, files: files, clients: map[peerKey]*api.PeerClient{}, known: a.openKnownMembers()}
	c.avoid = newAvoidance(a.clk, c.bootOf, a.log.With("component", "peer-api"))
	gcfg := gossip.Config{
		NodeName:      cfg.NodeName,
		Join:          cfg.Join,
		KeyFile:       cfg.GossipKeyFile,
		Insecure:      cfg.InsecureGossip,
		Log:           a.log.With("component", "gossip"),
		Tune:          a.gossipTune,
		JoinRetryMax:  0,
		AdvertiseAddr: cfg.AdvertiseAddr,
	}
	host, port, err := net.SplitHostPort(cfg.GossipAddr)
	if err != nil {
		return fmt.Errorf("gossip_addr %q: %w", cfg.GossipAddr, err)
	}
	gcfg.BindAddr = host
	gcfg.BindPort, _ = strconv.Atoi(port)
	addr, stop := a.peerNet.Serve(cfg.NodeName, api.NewPeerHandler(a, peerOwner{a}, a.log))
	c.peerAddr, c.unserve = addr, stop
	g, err := gossip.New(gcfg, c.summary)
	if err != nil {
		stop()
		return err
	}
	c.g = g
	a.cluster = c
	a.log.Info("cluster: gossip and peer API up", "gossip", g.LocalAddr(), "peer_api", c.peerAddr)
	return nil
}

// summary is what this server gossips: its capacity per model, from the
// ledger, which is the truth about it.
func (c *clusterState) summary() gossip.Summary {
	a := c.a
	s := gossip.Summary{
		AgentVersion: Version,
		PeerAddr:     c.peerAddr,
		Drained:      a.ServerDrained(),
		Revision:     a.ledger.Revision(),
		Boot:         a.boot,
	}
	if rs := c.names.Load(); rs != nil {
		s.Names = rs.Info()
	}
	for m, t := range a.ledger.Totals(a.clk.Now()) {
		s.Models = append(s.Models, gossip.ModelCapacity{Model: m, Total: clamp16(t.Total), Free: clamp16(t.Free), Healthy: clamp16(t.Healthy), Unusable: clamp16(t.Unusable)})
	}
	return s
}

func clamp16(n int) uint16 {
	if n > 0xffff {
		return 0xffff
	}
	if n < 0 {
		return 0
	}
	return uint16(n)
}

// peers is every other alive server whose summary this agent can read.
func (c *clusterState) peers() []claim.Target {
	ms := c.g.Members()
	out := make([]claim.Target, 0, len(ms))
	// One hold of the lock for every member: a claim reads them all.
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range ms {
		if askable(m) {
			out = append(out, c.targetOfLocked(m))
		}
	}
	return out
}

// askable reports whether member m is a peer a coordinator may ask: another
// alive server whose summary this agent can read, with a peer API.
func askable(m gossip.Member) bool {
	return !m.Self && m.Usable() && m.Summary.PeerAddr != ""
}

// homeMembership is the cluster as this agent's home reads it
// (home.Membership); a server alone has not joined one.
type homeMembership struct{ a *Agent }

func (m homeMembership) Joined() bool {
	c := m.a.cluster
	return c != nil && c.joined.Load()
}

// Peers names the servers of peers, without building their targets.
func (m homeMembership) Peers() []string {
	c := m.a.cluster
	if c == nil {
		return nil
	}
	var out []string
	for _, mb := range c.g.Members() {
		if askable(mb) {
			out = append(out, mb.Name)
		}
	}
	return out
}

// suspects is every other server gossip holds suspect (its probes went
// unanswered, it is not declared dead) whose last summary can be read: a
// placement asks them after every alive server (attempt.askSuspects).
func (c *clusterState) suspects() []claim.Target {
	var out []claim.Target
	ms := c.g.Members()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range ms {
		if m.Self || m.State != gossip.StateSuspect || m.SummaryErr != nil || m.Summary.PeerAddr == "" {
			continue
		}
		out = append(out, c.targetOfLocked(m))
	}
	return out
}

// cachedTarget is a member's target, and what it was built from: the same
// decoded summary (gossip never modifies one, it replaces it) and the same
// client give the same target.
type cachedTarget struct {
	models []gossip.ModelCapacity
	owner  api.Owner
	target claim.Target
}

// targetOfLocked is member m as a server to ask, with its gossiped
// capacity; c.mu is held. Every placement reads every member's; a member's
// target is built again only when its summary or its client changed.
func (c *clusterState) targetOfLocked(m gossip.Member) claim.Target {
	ms := m.Summary.Models
	owner := c.clientLocked(m.Name, m.Summary.PeerAddr)
	ct, ok := c.targets[m.Name]
	if ok && len(ms) > 0 && len(ct.models) == len(ms) && &ct.models[0] == &ms[0] &&
		ct.owner == owner && ct.target.Drained() == m.Summary.Drained {
		return ct.target
	}
	free := map[string]int{}
	caps := map[string]ledger.ModelTotals{}
	for _, mc := range ms {
		free[mc.Model] = int(mc.Free)
		caps[mc.Model] = ledger.ModelTotals{Total: int(mc.Total), Free: int(mc.Free), Healthy: int(mc.Healthy), Unusable: int(mc.Unusable)}
	}
	t := claim.NewTarget(m.Name, false, owner, free, m.Summary.Drained, caps)
	if _, broken := owner.(brokenOwner); broken {
		return t // built again next time, as its client may build then
	}
	if c.targets == nil {
		c.targets = map[string]cachedTarget{}
	}
	c.targets[m.Name] = cachedTarget{models: ms, owner: owner, target: t}
	return t
}

// unasked names the other members gossip knows now, other than those that
// left, that are not in asked: suspect or dead ones, and alive ones that
// were not in the view when the lookup began (the view read at the start of
// a lookup can be older than this one: an agent that just woke from a
// freeze) or whose summary cannot be used; and the servers this agent has
// seen before (knownmembers.go) that its gossip does not list now, as
// after a restart. Any of them may hold a claim nobody asked about.
func (c *clusterState) unasked(asked []string) []string {
	var out []string
	if !c.joined.Load() {
		out = append(out, "the rest of the cluster (not joined yet)")
	}
	for _, m := range c.g.Members() {
		if !m.Self && m.State != gossip.StateLeft && !slices.Contains(asked, m.Name) {
			out = append(out, m.Name)
		}
	}
	for _, n := range c.unseenKnown() {
		if !slices.Contains(asked, n) {
			out = append(out, n)
		}
	}
	return out
}

// peerKey names a peer client: a member at one address.
type peerKey struct{ name, addr string }

// client returns the peer client for a server, built once per address; the
// TLS configuration checks that the far end is that server.
func (c *clusterState) client(name, addr string) api.Owner {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.clientLocked(name, addr)
}

// clientLocked is client with c.mu held.
func (c *clusterState) clientLocked(name, addr string) api.Owner {
	key := peerKey{name, addr}
	if pc, ok := c.clients[key]; ok {
		return pc
	}
	if c.a.peerNet != nil {
		pc := api.NewPeerClientTransport(addr, c.avoid.transport(name, addr, c.a.peerNet.Transport(c.a.cfg.NodeName)), api.ReserveTimeout)
		c.clients[key] = pc
		return pc
	}
	if c.peerTLS == nil {
		p, err := pki.NewPeerConfigs(c.files, pki.WithLogger(c.a.log))
		if err != nil {
			return brokenOwner{err: fmt.Errorf("TLS client for %s: %w", name, err)}
		}
		c.peerTLS = p
	}
	cfg, err := c.peerTLS.For(name)
	if err != nil {
		return brokenOwner{err: fmt.Errorf("TLS client for %s: %w", name, err)}
	}
	pc := api.NewPeerClientTransport(addr, c.avoid.transport(name, addr, api.NewPeerTransport(cfg)), api.ReserveTimeout)
	c.clients[key] = pc
	return pc
}

// forgetGone drops what this agent keeps per member for the members that
// gossip no longer lists (removed, or forgotten after RememberDeparted):
// their peer clients, cached targets and backoffs; and a listed member's
// clients at addresses it no longer has (it moved, or restarted on another
// port). Without it every server that ever left, and every address a
// server ever had, stays in memory for the agent's life, each client with
// its idle connections. A member that comes back gets a client and a
// target built anew on first use. A member whose summary cannot be read
// (no address) keeps its clients. Closing a dropped client closes only its
// idle connections: a request in flight on it finishes.
func (c *clusterState) forgetGone(members []gossip.Member) {
	addrs := make(map[string]string, len(members))
	for _, m := range members {
		addrs[m.Name] = m.Summary.PeerAddr
	}
	var dropped []*api.PeerClient
	c.mu.Lock()
	for k, pc := range c.clients {
		if addr, listed := addrs[k.name]; !listed || addr != "" && addr != k.addr {
			delete(c.clients, k)
			dropped = append(dropped, pc)
		}
	}
	for name := range c.targets {
		if _, listed := addrs[name]; !listed {
			delete(c.targets, name)
		}
	}
	c.mu.Unlock()
	for _, pc := range dropped {
		pc.Close()
	}
	c.avoid.forgetUnless(func(name string) bool {
		_, listed := addrs[name]
		return listed
	})
}

// namesPeer is the peer client that carries registry requests to server
// at addr (registry.Deps.Peer), or why there is none.
func (c *clusterState) namesPeer(server, addr string) (registry.Peer, error) {
	switch o := c.client(server, addr).(type) {
	case *api.PeerClient:
		return o, nil
	case brokenOwner:
		return nil, o.err
	default:
		return nil, errors.New("no peer client")
	}
}

// State is node's state in this agent's gossip view, "" when the view
// does not hold it (registry.Cluster).
func (c *clusterState) State(node string) string {
	for _, m := range c.g.Members() {
		if m.Name == node {
			return m.State
		}
	}
	return ""
}

// Forget drops a member that is not alive from the gossip view
// (registry.Cluster).
func (c *clusterState) Forget(node string) { c.g.Forget(node) }

// ForgetKnown drops node from the servers this agent has seen
// (registry.Cluster, knownmembers.go).
func (c *clusterState) ForgetKnown(node string) { c.known.forget(node) }

// publish re-advertises this server's summary; it coalesces bursts.
func (c *clusterState) publish() {
	if err := c.g.Publish(); err != nil {
		c.a.log.Warn("gossip publish failed", "err", err)
	}
}

// stop leaves the cluster gracefully, then closes the listener. Only the
// first call does anything.
func (c *clusterState) stop(ctx context.Context) {
	c.stopOnce.Do(func() { c.doStop(ctx) })
}

func (c *clusterState) doStop(ctx context.Context) {
	if err := c.g.Leave(5 * time.Second); err != nil {
		c.a.log.Warn("gossip leave", "err", err)
	}
	if err := c.g.Shutdown(); err != nil {
		c.a.log.Warn("gossip shutdown", "err", err)
	}
	if c.unserve != nil {
		c.unserve()
	} else {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = c.server.Shutdown(sctx)
	}
	c.mu.Lock()
	for _, pc := range c.clients {
		pc.Close()
	}
	c.mu.Unlock()
}

// brokenOwner answers every call with the error that kept a client from
// being built, so the coordinator moves on to the next server.
type brokenOwner struct{ err error }

func (b brokenOwner) Reserve(context.Context, string, api.ReserveRequest) (api.Claim, error) {
	return api.Claim{}, b.err
}
func (b brokenOwner) Commit(context.Context, string) (api.Claim, error) { return api.Claim{}, b.err }
func (b brokenOwner) Abort(context.Context, string) (api.Claim, error)  { return api.Claim{}, b.err }
func (b brokenOwner) AbortReservation(context.Context, string) (api.Claim, error) {
	return api.Claim{}, b.err
}
func (b brokenOwner) Lookup(context.Context, string) (api.Claim, error) { return api.Claim{}, b.err }
func (b brokenOwner) List(context.Context) ([]api.Claim, error)         { return nil, b.err }
func (b brokenOwner) ResizeInPlace(context.Context, string, []api.Item) (api.Claim, error) {
	return api.Claim{}, b.err
}
func (b brokenOwner) LookupGroup(context.Context, string) (api.GroupRecord, error) {
	return api.GroupRecord{}, b.err
}
func (b brokenOwner) DeleteGroup(context.Context, string) (api.GroupRecord, error) {
	return api.GroupRecord{}, b.err
}
func (b brokenOwner) BeginClaim(context.Context, string, api.DirBegin) (api.DirAnswer, error) {
	return api.DirAnswer{}, b.err
}
func (b brokenOwner) LookupDirectory(context.Context, string) (api.DirAnswer, error) {
	return api.DirAnswer{}, b.err
}
func (b brokenOwner) UpdateDirectory(context.Context, api.DirUpdate) error { return b.err }
func (b brokenOwner) Capacity(context.Context) (api.Capacity, error)       { return api.Capacity{}, b.err }

// withCertCaller attaches the node name of the verified client certificate
// to every peer API request (api.CallerOf); the listener's TLS
// configuration refuses any request without one.
func withCertCaller(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if node, err := pki.PeerName(r); err == nil {
			r = r.WithContext(api.WithCaller(r.Context(), node))
		}
		h.ServeHTTP(w, r)
	})
}

// peerOwner is this server's owner as its peers reach it: a refusal of a
// reservation carries this server's capacity as it would gossip it now,
// which the coordinator puts into its view (gossip.Cluster.Learn) instead
// of waiting for gossip or running a full-state exchange with this server.
type peerOwner struct{ *Agent }

func (p peerOwner) Reserve(ctx context.Context, id string, req api.ReserveRequest) (api.Claim, error) {
	c, err := p.Agent.Reserve(ctx, id, req)
	var e *api.Error
	if cs := p.cluster; cs != nil && errors.As(err, &e) && e.Code == api.CodeNotAvailable {
		withSummary := *e
		withSummary.Summary = cs.g.LocalSummary()
		return c, &withSummary
	}
	return c, err
}
