package main

import (
	"slices"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// The checks of single answers, made as each answer arrives (the final
// state is checked in checks_linux.go). Each names the request, the agent
// asked, the time and what the run knew then: the evidence.

const timeFmt = "15:04:05.000"

// judgeClaimLocked checks a claim answer for rec's ID. items is the request
// sent (rec's own, or another one), start when it was sent. h.mu is held.
//
//   - second-copy: rec's own request answered "claimed" on other GPUs than
//     the acknowledged claim: a second copy of the ID.
//   - other-request-accepted: another request under the ID answered
//     "claimed": it must be a conflict.
//   - held-id-not-conflict: another request under a held ID answered "not
//     available" or "not found": it must be a conflict (or a retryable 503).
//   - not-available-for-held: rec's own request answered "not available"
//     while rec was held: "not available" tells the client to pick other
//     GPUs, and only means that no server can hold the request.
//   - false-conflict: rec's own request answered "conflict": no other
//     request was ever accepted under the ID.
func (h *history) judgeClaimLocked(rec *claimRec, via string, items []api.Item, start time.Time, o outcome, msg string, c api.Claim) {
	same := slices.Equal(items, rec.items)
	// Held from before the request until now: a release sent while it was
	// on its way may have freed the name first.
	held := rec.heldAt(start) && rec.releaseSentAt.IsZero()
	got := claimAddrs(c)
	switch {
	case o == outOK && !same:
		h.violateLocked("other-request-accepted", "claim %s through %s at %s with %s answered claimed on %s %v; the ID was claimed with %s (%s)",
			rec.id, via, start.Format(timeFmt), api.DescribeItems(items), c.Node, got, api.DescribeItems(rec.items), heldWhere(rec))
	case o == outOK && rec.committed && (c.Node != rec.node || !slices.Equal(got, rec.gpus)):
		h.violateLocked("second-copy", "claim %s through %s at %s answered claimed on %s %v; it was acknowledged on %s %v at %s",
			rec.id, via, start.Format(timeFmt), c.Node, got, rec.node, rec.gpus, rec.ackAt.Format(timeFmt))
	case !same && held && (o == outNotAvailable || o == outNotFound):
		h.violateLocked("held-id-not-conflict", "claim %s through %s at %s with %s answered %q; the ID was held with %s on %s %v since %s, so the answer must be conflict",
			rec.id, via, start.Format(timeFmt), api.DescribeItems(items), msg, api.DescribeItems(rec.items), rec.node, rec.gpus, rec.ackAt.Format(timeFmt))
	case same && held && o == outNotAvailable:
		h.violateLocked("not-available-for-held", "claim %s through %s at %s answered %q; the same request was held on %s %v since %s",
			rec.id, via, start.Format(timeFmt), msg, rec.node, rec.gpus, rec.ackAt.Format(timeFmt))
	case same && o == outConflict:
		h.violateLocked("false-conflict", "claim %s through %s at %s with its own request %s answered %q; no other request was ever accepted under it (%s)",
			rec.id, via, start.Format(timeFmt), api.DescribeItems(items), msg, heldWhere(rec))
	}
}

// judgeGetLocked checks a get of rec's ID sent at start. h.mu is held.
//
//   - get-mismatch: a claim with one definitive history read back other
//     than it was acknowledged.
//   - held-id-not-found: a held claim read as "not found": the caller
//     would believe its GPUs free. An owner that does not answer must give
//     a retryable 503.
//   - released-id-still-held: a claim found after its release was
//     acknowledged.
func (h *history) judgeGetLocked(rec *claimRec, via string, start time.Time, o outcome, msg string, c api.Claim) {
	switch o {
	case outOK:
		switch {
		case rec.releasedBefore(start):
			h.violateLocked("released-id-still-held", "get %s through %s at %s answered %s on %s %v; its release was acknowledged at %s",
				rec.id, via, start.Format(timeFmt), c.State, c.Node, claimAddrs(c), rec.releaseAckAt.Format(timeFmt))
		case rec.committed && !rec.ambiguousClaim && !rec.ambiguousRelease && rec.releaseSentAt.IsZero() &&
			(c.Node != rec.node || !slices.Equal(claimAddrs(c), rec.gpus) || c.State != api.StateClaimed):
			h.violateLocked("get-mismatch", "get %s through %s at %s: %s on %s %v, committed as %s %v", rec.id, via, start.Format(timeFmt),
				c.State, c.Node, claimAddrs(c), rec.node, rec.gpus)
		}
	case outNotFound:
		// Held from before the get until now (a release sent meanwhile
		// may have been applied before the get looked).
		if rec.heldAt(start) && rec.releaseSentAt.IsZero() {
			h.violateLocked("held-id-not-found", "get %s through %s at %s answered %q; it was acknowledged on %s %v at %s and not released",
				rec.id, via, start.Format(timeFmt), msg, rec.node, rec.gpus, rec.ackAt.Format(timeFmt))
		}
	}
}

// noteUnknown503 counts the retryable answers for IDs that never existed
// while faults were on: allowed then (the authority may be out of reach),
// but not once every fault is healed.
const noteUnknown503 = "an ID that never existed answered unavailable (503) during faults"

// judgeUnknown checks an answer to op ("get" or "release") of an ID that
// no client ever claimed: found is a violation (unknown-id-found); when
// strict says the cluster is in a state that must answer (every fault
// healed, or only one member dead) anything but "not found" is one too
// (unknown-id-not-404: a client retrying on 503 would loop).
func (h *history) judgeUnknown(op, id, via string, o outcome, msg, strict string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case o == outOK:
		h.violateLocked("unknown-id-found", "%s %s through %s answered ok; no client ever claimed it", op, id, via)
	case o == outNotFound:
	case strict != "":
		h.violateLocked("unknown-id-not-404", "%s %s through %s answered %q %s; no client ever claimed it, so it must be not_found", op, id, via, msg, strict)
	case o == outAmbiguous:
		h.notes[noteUnknown503]++
	}
}

func heldWhere(rec *claimRec) string {
	switch {
	case rec.committed:
		return "acknowledged on " + rec.node + " at " + rec.ackAt.Format(timeFmt)
	case rec.ambiguousClaim:
		return "its earlier attempts' fate unknown"
	}
	return "never acknowledged"
}
