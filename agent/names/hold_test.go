package names

import (
	"testing"
)

func (x *fx) hold(k Key, caller, owner, req string) Result {
	x.t.Helper()
	return x.run(messageHold, &holdMessage{Key: k, Owner: owner, Caller: caller, Request: req, Now: x.now, Limits: DefaultLimits()})
}

// TestHold: the claim path's one write makes a free claim ID held on the
// committing server; a retried commit gets the same hold; every other
// server, request or state is refused, naming who has it.
func TestHold(t *testing.T) {
	x := newFx(t)
	k := Claim("vm-1")
	r := want(t, x.hold(k, "coord-a", "node-b", "req-1"), CodeOK)
	if rec := r.Record; rec.State != StateHeld || rec.Owner != "node-b" || rec.Caller != "coord-a" || rec.Token != x.idx {
		t.Fatalf("held record %+v", *rec)
	}
	token := r.Record.Token
	if r := want(t, x.hold(k, "coord-c", "node-b", "req-1"), CodeSame); r.Record.Token != token {
		t.Fatalf("retried hold got token %d, want %d", r.Record.Token, token)
	}
	want(t, x.hold(k, "coord-c", "node-d", "req-1"), CodeConflict, "held on node-b")
	want(t, x.hold(k, "coord-c", "node-b", "req-2"), CodeConflict, "another request")
	// The owner lets it go with the token it committed under.
	want(t, x.release(k, token, "node-b"), CodeOK)
	if r := want(t, x.hold(k, "coord-c", "node-d", "req-2"), CodeOK); r.Record.Token <= token {
		t.Fatalf("a new hold's token %d is not newer than %d", r.Record.Token, token)
	}

	// A name being placed the two-step way (a group's, or an older
	// agent's claim) is not held over.
	p := Claim("vm-2")
	want(t, x.acquire(p, "coord-a", "req-1"), CodeOK)
	want(t, x.hold(p, "coord-c", "node-b", "req-1"), CodeConflict, "being placed by coord-a")

	// A lost name stays lost until released.
	l := Claim("vm-3")
	want(t, x.hold(l, "coord-a", "gone", "req-1"), CodeOK)
	want(t, x.run(messageRemoveMember, &removeMemberMessage{Node: "gone", Now: x.now}), CodeOK)
	want(t, x.hold(l, "coord-a", "node-b", "req-1"), CodeLost)

	// Groups are acquired and confirmed: their members come with them.
	if _, _, err := decodeMessage(mustEncode(t, messageHold, &holdMessage{Key: Group("g"), Owner: "node-b", Request: "r", Now: x.now})); err == nil {
		t.Fatal("a group hold was accepted")
	}
}

// TestHoldLimits: a server holds at most HeldPerOwner names, however it
// got them.
func TestHoldLimits(t *testing.T) {
	x := newFx(t)
	lim := DefaultLimits()
	lim.HeldPerOwner = 2
	for i, id := range []string{"a", "b", "c"} {
		res := x.run(messageHold, &holdMessage{Key: Claim(id), Owner: "node-b", Request: "r", Now: x.now, Limits: lim})
		if wantCode := map[bool]Code{true: CodeOK, false: CodeLimit}[i < 2]; res.Code != wantCode {
			t.Fatalf("hold %d: %s (%s), want %s", i, res.Code, res.Detail, wantCode)
		}
	}
}
