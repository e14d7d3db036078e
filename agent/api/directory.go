package api

import (
	"context"
	"net/http"
	"time"
)

// The claim directory: each claim ID has a home server, chosen by rendezvous
// hashing of the ID over the live members, that remembers where the claim
// is. A coordinator asks the home instead of every server; see
// docs/protocol.md, "The claim directory".

// Directory answers.
const (
	// DirNew: the home knows the ID is held nowhere and has recorded the
	// asking coordinator's intent to place it.
	DirNew = "new"
	// DirHeld: the claim is (or was last reported) on Owners.
	DirHeld = "held"
	// DirPending: another coordinator is placing the claim right now.
	DirPending = "pending"
	// DirAbsent: the home knows the ID is held nowhere (lookups only).
	DirAbsent = "absent"
	// DirUnsure: the home cannot vouch for its answer (it started or the
	// membership changed recently, or its record is stale): ask every server.
	DirUnsure = "unsure"
)

// DirBegin asks the home to record that Coordinator is about to place a claim.
type DirBegin struct {
	Coordinator string `json:"coordinator"`
}

// DirAnswer is the home's answer about one claim ID.
type DirAnswer struct {
	State       string   `json:"state"`
	Owners      []string `json:"owners,omitempty"`      // DirHeld
	Coordinator string   `json:"coordinator,omitempty"` // DirPending
	// LastOwner (DirNew, and lookups of an ID held nowhere): the server the
	// ID was last released on, within remember_released; a claim without a
	// preferred server goes back there.
	LastOwner string `json:"last_owner,omitempty"`
}

// DirUpdate tells a home where claims are now, in order. Owners send one
// after their commits and releases, and all of their claims again when the
// membership changes; a coordinator sends DirOpAbandon for a claim it could
// not place.
type DirUpdate struct {
	From string  `json:"from"` // the owner, or the coordinator for DirOpAbandon
	Ops  []DirOp `json:"ops"`
}

// DirOp is one notification about one claim ID.
type DirOp struct {
	ID string `json:"id"`
	Op string `json:"op"` // DirOpHeld, DirOpGone or DirOpAbandon
	// At is when a DirOpGone's claim was released, when the owner re-sends
	// one it remembers; zero means now.
	At time.Time `json:"at,omitzero"`
}

// DirOp kinds.
const (
	DirOpHeld    = "held"    // committed on From
	DirOpGone    = "gone"    // no longer on From
	DirOpAbandon = "abandon" // From, as coordinator, placed nothing
)

// MaxDirUpdateIDs bounds the IDs of one DirUpdate.
const MaxDirUpdateIDs = 4096

// Capacity is one server's free GPUs per model, read from its ledger at the
// moment of the call: fresher than gossip.
type Capacity struct {
	Free    map[string]int `json:"free"`
	Drained bool           `json:"drained,omitempty"`
}

// CapacityReader reads a server's capacity. A coordinator about to answer
// "not available" from its gossip view asks the servers directly first.
type CapacityReader interface {
	Capacity(ctx context.Context) (Capacity, error)
}

// Directory is the claim-ID directory a server keeps for the IDs homed on it.
type Directory interface {
	BeginClaim(ctx context.Context, id string, req DirBegin) (DirAnswer, error)
	LookupDirectory(ctx context.Context, id string) (DirAnswer, error)
	UpdateDirectory(ctx context.Context, u DirUpdate) error
}

func directoryRoutes(d Directory, mux *http.ServeMux, h *handler) {
	p := "/" + Version + "/peer/directory"
	mux.HandleFunc("POST "+p+"/{id}/begin", func(w http.ResponseWriter, r *http.Request) {
		var req DirBegin
		if err := decode(w, r, &req); err != nil {
			h.reply(w, r, nil, err)
			return
		}
		if err := ownName(r, "coordinator", &req.Coordinator); err != nil {
			h.reply(w, r, nil, err)
			return
		}
		v, err := d.BeginClaim(r.Context(), r.PathValue("id"), req)
		h.reply(w, r, v, err)
	})
	mux.HandleFunc("GET "+p+"/{id}", func(w http.ResponseWriter, r *http.Request) {
		v, err := d.LookupDirectory(r.Context(), r.PathValue("id"))
		h.reply(w, r, v, err)
	})
	if c, ok := d.(CapacityReader); ok {
		mux.HandleFunc("GET /"+Version+"/peer/capacity", func(w http.ResponseWriter, r *http.Request) {
			v, err := c.Capacity(r.Context())
			h.reply(w, r, v, err)
		})
	}
	mux.HandleFunc("POST "+p, func(w http.ResponseWriter, r *http.Request) {
		var u DirUpdate
		if err := decode(w, r, &u); err != nil {
			h.reply(w, r, nil, err)
			return
		}
		if err := ownName(r, "from", &u.From); err != nil {
			h.reply(w, r, nil, err)
			return
		}
		err := d.UpdateDirectory(r.Context(), u)
		h.reply(w, r, struct{}{}, err)
	})
}

var _ Directory = (*PeerClient)(nil)

// BeginClaim asks the claim's home to record an intent to place it.
func (p *PeerClient) BeginClaim(ctx context.Context, id string, req DirBegin) (DirAnswer, error) {
	var v DirAnswer
	return v, p.c.do(ctx, http.MethodPost, "/peer/directory/"+segment(id)+"/begin", req, &v)
}

// LookupDirectory asks the claim's home where the claim is.
func (p *PeerClient) LookupDirectory(ctx context.Context, id string) (DirAnswer, error) {
	var v DirAnswer
	return v, p.c.do(ctx, http.MethodGet, "/peer/directory/"+segment(id), nil, &v)
}

var _ CapacityReader = (*PeerClient)(nil)

// Capacity reads the server's free GPUs now.
func (p *PeerClient) Capacity(ctx context.Context) (Capacity, error) {
	var v Capacity
	return v, p.c.do(ctx, http.MethodGet, "/peer/capacity", nil, &v)
}

// UpdateDirectory tells a home where claims are.
func (p *PeerClient) UpdateDirectory(ctx context.Context, u DirUpdate) error {
	return p.c.do(ctx, http.MethodPost, "/peer/directory", u, nil)
}
