package agent

import "time"

// requestReadTimeout bounds reading one request, headers and body, on the
// local socket and on the peer API alike: a client that sends its headers
// and then a trickle of body (or nothing) must not hold a connection and a
// goroutine for ever. A claim's body is a few hundred bytes. A variable so
// that tests can shorten it.
var requestReadTimeout = 30 * time.Second
