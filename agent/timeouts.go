package agent

import "time"

// defaultRequestReadTimeout bounds reading one request, headers and body,
// on the local socket and on the peer API alike: a client that sends its
// headers and then a trickle of body (or nothing) must not hold a
// connection and a goroutine for ever. A claim's body is a few hundred
// bytes.
const defaultRequestReadTimeout = 30 * time.Second

// WithRequestReadTimeout replaces the deadline for reading one request;
// tests shorten it.
func WithRequestReadTimeout(d time.Duration) Option {
	return func(o *options) { o.readTimeout = d }
}

// requestReadTimeout is the deadline for reading one request.
func (a *Agent) requestReadTimeout() time.Duration {
	if a.readTimeout > 0 {
		return a.readTimeout
	}
	return defaultRequestReadTimeout
}
