package api

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"time"

	"github.com/gpuherd/gpuherd/agent/api/peerwire"
)

// ReserveRequest is a coordinator asking the owning server to reserve GPUs
// for a claim under a lease. Items carry canonical model names.
type ReserveRequest struct {
	Items       []Item            `json:"items"`
	Labels      map[string]string `json:"labels,omitempty"`
	Coordinator string            `json:"coordinator"`
	// Token is the name registry's grant of the claim ID to this
	// placement (a resize's move); the owner confirms it before it
	// commits (docs/names.md). 0 otherwise.
	Token uint64 `json:"token,omitempty"`
	// Commit asks the owner to commit the reservation at once, in the
	// same call: for a coordinator with nothing to check between the two
	// (a claim whose ID the owner holds in the name registry at commit).
	// The answer is the committed claim; or the reservation, still to be
	// committed, when the commit could not be decided now (the registry
	// did not answer); or the commit's refusal, its reservation dropped.
	Commit bool `json:"commit,omitempty"`
	// Recall, with Commit: the owner holds the claim ID only if it did not
	// last run on another server within its remember_released (a claim
	// placed without any_node or a server named); otherwise it drops the
	// reservation and answers go_back naming that server.
	Recall bool `json:"recall,omitempty"`
	// Devices pins the reservation to these GPUs (sorted PCI addresses):
	// exactly them or nothing (ClaimRequest.Devices).
	Devices []string `json:"devices,omitempty"`
}

// Owner is what a server offers coordinators for its own GPUs: the one
// place where a claim on it is decided. Every call is idempotent by ID.
type Owner interface {
	Reserve(ctx context.Context, id string, req ReserveRequest) (Claim, error)
	Commit(ctx context.Context, id string) (Claim, error)
	// Abort drops a claim of this server whatever its state (release of a
	// committed claim, or abort of a reservation).
	Abort(ctx context.Context, id string) (Claim, error)
	// AbortReservation drops a reservation only: a claim committed under
	// the ID (by a concurrent coordinator) stays, and the answer is a
	// conflict. What a coordinator sends after a reserve it cannot confirm.
	AbortReservation(ctx context.Context, id string) (Claim, error)
	Lookup(ctx context.Context, id string) (Claim, error)
	List(ctx context.Context) ([]Claim, error)
	// ResizeInPlace changes a committed claim in place; *Error not_available when
	// this server cannot hold the new request.
	ResizeInPlace(ctx context.Context, id string, items []Item) (Claim, error)
	// LookupGroup and DeleteGroup reach the group records this server keeps.
	LookupGroup(ctx context.Context, name string) (GroupRecord, error)
	DeleteGroup(ctx context.Context, name string) (GroupRecord, error)
}

// peerRoutes routes the owner operations for coordinators.
func peerRoutes(o Owner, mux *http.ServeMux, h *handler) {
	p := "/" + Version + "/peer"
	mux.HandleFunc("PUT "+p+"/reservations/{id}", func(w http.ResponseWriter, r *http.Request) {
		var req ReserveRequest
		if err := decode(w, r, &req); err != nil {
			h.reply(w, r, nil, err)
			return
		}
		if err := ownName(r, "coordinator", &req.Coordinator); err != nil {
			h.reply(w, r, nil, err)
			return
		}
		v, err := o.Reserve(r.Context(), r.PathValue("id"), req)
		h.reply(w, r, v, err)
	})
	mux.HandleFunc("POST "+p+"/reservations/{id}/commit", func(w http.ResponseWriter, r *http.Request) {
		v, err := o.Commit(r.Context(), r.PathValue("id"))
		h.reply(w, r, v, err)
	})
	mux.HandleFunc("DELETE "+p+"/reservations/{id}", func(w http.ResponseWriter, r *http.Request) {
		v, err := o.AbortReservation(r.Context(), r.PathValue("id"))
		h.reply(w, r, v, err)
	})
	mux.HandleFunc("DELETE "+p+"/claims/{id}", func(w http.ResponseWriter, r *http.Request) {
		ctx, err := releaseContext(w, r)
		if err != nil {
			h.reply(w, r, nil, err)
			return
		}
		v, err := o.Abort(ctx, r.PathValue("id"))
		h.reply(w, r, v, err)
	})
	mux.HandleFunc("GET "+p+"/claims/{id}", func(w http.ResponseWriter, r *http.Request) {
		v, err := o.Lookup(r.Context(), r.PathValue("id"))
		h.reply(w, r, v, err)
	})
	mux.HandleFunc("GET "+p+"/claims", func(w http.ResponseWriter, r *http.Request) {
		v, err := o.List(r.Context())
		h.reply(w, r, v, err)
	})
	mux.HandleFunc("POST "+p+"/claims/{id}/resize", func(w http.ResponseWriter, r *http.Request) {
		var req ResizeRequest
		if err := decode(w, r, &req); err != nil {
			h.reply(w, r, nil, err)
			return
		}
		v, err := o.ResizeInPlace(r.Context(), r.PathValue("id"), req.GPUs)
		h.reply(w, r, v, err)
	})
	mux.HandleFunc("GET "+p+"/groups/{name}", func(w http.ResponseWriter, r *http.Request) {
		v, err := o.LookupGroup(r.Context(), r.PathValue("name"))
		h.reply(w, r, v, err)
	})
	mux.HandleFunc("DELETE "+p+"/groups/{name}", func(w http.ResponseWriter, r *http.Request) {
		v, err := o.DeleteGroup(r.Context(), r.PathValue("name"))
		h.reply(w, r, v, err)
	})
	if d, ok := o.(Directory); ok {
		directoryRoutes(d, mux, h)
	}
	if n, ok := o.(NameServer); ok {
		nameRoutes(n, mux, h)
	}
}

// PeerClient is a coordinator's connection to one owner, over HTTPS with
// mutual TLS. It implements Owner.
type PeerClient struct {
	c *Client
}

var _ Owner = (*PeerClient)(nil)

// NewPeerClient talks to the owner's peer API at addr (host:port) with the
// given TLS configuration (which must verify the owner's identity).
func NewPeerClient(addr string, cfg *tls.Config, timeout time.Duration) *PeerClient {
	return NewPeerClientTransport(addr, NewPeerTransport(cfg), timeout)
}

// PeerConnectTimeout bounds connecting to another agent's peer API, TCP
// and TLS handshake together: an agent that answers at all answers that
// within milliseconds, and an address that never answers must cost a
// coordinator about a second, not a whole call's timeout.
const PeerConnectTimeout = time.Second

// NewPeerTransport is the mutual-TLS transport to other agents' peer APIs
// with cfg (which must verify the far end's identity): the peer wire
// (agent/api/peerwire) to agents that offer it, HTTP/2 to the others.
func NewPeerTransport(cfg *tls.Config) http.RoundTripper {
	h2 := &http.Transport{
		TLSClientConfig:     cfg,
		DialContext:         (&net.Dialer{Timeout: PeerConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: PeerConnectTimeout,
	}
	return peerwire.NewTransport(cfg, h2, PeerConnectTimeout)
}

// NewPeerClientTransport returns a client for the owner at addr that sends
// its requests through rt instead of a mutual-TLS connection: tests carry
// the peer API in memory this way (agent/claimtest).
func NewPeerClientTransport(addr string, rt http.RoundTripper, timeout time.Duration) *PeerClient {
	return &PeerClient{c: &Client{
		base:    "https://" + addr,
		target:  addr,
		http:    &http.Client{Transport: rt},
		timeout: timeout,
	}}
}

// Close releases idle connections.
func (p *PeerClient) Close() { p.c.Close() }

// Reserve asks the owner to reserve and bind.
func (p *PeerClient) Reserve(ctx context.Context, id string, req ReserveRequest) (Claim, error) {
	var v Claim
	return v, p.c.do(ctx, http.MethodPut, "/peer/reservations/"+segment(id), req, &v)
}

// Commit makes the owner's reservation a claim.
func (p *PeerClient) Commit(ctx context.Context, id string) (Claim, error) {
	var v Claim
	return v, p.c.do(ctx, http.MethodPost, "/peer/reservations/"+segment(id)+"/commit", nil, &v)
}

// Abort drops the claim on the owner.
func (p *PeerClient) Abort(ctx context.Context, id string) (Claim, error) {
	var v Claim
	return v, p.c.do(ctx, http.MethodDelete, "/peer/claims/"+segment(id), releaseBody(ctx), &v)
}

// AbortReservation drops the owner's reservation, never a committed claim.
// An owner older than this call answers 404 (no such endpoint), which
// leaves the reservation to its lease.
func (p *PeerClient) AbortReservation(ctx context.Context, id string) (Claim, error) {
	var v Claim
	return v, p.c.do(ctx, http.MethodDelete, "/peer/reservations/"+segment(id), nil, &v)
}

// Lookup returns the owner's claim.
func (p *PeerClient) Lookup(ctx context.Context, id string) (Claim, error) {
	var v Claim
	return v, p.c.do(ctx, http.MethodGet, "/peer/claims/"+segment(id), nil, &v)
}

// ResizeInPlace changes the owner's claim in place.
func (p *PeerClient) ResizeInPlace(ctx context.Context, id string, items []Item) (Claim, error) {
	var v Claim
	return v, p.c.do(ctx, http.MethodPost, "/peer/claims/"+segment(id)+"/resize", ResizeRequest{GPUs: items}, &v)
}

// List returns the owner's claims.
func (p *PeerClient) List(ctx context.Context) ([]Claim, error) {
	var v []Claim
	return v, p.c.do(ctx, http.MethodGet, "/peer/claims", nil, &v)
}

// LookupGroup returns a group record the owner keeps.
func (p *PeerClient) LookupGroup(ctx context.Context, name string) (GroupRecord, error) {
	var v GroupRecord
	return v, p.c.do(ctx, http.MethodGet, "/peer/groups/"+segment(name), nil, &v)
}

// DeleteGroup removes a group record the owner keeps.
func (p *PeerClient) DeleteGroup(ctx context.Context, name string) (GroupRecord, error) {
	var v GroupRecord
	return v, p.c.do(ctx, http.MethodDelete, "/peer/groups/"+segment(name), nil, &v)
}

// ErrNotSent matches the error of a peer call that never left the caller
// (the peer was avoided, or no connection to it was made), or that the
// peer never read (it closed the connection before): nothing it asked
// for can have happened on the peer.
var ErrNotSent = peerwire.ErrNotSent
