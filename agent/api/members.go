package api

import (
	"context"
	"log/slog"
	"net/http"
)

// MemberRemover declares a server gone for good (gpuherd members remove).
// Only the local socket serves it: removing a member is an operator's
// act, never one agent's request to another.
type MemberRemover interface {
	RemoveMember(ctx context.Context, node string, force bool) (MemberRemoval, error)
}

// MemberRemoveRequest is the body of DELETE /v1/members/{node}; it may be
// left out.
type MemberRemoveRequest struct {
	// Force removes a member that gossip still sees alive or suspect.
	Force bool `json:"force,omitempty"`
}

// MemberRemoval is what removing a server did.
type MemberRemoval struct {
	Node string `json:"node"`
	// Lost are the claim IDs held on the server: they are listed as lost
	// until released; their GPUs went with the server.
	Lost []string `json:"lost"`
	// LostGroups are the node-group names held on the server.
	LostGroups []string `json:"lost_groups,omitempty"`
	// Dropped are the names the server was placing (nothing was committed
	// under them); they are free again.
	Dropped []string `json:"dropped,omitempty"`
	// State is the server's state in gossip when it was removed.
	State string `json:"state"`
	// RegistryServer: the server was one of the name registry's servers
	// and was taken out of its configuration.
	RegistryServer bool `json:"registry_server,omitempty"`
	// Warnings say what the operator should do next.
	Warnings []string `json:"warnings,omitempty"`
}

// memberRoutes adds DELETE /v1/members/{node}.
func memberRoutes(m MemberRemover, mux *http.ServeMux, log *slog.Logger) {
	h := &handler{log: log}
	mux.HandleFunc("DELETE /"+Version+"/members/{node}", func(w http.ResponseWriter, r *http.Request) {
		var req MemberRemoveRequest
		if r.ContentLength != 0 {
			if err := decode(w, r, &req); err != nil {
				h.reply(w, r, nil, err)
				return
			}
		}
		v, err := m.RemoveMember(r.Context(), r.PathValue("node"), req.Force)
		h.reply(w, r, v, err)
	})
}

// RemoveMember declares node gone for good; force removes it even while
// gossip sees it alive.
func (c *Client) RemoveMember(ctx context.Context, node string, force bool) (MemberRemoval, error) {
	var v MemberRemoval
	var body any
	if force {
		body = MemberRemoveRequest{Force: true}
	}
	return v, c.do(ctx, http.MethodDelete, "/members/"+segment(node), body, &v)
}

// NotJoinedNode stands for the servers an agent has not heard of because
// its gossip has not joined yet.
const NotJoinedNode = "the rest of the cluster"

// UnseenReason is why a known server that gossip does not list is missing.
const UnseenReason = "not asked: this agent has seen it before and its gossip does not list it now (not heard of since this agent started, or gone for longer than gossip remembers); what it holds is missing"
