package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
)

// Service is what the agent offers through the API. Errors of type *Error
// reach the client as they are; any other error is an internal error.
type Service interface {
	Status(ctx context.Context) (Status, error)
	Claim(ctx context.Context, id string, req ClaimRequest) (Claim, error)
	Get(ctx context.Context, id string) (Claim, error)
	// ListClaims lists every claim of the platform, saying which servers
	// did not answer.
	ListClaims(ctx context.Context) (ClaimList, error)
	Release(ctx context.Context, id string) (Claim, error)
	Drain(ctx context.Context, addr, reason string) (GPU, error)
	Undrain(ctx context.Context, addr string) (GPU, error)
	Availability(ctx context.Context) (Availability, error)
	Resize(ctx context.Context, id string, req ResizeRequest) (Claim, error)
	Members(ctx context.Context) ([]Member, error)
	DrainServer(ctx context.Context, reason string) (Member, error)
	UndrainServer(ctx context.Context) (Member, error)
	CreateGroup(ctx context.Context, name string, req GroupRequest) (Group, error)
	GetGroup(ctx context.Context, name string) (Group, error)
	ResizeGroup(ctx context.Context, name string, req ResizeRequest) (Group, error)
	DeleteGroupClaims(ctx context.Context, name string) (Group, error)
	RepairGroup(ctx context.Context, name string) (Group, error)
	Version() VersionInfo
}

// MaxBodyBytes bounds every request body; a claim is a few hundred bytes.
const MaxBodyBytes = 64 << 10

// NewHandler routes the API to svc: what the local socket serves, with the
// libvirt hook's calls when svc implements Domains.
func NewHandler(svc Service, log *slog.Logger) http.Handler {
	mux, _ := newMux(svc, log)
	if d, ok := svc.(Domains); ok {
		domainRoutes(d, mux, log)
	}
	if m, ok := svc.(MemberRemover); ok {
		memberRoutes(m, mux, log)
	}
	return mux
}

// NewPeerHandler routes the API to svc and the owner operations to o: what
// the mutual-TLS listener serves to coordinators and remote clients.
func NewPeerHandler(svc Service, o Owner, log *slog.Logger) http.Handler {
	mux, h := newMux(svc, log)
	peerRoutes(o, mux, h)
	return requirePeerCaller(mux)
}

func newMux(svc Service, log *slog.Logger) (*http.ServeMux, *handler) {
	h := &handler{svc: svc, log: log}
	mux := http.NewServeMux()
	p := "/" + Version
	mux.HandleFunc("GET "+p+"/status", h.status)
	mux.HandleFunc("GET "+p+"/claims", h.claims)
	mux.HandleFunc("GET "+p+"/claims/{id}", h.get)
	mux.HandleFunc("PUT "+p+"/claims/{id}", h.claim)
	mux.HandleFunc("DELETE "+p+"/claims/{id}", h.release)
	mux.HandleFunc("PUT "+p+"/gpus/{addr}/drain", h.drain)
	mux.HandleFunc("DELETE "+p+"/gpus/{addr}/drain", h.undrain)
	mux.HandleFunc("GET "+p+"/availability", h.availability)
	mux.HandleFunc("GET "+p+"/version", h.version)
	mux.HandleFunc("POST "+p+"/claims/{id}/resize", h.resize)
	mux.HandleFunc("GET "+p+"/members", h.members)
	mux.HandleFunc("PUT "+p+"/drain", h.drainServer)
	mux.HandleFunc("DELETE "+p+"/drain", h.undrainServer)
	mux.HandleFunc("PUT "+p+"/groups/{name}", func(w http.ResponseWriter, r *http.Request) {
		var req GroupRequest
		if err := decode(w, r, &req); err != nil {
			h.reply(w, r, nil, err)
			return
		}
		v, err := svc.CreateGroup(r.Context(), r.PathValue("name"), req)
		h.reply(w, r, v, err)
	})
	mux.HandleFunc("GET "+p+"/groups/{name}", func(w http.ResponseWriter, r *http.Request) {
		v, err := svc.GetGroup(r.Context(), r.PathValue("name"))
		h.reply(w, r, v, err)
	})
	mux.HandleFunc("POST "+p+"/groups/{name}/resize", func(w http.ResponseWriter, r *http.Request) {
		var req ResizeRequest
		if err := decode(w, r, &req); err != nil {
			h.reply(w, r, nil, err)
			return
		}
		v, err := svc.ResizeGroup(r.Context(), r.PathValue("name"), req)
		h.reply(w, r, v, err)
	})
	mux.HandleFunc("POST "+p+"/groups/{name}/repair", func(w http.ResponseWriter, r *http.Request) {
		v, err := svc.RepairGroup(r.Context(), r.PathValue("name"))
		h.reply(w, r, v, err)
	})
	mux.HandleFunc("DELETE "+p+"/groups/{name}", func(w http.ResponseWriter, r *http.Request) {
		v, err := svc.DeleteGroupClaims(r.Context(), r.PathValue("name"))
		h.reply(w, r, v, err)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &Error{Status: http.StatusNotFound, Code: CodeNotFound,
			Message: fmt.Sprintf("no such endpoint: %s %s", r.Method, truncate(r.URL.Path, 100))})
	})
	return mux, h
}

type handler struct {
	svc Service
	log *slog.Logger
}

func (h *handler) status(w http.ResponseWriter, r *http.Request) {
	after, wait, watch, err := watchParams(r)
	if err != nil {
		h.reply(w, r, nil, err)
		return
	}
	if wt, ok := h.svc.(Watcher); ok && watch {
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		wt.WaitChange(ctx, after)
		cancel()
		if r.Context().Err() != nil {
			return // the watcher went away
		}
	}
	v, err := h.svc.Status(r.Context())
	h.reply(w, r, v, err)
}

func (h *handler) claims(w http.ResponseWriter, r *http.Request) {
	v, err := h.svc.ListClaims(r.Context())
	h.reply(w, r, v, err)
}

func (h *handler) get(w http.ResponseWriter, r *http.Request) {
	v, err := h.svc.Get(r.Context(), r.PathValue("id"))
	h.reply(w, r, v, err)
}

func (h *handler) claim(w http.ResponseWriter, r *http.Request) {
	var req ClaimRequest
	if err := decode(w, r, &req); err != nil {
		h.reply(w, r, nil, err)
		return
	}
	v, err := h.svc.Claim(r.Context(), r.PathValue("id"), req)
	h.reply(w, r, v, err)
}

func (h *handler) release(w http.ResponseWriter, r *http.Request) {
	ctx, err := releaseContext(w, r)
	if err != nil {
		h.reply(w, r, nil, err)
		return
	}
	v, err := h.svc.Release(ctx, r.PathValue("id"))
	if err == nil {
		// The answer describes the claim after the release, not before.
		v.State = StateReleased
	}
	h.reply(w, r, v, err)
}

func (h *handler) drain(w http.ResponseWriter, r *http.Request) {
	var req DrainRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			h.reply(w, r, nil, err)
			return
		}
	}
	v, err := h.svc.Drain(r.Context(), r.PathValue("addr"), req.Reason)
	h.reply(w, r, v, err)
}

func (h *handler) undrain(w http.ResponseWriter, r *http.Request) {
	v, err := h.svc.Undrain(r.Context(), r.PathValue("addr"))
	h.reply(w, r, v, err)
}

func (h *handler) availability(w http.ResponseWriter, r *http.Request) {
	v, err := h.svc.Availability(r.Context())
	h.reply(w, r, v, err)
}

func (h *handler) resize(w http.ResponseWriter, r *http.Request) {
	var req ResizeRequest
	if err := decode(w, r, &req); err != nil {
		h.reply(w, r, nil, err)
		return
	}
	v, err := h.svc.Resize(r.Context(), r.PathValue("id"), req)
	h.reply(w, r, v, err)
}

func (h *handler) members(w http.ResponseWriter, r *http.Request) {
	v, err := h.svc.Members(r.Context())
	h.reply(w, r, v, err)
}

func (h *handler) drainServer(w http.ResponseWriter, r *http.Request) {
	var req ServerDrainRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			h.reply(w, r, nil, err)
			return
		}
	}
	v, err := h.svc.DrainServer(r.Context(), req.Reason)
	h.reply(w, r, v, err)
}

func (h *handler) undrainServer(w http.ResponseWriter, r *http.Request) {
	v, err := h.svc.UndrainServer(r.Context())
	h.reply(w, r, v, err)
}

func (h *handler) version(w http.ResponseWriter, r *http.Request) {
	h.reply(w, r, h.svc.Version(), nil)
}

func (h *handler) reply(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			h.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			e = &Error{Status: http.StatusInternalServerError, Code: CodeInternal, Message: err.Error()}
		}
		writeError(w, e)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, e *Error) {
	status := e.HTTPStatus()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(ErrorBody{Error: e})
}

// decode reads exactly one JSON object of a known shape: a content type
// other than application/json, unknown or miscased fields, duplicate keys,
// wrong types, trailing data and oversized bodies are each a 4xx that says
// which (strict.go).
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	return decodeStrict(w, r, v)
}

func decodeError(err error) error {
	var (
		tooBig  *http.MaxBytesError
		typeErr *json.UnmarshalTypeError
		synErr  *json.SyntaxError
	)
	switch {
	case errors.As(err, &tooBig):
		return &Error{Status: http.StatusRequestEntityTooLarge, Code: CodeInvalid,
			Message: fmt.Sprintf("request body larger than %d bytes", MaxBodyBytes)}
	case errors.As(err, &typeErr):
		field := truncate(typeErr.Field, 64)
		return Invalid(field, "field %q: expected %s, got JSON %s", field, typeErr.Type, typeErr.Value)
	case errors.As(err, &synErr):
		return Invalid("", "malformed JSON at byte %d: %v", synErr.Offset, synErr)
	case errors.Is(err, io.EOF):
		return Invalid("", "empty request body: send a JSON object")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return Invalid(truncate(field, 64), "unknown field %q", truncate(field, 64))
	default:
		return Invalid("", "malformed request: %v", err)
	}
}

// Invalid is a 400 naming the field that is wrong.
func Invalid(field, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Field: field, Message: fmt.Sprintf(format, args...)}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
