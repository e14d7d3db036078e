package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/gossip"
)

// Members that are gone for good (docs/protocol.md, "Removing a server").
// A dead member is not a removed one: its claims, and the VMs on them, may
// come back with it, so its names stay held on it and a lookup of one of
// them answers "unavailable", naming it. Only an operator can say that a
// server will not come back: `gpuherd members remove NODE` marks the names
// it held lost, drops those it was placing, and forgets it here. A lost
// claim is listed by `claims` (state lost, on its server), answered by get
// with 410 lost, and freed by release; its GPUs went with the server.

// Service answers the calls that reach the registry through this agent's
// APIs: a registry request another agent relays (ServeNames) and an
// operator's removal of a member (RemoveMember).
type Service struct {
	node     string
	names    func() Authority
	registry func() *Registry
	cluster  func() Cluster
	log      *slog.Logger
}

var (
	_ api.MemberRemover = (*Service)(nil)
	_ api.NameServer    = (*Service)(nil)
)

// NewService builds the registry's API calls over d.
func NewService(d ServiceDeps) *Service {
	return &Service{node: d.Node, names: d.Names, registry: d.Registry, cluster: d.Cluster, log: d.Log}
}

// ServeNames answers another agent's registry request (POST
// /v1/peer/names); the API has already set who acts from the caller's
// certificate (api.Attribute).
func (s *Service) ServeNames(ctx context.Context, body json.RawMessage) (any, error) {
	var req names.Request
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, api.Invalid("", "name registry request: %v", err)
	}
	rs := s.registry()
	if rs == nil {
		// An injected registry server (WithNames) serves the route as the
		// agent's own would.
		if srv, ok := s.names().(namesServer); ok {
			return srv.Serve(ctx, req), nil
		}
		return names.Response{Error: &names.WireError{Code: names.WireNotLeader, Message: s.node + " runs no name registry"}}, nil
	}
	return rs.reg.Load().Serve(ctx, req), nil
}

// namesServer is an authority that answers registry requests relayed from
// other agents: *names.Registry, when a test or a benchmark gives each
// agent its own with WithNames.
type namesServer interface {
	Serve(ctx context.Context, req names.Request) names.Response
}

// registryServers is what the real name registry (*names.Registry) offers
// beyond NameAuthority about its own servers: a removed member that was
// one of them leaves the registry's raft configuration too.
type registryServers interface {
	IsServer(node string) bool
	RemoveServer(ctx context.Context, id string) error
}

// RemoveMember declares node gone for good. A member gossip still sees
// alive or suspect is refused unless force: a server that still runs keeps
// its claims, and removing it would list them as lost while its VMs use
// them.
func (s *Service) RemoveMember(ctx context.Context, node string, force bool) (api.MemberRemoval, error) {
	switch {
	case !IsServerName(node):
		short := node
		if len(short) > 64 {
			short = short[:64] + "…"
		}
		return api.MemberRemoval{}, api.Invalid("node", "%q is not a server name: 1 to %d printable characters without spaces", short, ledger.MaxCoordinatorLen)
	case node == s.node:
		return api.MemberRemoval{}, api.Invalid("node", "%s is this server; stop it, then run members remove on another server", node)
	}
	cluster := s.cluster()
	if cluster == nil {
		return api.MemberRemoval{}, api.Invalid("node", "this server runs alone (no gossip_addr): it has no members to remove")
	}
	authority := s.names()
	if authority == nil {
		return api.MemberRemoval{}, api.Invalid("node", "this agent runs without the name registry, where a removal is recorded; run members remove on an agent that has it")
	}
	state := cluster.State(node)
	if (state == gossip.StateAlive || state == gossip.StateSuspect) && !force {
		return api.MemberRemoval{}, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("%s is %s in gossip: a server that still runs keeps its claims and the VMs on them; stop it and wait until members shows it dead, or remove it anyway with --force", node, state)}
	}
	changed, err := authority.RemoveMember(ctx, node)
	if err != nil {
		return api.MemberRemoval{}, apiError(fmt.Sprintf("removing %s", node), err)
	}
	// Every name held on node is lost now, including those an earlier
	// removal marked: a repeat says the same.
	listing, err := authority.List(ctx, names.Filter{Owner: node, State: names.StateLost}, names.Linearizable)
	if err != nil {
		return api.MemberRemoval{}, apiError(fmt.Sprintf("%s was removed, but listing the names it held", node), err)
	}
	out := api.MemberRemoval{Node: node, State: state, Lost: []string{}}
	if out.State == "" {
		out.State = "unknown"
	}
	lost := map[names.Key]bool{}
	for _, r := range listing.Records {
		lost[r.Key()] = true
		if r.Kind == names.KindGroup {
			out.LostGroups = append(out.LostGroups, r.Name)
		} else {
			out.Lost = append(out.Lost, r.Name)
		}
	}
	if listing.Truncated {
		out.Warnings = append(out.Warnings, fmt.Sprintf("%s held more names than one answer lists; gpuherd claims lists every lost claim", node))
	}
	for _, k := range changed {
		if !lost[k] {
			out.Dropped = append(out.Dropped, k.Name)
		}
	}
	if wasServer, err := s.removeVoter(ctx, node); err != nil {
		return api.MemberRemoval{}, apiError(fmt.Sprintf("%s's names are lost now (%d claims), but taking it out of the name registry's servers", node, len(out.Lost)), err)
	} else if wasServer {
		out.RegistryServer = true
		out.Warnings = append(out.Warnings, fmt.Sprintf("%s was a server of the name registry and is one no more: add a replacement (docs/names.md) so that the registry keeps tolerating the loss of a server", node))
	}
	if state != gossip.StateAlive && state != gossip.StateSuspect {
		cluster.Forget(node)
	}
	// Not a server of the cluster any more: listings stop waiting for it.
	cluster.ForgetKnown(node)
	if state == "" && len(changed) == 0 && len(listing.Records) == 0 {
		out.Warnings = append(out.Warnings, fmt.Sprintf("this agent's gossip does not know %s and the name registry holds no names on it: check the server's name", node))
	}
	if len(out.Lost) > 0 {
		out.Warnings = append(out.Warnings, "release each lost claim (gpuherd release ID) once its VM is placed elsewhere: the ID stays taken until then")
	}
	s.log.Warn("member removed for good", "node", node, "gossip_state", out.State, "forced", force,
		"lost_claims", out.Lost, "lost_groups", out.LostGroups, "dropped", out.Dropped, "registry_server", out.RegistryServer)
	return out, nil
}

// removeVoter takes node out of the registry's voters (Registry.RemoveVoter)
// and reports whether it was one. An injected authority (tests) is asked
// through registryServers.
func (s *Service) removeVoter(ctx context.Context, node string) (bool, error) {
	rs := s.registry()
	if rs == nil {
		if srv, ok := s.names().(registryServers); ok && srv.IsServer(node) {
			return true, srv.RemoveServer(ctx, node)
		}
		return false, nil
	}
	return rs.RemoveVoter(ctx, node)
}

// IsServerName reports whether name can be a server's name.
func IsServerName(name string) bool {
	return name != "" && len(name) <= ledger.MaxCoordinatorLen &&
		!strings.ContainsFunc(name, func(r rune) bool { return r < 0x21 || r == 0x7f })
}

// apiError is the API's answer for a name registry error: a
// retryable 503 naming the registry servers that did not answer, or the
// registry's refusal.
func apiError(what string, err error) error {
	var re *names.RefusedError
	switch {
	case names.IsUnavailable(err):
		return &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("%s: %v", what, err)}
	case errors.As(err, &re) && re.Code == names.CodeInvalid:
		return api.Invalid("", "%s: %s", what, re.Detail)
	}
	return fmt.Errorf("%s: %w", what, err)
}
