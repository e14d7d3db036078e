package api

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Watcher is the agent's change feed: a client that keeps a view of this
// server (the Kubernetes driver publishing its GPUs) waits for the next
// change instead of polling. Generation is the current count; WaitChange
// returns once it passes after, or when ctx ends, with the count then.
type Watcher interface {
	Generation() uint64
	WaitChange(ctx context.Context, after uint64) uint64
}

// Bounds of a status watch's wait (`GET /v1/status?after=N&wait=D`).
const (
	DefaultWatchWait = 30 * time.Second
	MaxWatchWait     = 5 * time.Minute
)

// watchParams reads a status watch's query: after (a generation) and wait
// (how long to hold the request open); ok is false for a plain status.
func watchParams(r *http.Request) (after uint64, wait time.Duration, ok bool, err error) {
	q := r.URL.Query()
	if !q.Has("after") {
		if q.Has("wait") {
			return 0, 0, false, Invalid("wait", "wait is for a watch: give after=GENERATION too")
		}
		return 0, 0, false, nil
	}
	after, err = strconv.ParseUint(q.Get("after"), 10, 64)
	if err != nil {
		return 0, 0, false, Invalid("after", "after=%q: give the generation of the last status seen (a number)", truncate(q.Get("after"), 24))
	}
	wait = DefaultWatchWait
	if s := q.Get("wait"); s != "" {
		wait, err = time.ParseDuration(s)
		if err != nil || wait <= 0 || wait > MaxWatchWait {
			return 0, 0, false, Invalid("wait", "wait=%q: give a duration between 1ms and %s, e.g. 30s", truncate(s, 24), MaxWatchWait)
		}
	}
	return after, wait, true, nil
}

// WatchStatus returns this server's status once its generation is
// another than after, or after wait with no change (the same
// generation): the loop
// of a client that mirrors the server is Status, then WatchStatus with
// the generation it got, again and again.
func (c *Client) WatchStatus(ctx context.Context, after uint64, wait time.Duration) (Status, error) {
	var v Status
	path := fmt.Sprintf("/status?after=%d&wait=%s", after, wait)
	return v, c.do(ctx, http.MethodGet, path, nil, &v)
}
