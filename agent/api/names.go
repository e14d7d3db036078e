package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
)

// The name registry's requests travel on the peer API
// (POST /v1/peer/names) as the JSON of agent/names.Request, answered by
// the JSON of agent/names.Response. This layer reads only what it must
// to set who acts, so the wire types stay the registry's own.

// NameServer is an agent's part in the name registry as the peer API
// carries it. *agent.Agent is the real one.
type NameServer interface {
	// ServeNames answers one request: body is a names.Request in JSON in
	// which the route has set the acting node to the caller. The answer
	// is encoded as JSON; an *Error is answered as such, unserved.
	ServeNames(ctx context.Context, body json.RawMessage) (any, error)
}

// actingField is, per registry operation, the field that names the node
// that acts: the caller of an acquire, the owner of a confirm, the holder
// of a release (agent/names.Op values).
// A confirm acts as its caller: its owner, when the body names another
// node, is refused by the registry unless the caller started that name's
// move (a coordinator putting a name back).
var actingField = map[string]string{"acquire": "caller", "confirm": "caller", "hold": "owner", "release": "node"}

// operatorOps are the registry operations no agent needs for its own
// claims: an operator's `members remove` or voter changes, relayed by the
// agent the operator asked. They are carried, and audited.
var operatorOps = map[string]bool{"remove_member": true, "add_voter": true, "add_nonvoter": true, "remove_server": true, "expire": true}

// nameRoutes serves the registry to other agents. Identity comes only from
// the transport (CallerOf): whatever the body says, the acting node is the
// calling node, so no agent can place, commit or free a name as another.
func nameRoutes(n NameServer, mux *http.ServeMux, h *handler) {
	mux.HandleFunc("POST /"+Version+"/peer/names", func(w http.ResponseWriter, r *http.Request) {
		caller, ok := CallerOf(r.Context())
		if !ok {
			writeError(w, &Error{Status: http.StatusForbidden, Code: CodeForbidden,
				Message: "the name registry answers only agents of the cluster: the call carries no verified node identity"})
			return
		}
		var req map[string]json.RawMessage
		if err := decode(w, r, &req); err != nil {
			h.reply(w, r, nil, err)
			return
		}
		op, err := Attribute(req, caller)
		if err != nil {
			h.reply(w, r, nil, err)
			return
		}
		if operatorOps[op] {
			h.log.Warn("name registry operation relayed by another agent", "op", op, "caller", caller,
				"node", rawString(req["node"]), "address", rawString(req["address"]))
		}
		body, err := json.Marshal(req)
		if err != nil {
			h.reply(w, r, nil, err)
			return
		}
		v, err := n.ServeNames(r.Context(), body)
		h.reply(w, r, v, err)
	})
}

// Attribute sets, in a registry request's JSON fields, the node that acts
// to caller (the verified identity of the agent that sent it) and returns
// the operation. Keys must be as the registry writes them, lower case, so
// that no variant of a field's name can slip past the one set here.
func Attribute(req map[string]json.RawMessage, caller string) (string, error) {
	for k := range req {
		if strings.ToLower(k) != k {
			return "", Invalid(k, "registry request fields are lower case")
		}
	}
	op := rawString(req["op"])
	if op == "" {
		return "", Invalid("op", "a registry request names its operation")
	}
	if f, ok := actingField[op]; ok {
		b, _ := json.Marshal(caller)
		req[f] = b
		if op == "confirm" && rawString(req["owner"]) == "" {
			req["owner"] = b
		}
	}
	return op, nil
}

// rawString is a JSON string's value, "" when it is not one.
func rawString(v json.RawMessage) string {
	var s string
	if json.Unmarshal(v, &s) != nil {
		return ""
	}
	return s
}

// Names carries a registry request to the agent at the other end and
// decodes its answer into resp.
func (p *PeerClient) Names(ctx context.Context, req, resp any) error {
	return p.c.do(ctx, http.MethodPost, "/peer/names", req, resp)
}
