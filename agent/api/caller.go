package api

import "context"

type callerKey struct{}

// WithCaller returns ctx carrying node as the verified identity of the
// agent that made a peer API call. The transport sets it: the mutual-TLS
// listener from the client certificate, an in-memory network from the
// member that called. Handlers never take it from a request body.
func WithCaller(ctx context.Context, node string) context.Context {
	return context.WithValue(ctx, callerKey{}, node)
}

// CallerOf returns the verified node name of a peer API call's caller, and
// false when the transport attached none.
func CallerOf(ctx context.Context) (string, bool) {
	n, ok := ctx.Value(callerKey{}).(string)
	return n, ok && n != ""
}
