package api

import (
	"context"
	"net/http"

	"github.com/gpuherd/gpuherd/agent/names"
)

// NameServer is an agent's part in the name registry, as the peer API
// carries it (POST /v1/peer/names): one names.Request in, one
// names.Response out. *agent.Agent is the real one.
type NameServer interface {
	ServeNames(ctx context.Context, req names.Request) names.Response
}

// CodeForbidden: the caller may not make this call (403).
const CodeForbidden = "forbidden"

// operatorOps are the registry operations no agent needs for its own
// claims: an operator's `members remove` or voter changes, relayed by the
// agent the operator asked. They are carried, and audited.
var operatorOps = map[names.Op]bool{
	names.OpRemoveMember: true, names.OpAddVoter: true, names.OpAddNonVoter: true,
	names.OpRemoveServer: true, names.OpExpire: true,
}

// nameRoutes serves the registry to other agents. Identity comes only from
// the transport (CallerOf): the caller of an acquire, the owner of a
// confirm and the holder of a release are the calling node, whatever the
// body says, so no agent can place, commit or free a name as another.
func nameRoutes(n NameServer, mux *http.ServeMux, h *handler) {
	mux.HandleFunc("POST /"+Version+"/peer/names", func(w http.ResponseWriter, r *http.Request) {
		caller, ok := CallerOf(r.Context())
		if !ok {
			writeError(w, &Error{Status: http.StatusForbidden, Code: CodeForbidden,
				Message: "the name registry answers only agents of the cluster: the call carries no verified node identity"})
			return
		}
		var req names.Request
		if err := decode(w, r, &req); err != nil {
			h.reply(w, r, nil, err)
			return
		}
		req = Attribute(req, caller)
		if operatorOps[req.Op] {
			h.log.Warn("name registry operation relayed by another agent", "op", req.Op, "caller", caller, "node", req.Node, "address", req.Address)
		}
		h.reply(w, r, n.ServeNames(r.Context(), req), nil)
	})
}

// Attribute sets the node names of req that say who acts to caller, the
// verified identity of the agent that sent it: the caller of an acquire,
// the owner of a confirm, the holder of a release.
func Attribute(req names.Request, caller string) names.Request {
	switch req.Op {
	case names.OpAcquire:
		req.Caller = caller
	case names.OpConfirm:
		req.Owner = caller
	case names.OpRelease:
		req.Node = caller
	}
	return req
}

// Names carries a registry request to the agent at the other end.
func (p *PeerClient) Names(ctx context.Context, req names.Request) (names.Response, error) {
	var v names.Response
	return v, p.c.do(ctx, http.MethodPost, "/peer/names", req, &v)
}
