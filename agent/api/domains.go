package api

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
)

// Domains is what the libvirt hook asks of the agent on its own server:
// whether a domain may run on a claim's GPUs (marking the claim in use by
// it), and that it stopped. Only the local socket serves it: the hook runs
// on the server that holds the GPUs, and no other server may mark them.
type Domains interface {
	UseClaim(ctx context.Context, id string, req UseRequest) (Claim, error)
	EndUse(ctx context.Context, id, domainUUID string, release bool) (UseEnd, error)
}

// domainRoutes adds PUT and DELETE /v1/claims/{id}/domain.
func domainRoutes(d Domains, mux *http.ServeMux, log *slog.Logger) {
	h := &handler{log: log}
	p := "/" + Version
	mux.HandleFunc("PUT "+p+"/claims/{id}/domain", func(w http.ResponseWriter, r *http.Request) {
		var req UseRequest
		if err := decode(w, r, &req); err != nil {
			h.reply(w, r, nil, err)
			return
		}
		v, err := d.UseClaim(r.Context(), r.PathValue("id"), req)
		h.reply(w, r, v, err)
	})
	mux.HandleFunc("DELETE "+p+"/claims/{id}/domain", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		release, err := strconv.ParseBool(q.Get("release"))
		if q.Get("release") == "" {
			release, err = false, nil
		}
		if err != nil {
			h.reply(w, r, nil, Invalid("release", "release=%q: use true or false", truncate(q.Get("release"), 16)))
			return
		}
		uuid := q.Get("uuid")
		if uuid == "" {
			h.reply(w, r, nil, Invalid("uuid", "name the domain: ?uuid=DOMAIN-UUID"))
			return
		}
		v, err := d.EndUse(r.Context(), r.PathValue("id"), uuid, release)
		h.reply(w, r, v, err)
	})
}

// UseClaim asks whether a domain may run on claim id's GPUs and, unless
// req.CheckOnly, marks the claim in use by it.
func (c *Client) UseClaim(ctx context.Context, id string, req UseRequest) (Claim, error) {
	var v Claim
	return v, c.do(ctx, http.MethodPut, "/claims/"+segment(id)+"/domain", req, &v)
}

// EndUse tells the agent that a domain stopped; with release, the claim is
// released if that domain had marked it in use and started.
func (c *Client) EndUse(ctx context.Context, id, domainUUID string, release bool) (UseEnd, error) {
	var v UseEnd
	q := url.Values{"uuid": {domainUUID}, "release": {strconv.FormatBool(release)}}
	return v, c.do(ctx, http.MethodDelete, "/claims/"+segment(id)+"/domain?"+q.Encode(), nil, &v)
}
