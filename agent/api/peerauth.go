package api

import (
	"fmt"
	"net/http"
	"strings"
)

// Who may say what on the peer API (docs/protocol.md, "Who may say what").
// Every call under /v1/peer/ comes from a caller whose node name the
// transport verified (CallerOf: the client certificate on the mutual-TLS
// listener). A node name in a request body that can only ever be the
// caller's own — a reservation's coordinator, a directory intent's
// coordinator, the sender of directory notices — must be that name: a
// certificate of the cluster's CA speaks for its own node, never for
// another.

// peerPrefix is the path of every peer call.
var peerPrefix = "/" + Version + "/peer/"

// requirePeerCaller refuses, with 403 forbidden, every peer call that
// carries no verified caller; other calls pass untouched.
func requirePeerCaller(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, peerPrefix) {
			if _, err := peerCaller(r); err != nil {
				writeError(w, err)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// peerCaller is the verified node name of a peer call's caller.
func peerCaller(r *http.Request) (string, *Error) {
	if c, ok := CallerOf(r.Context()); ok {
		return c, nil
	}
	return "", &Error{Code: CodeForbidden,
		Message: "peer call without a verified caller: peer calls need a client certificate of the cluster's CA that names the calling node"}
}

// ownName checks that *named, the node a request body names in field, is
// the caller's own, and fills it in when the body left it empty.
func ownName(r *http.Request, field string, named *string) error {
	caller, err := peerCaller(r)
	if err != nil {
		return err
	}
	switch *named {
	case "":
		*named = caller
	case caller:
	default:
		return &Error{Code: CodeForbidden, Field: field,
			Message: fmt.Sprintf("%s %q is not the caller: the client certificate names node %q, and a node may speak only for itself", field, truncate(*named, 64), caller)}
	}
	return nil
}
