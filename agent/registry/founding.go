package registry

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/gossip"
)

// How a cluster without names_voters gets its registry (docs/names.md,
// "Voters in a cluster"): an agent with no raft state never founds one
// while any member knows a registry; once it has joined and the alive
// membership has stayed the same for directory_settle (at most
// Config.FoundingSettle), the member that names.ChooseVoters puts first
// asks every member it knows (alive, suspect or dead; not those that
// left) whether it knows a registry and, only if all answer no, founds one
// with itself as its only voter. The leader then adds voters, in
// ChooseVoters order, until there are names_bootstrap_expect.

// Tick is how often the agent looks at its registry and gossip.
const Tick = 250 * time.Millisecond

// DefaultFoundingSettle caps how long the alive membership must stay the
// same before the founder asks (directory_settle when shorter; see
// Config.FoundingSettle). Gossip settles a join within a few probe rounds;
// the founder's question to every member, not this wait, is what keeps
// two founders apart, and the first claims of a new cluster wait for the
// founding.
const DefaultFoundingSettle = 2 * time.Second

// askTimeout bounds the founder's status question to one member.
const askTimeout = 2 * time.Second

// founding is the founder's wait for a steady membership.
type founding struct {
	sig     string    // the alive membership last seen
	since   time.Time // since when it is unchanged
	nextAsk time.Time // after a failed round of questions
}

func (f *founding) reset() { *f = founding{} }

func (rs *Registry) run() {
	defer rs.wg.Done()
	changes, unsubscribe := rs.gossip.Subscribe()
	defer unsubscribe()
	t := rs.clk.NewTicker(Tick)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-rs.stop
		cancel()
	}()
	var f founding
	for {
		select {
		case <-rs.stop:
			return
		case <-changes:
		case <-t.C():
		}
		rs.step(ctx, &f)
	}
}

// step does whatever the registry needs now: tell gossip what changed,
// learn the registry's ID, watch for a second registry, and, without
// names_voters, found the registry or grow its voters.
func (rs *Registry) step(ctx context.Context, f *founding) {
	reg := rs.reg.Load()
	rs.adoptID(reg)
	rs.republish()
	rs.checkSplit()
	if !rs.auto || reg.Raft() == nil {
		return
	}
	switch {
	case !reg.HasState():
		rs.found(ctx, f)
	case reg.IsLeader():
		f.reset()
		rs.grow(ctx, reg)
	default:
		f.reset()
	}
}

// Info is what this agent gossips about its part in the registry.
func (rs *Registry) Info() gossip.NamesInfo {
	reg := rs.reg.Load()
	if reg == nil {
		return gossip.NamesInfo{Addr: rs.addr}
	}
	st := reg.Status()
	return gossip.NamesInfo{Addr: rs.addr, Role: st.Role, Leader: reg.IsLeader(), Registry: st.Registry}
}

// republish re-advertises this agent's summary when its registry part
// changed (a new leader, a role, an ID).
func (rs *Registry) republish() {
	info := rs.Info()
	rs.mu.Lock()
	changed := info != rs.published
	rs.published = info
	rs.mu.Unlock()
	if changed {
		rs.publish()
	}
}

// adoptID learns the ID of the registry this server belongs to from its
// leader's gossip, when it was added rather than founding it.
func (rs *Registry) adoptID(reg *names.Registry) {
	if reg.ID() != "" || !reg.HasState() {
		return
	}
	leader := reg.Leader()
	for _, m := range rs.members() {
		if m.Name == leader && !m.Self && m.Summary.Names.Registry != "" {
			if err := reg.AdoptID(m.Summary.Names.Registry); err != nil {
				rs.log.Warn("name registry: cannot record the registry's ID", "registry", m.Summary.Names.Registry, "err", err)
			}
			return
		}
	}
}

// knowsRegistry reports whether a member's gossip shows it in a registry.
func knowsRegistry(n gossip.NamesInfo) bool {
	return n.Registry != "" || n.Leader || n.Role == gossip.NamesVoter || n.Role == gossip.NamesNonVoter
}

// found founds the registry when this agent is the founder and no member
// knows one (see the comment at the top of this file).
func (rs *Registry) found(ctx context.Context, f *founding) {
	self := rs.cfg.Node
	if !rs.joined() {
		f.reset()
		return
	}
	// alive choose the founder; others are asked. A member that is
	// suspect or dead is asked too, and so postpones the founding until
	// it answers or is gone for good: it may be on the other side of a
	// partition, about to found a registry of its own.
	var alive, others []string
	for _, m := range rs.members() {
		if m.State == gossip.StateLeft {
			continue
		}
		if !m.Self && knowsRegistry(m.Summary.Names) {
			f.reset() // a registry exists: its leader adds this agent
			return
		}
		if !m.Self {
			others = append(others, m.Name)
		}
		if m.State == gossip.StateAlive && (m.Self || m.Summary.Names.Addr != "") {
			alive = append(alive, m.Name)
		}
	}
	if !slices.Contains(alive, self) {
		alive = append(alive, self)
	}
	slices.Sort(alive)
	now := rs.clk.Now()
	if sig := strings.Join(alive, ","); sig != f.sig {
		f.sig, f.since = sig, now
	}
	settle := min(rs.cfg.DirectorySettle, rs.cfg.FoundingSettle)
	if now.Sub(f.since) < settle || now.Before(f.nextAsk) {
		return
	}
	if names.ChooseVoters(alive, 1)[0] != self {
		return
	}
	if who, ok := rs.askAll(ctx, others); !ok {
		rs.log.Info("name registry not founded yet", "reason", who)
		f.nextAsk = now.Add(settle + time.Second)
		return
	}
	reg := rs.reg.Load()
	id := names.FounderID(self, now)
	if err := reg.Bootstrap([]names.Server{{ID: self, Address: rs.addr}}, id); err != nil {
		rs.log.Error("name registry: founding failed", "err", err)
		f.nextAsk = now.Add(settle + time.Second)
		return
	}
	rs.log.Info("founded the name registry; its leader adds voters as members join", "registry", id, "members", len(alive),
		"voters_wanted", rs.cfg.Expect)
}

// askAll asks every other member it knows whether it knows a registry; ok
// only when all answered and none does. Otherwise it says why.
func (rs *Registry) askAll(ctx context.Context, others []string) (string, bool) {
	type answer struct {
		node string
		why  string
	}
	ch := make(chan answer, len(others))
	for _, n := range others {
		go func() {
			actx, cancel := context.WithTimeout(ctx, askTimeout)
			defer cancel()
			resp, err := rs.Forward(actx, n, names.Request{Op: names.OpStatus})
			switch {
			case err != nil:
				ch <- answer{n, n + " did not answer: " + err.Error()}
			case resp.Status == nil:
				ch <- answer{n, n + " answered without a registry status (an older agent?)"}
			case resp.Status.HasState || resp.Status.Registry != "":
				ch <- answer{n, n + " knows registry " + resp.Status.Registry}
			default:
				ch <- answer{n, ""}
			}
		}()
	}
	var why []string
	for range others {
		if a := <-ch; a.why != "" {
			why = append(why, a.why)
		}
	}
	slices.Sort(why)
	return strings.Join(why, "; "), len(why) == 0
}

// grow adds voters, on the leader, until the registry has
// names_bootstrap_expect: alive members that run raft and belong to no
// other registry, in ChooseVoters order. One per step: each waits for the
// new voter to catch up.
func (rs *Registry) grow(ctx context.Context, reg *names.Registry) {
	voters := reg.Voters()
	if len(voters) >= rs.cfg.Expect {
		return
	}
	id := reg.ID()
	addrs := map[string]string{}
	var cands []string
	for _, m := range rs.members() {
		n := m.Summary.Names
		if m.State != gossip.StateAlive || n.Addr == "" || (n.Registry != "" && n.Registry != id) {
			continue
		}
		if n.Role != gossip.NamesStandby && n.Role != gossip.NamesNonVoter && n.Role != gossip.NamesVoter {
			continue
		}
		cands = append(cands, m.Name)
		addrs[m.Name] = n.Addr
	}
	for _, n := range names.RankVoters(cands) {
		if slices.ContainsFunc(voters, func(s names.Server) bool { return s.ID == n }) {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := reg.AddVoter(actx, n, addrs[n])
		cancel()
		if err != nil {
			rs.log.Warn("name registry: adding a voter failed; trying again", "node", n, "err", err)
			return
		}
		rs.log.Info("added a voter to the name registry", "node", n, "voters", len(voters)+1, "voters_wanted", rs.cfg.Expect)
		return
	}
}

// checkSplit looks for a second registry: two gossip islands that each
// founded one and then met. Nothing merges them; the operator is told
// (log, gpuherd_names_registries) and docs/names.md says what to do.
func (rs *Registry) checkSplit() {
	by := map[string][]string{}
	for _, m := range rs.members() {
		if m.State == gossip.StateAlive && m.Summary.Names.Registry != "" {
			by[m.Summary.Names.Registry] = append(by[m.Summary.Names.Registry], m.Name)
		}
	}
	if id := rs.reg.Load().ID(); id != "" && !slices.Contains(by[id], rs.cfg.Node) {
		by[id] = append(by[id], rs.cfg.Node)
	}
	ids := make([]string, 0, len(by))
	for id := range by {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	rs.mu.Lock()
	same := slices.Equal(ids, rs.registries)
	rs.registries = ids
	rs.mu.Unlock()
	if same || len(ids) < 2 {
		return
	}
	args := []any{"registries", ids}
	for _, id := range ids {
		slices.Sort(by[id])
		args = append(args, id, strings.Join(by[id], ","))
	}
	rs.log.Error("two name registries in one cluster: gossip islands founded one each; names may be held twice. "+
		"Stop the agents of the smaller one, remove their names_dir, set names_voters, and start them again (docs/names.md)", args...)
}

// Registries is how many registries the last look at gossip found: more
// than one is a split.
func (rs *Registry) Registries() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return len(rs.registries)
}
