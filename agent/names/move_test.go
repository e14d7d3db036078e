package names

import (
	"bytes"
	"io"
	"reflect"
	"strings"
	"testing"
)

func (x *fx) move(k Key, token uint64, from, to, caller string) Result {
	x.t.Helper()
	return x.run(messageMove, &moveMessage{Key: k, Token: token, From: from, To: to, Caller: caller, Now: x.now, Lease: lease})
}

// held acquires and confirms k on owner and returns its record.
func (x *fx) held(k Key, owner string) Record {
	x.t.Helper()
	g := want(x.t, x.acquire(k, "node-c", "req"), CodeOK).Record
	return *want(x.t, x.confirm(k, g.Token, owner), CodeOK).Record
}

// A move leaves the name held where it is until the new server confirms
// the move's token; that one step makes it the holder under the newer
// token, and the old server's token is stale from then on.
func TestMove(t *testing.T) {
	x := newFx(t)
	vm := Claim("vm-x")
	h := x.held(vm, "node-a")
	m := want(t, x.move(vm, h.Token, "node-a", "node-b", "node-c"), CodeOK).Record
	if m.Move == nil || m.Move.To != "node-b" || m.Move.Token <= h.Token || m.Owner != "node-a" || m.Token != h.Token || m.State != StateHeld {
		t.Fatalf("moving record %+v", m)
	}
	// Meanwhile the name is still node-a's: a repeat of its confirm is
	// "same", another request still a conflict naming node-a.
	want(t, x.confirm(vm, h.Token, "node-a"), CodeSame)
	want(t, x.acquire(vm, "node-z", "other"), CodeConflict, "node-a")
	// The same move again (a retry) answers the move under way; a move
	// elsewhere, or by another caller, is a conflict.
	if again := want(t, x.move(vm, h.Token, "node-a", "node-b", "node-c"), CodeSame).Record; again.Move.Token != m.Move.Token {
		t.Fatalf("retried move got token %d, want %d", again.Move.Token, m.Move.Token)
	}
	want(t, x.move(vm, h.Token, "node-a", "node-d", "node-z"), CodeConflict, "node-b", "node-c")
	// Only the target confirms the move.
	want(t, x.confirm(vm, m.Move.Token, "node-d"), CodeConflict, "node-b")
	// The same caller moving it to another server (the first said no)
	// replaces its move: the first target's token is stale from then on.
	d := want(t, x.move(vm, h.Token, "node-a", "node-d", "node-c"), CodeOK).Record
	want(t, x.confirm(vm, m.Move.Token, "node-b"), CodeStale)
	want(t, x.confirm(vm, d.Move.Token, "node-b"), CodeConflict, "node-d")
	m = want(t, x.move(vm, h.Token, "node-a", "node-b", "node-c"), CodeOK).Record
	done := want(t, x.confirm(vm, m.Move.Token, "node-b"), CodeOK).Record
	if done.Owner != "node-b" || done.Token != m.Move.Token || done.Move != nil || done.MovedFrom != "node-a" {
		t.Fatalf("moved record %+v", done)
	}
	want(t, x.confirm(vm, m.Move.Token, "node-b"), CodeSame)
	// The old server's token ends with the move: it can neither confirm
	// nor release the name any more.
	want(t, x.confirm(vm, h.Token, "node-a"), CodeStale)
	want(t, x.release(vm, h.Token, ""), CodeStale)
	want(t, x.release(vm, 0, "node-a"), CodeConflict, "node-b")
	if x.f.st.heldBy["node-a"] != 0 || x.f.st.heldBy["node-b"] != 1 {
		t.Fatalf("held counts %v", x.f.st.heldBy)
	}
	want(t, x.release(vm, done.Token, "node-b"), CodeOK)
}

// While a name moves, a hold of it on the server it leaves is refused, not
// "same": a claim committed there under it (a retry placed on the old
// server, or one placed on a server handing a name back) would lose it
// when the move is confirmed. Once the move lapsed, the hold is the same
// hold again.
func TestHoldRefusedWhileMoving(t *testing.T) {
	x := newFx(t)
	vm := Claim("vm-x")
	h := want(t, x.hold(vm, "node-c", "node-a", "req"), CodeOK).Record
	want(t, x.hold(vm, "node-c", "node-a", "req"), CodeSame)
	m := want(t, x.move(vm, h.Token, "node-a", "node-b", "node-a"), CodeOK).Record
	want(t, x.hold(vm, "node-z", "node-a", "req"), CodeConflict, "moving from node-a to node-b")
	x.now = m.Move.Deadline
	want(t, x.run(messageExpire, &expireMessage{Now: x.now}), CodeOK)
	want(t, x.hold(vm, "node-z", "node-a", "req"), CodeSame)
}

// A move nobody confirms lapses: the name stays on its server, and a
// later move may go elsewhere.
func TestMoveLapses(t *testing.T) {
	x := newFx(t)
	vm := Claim("vm-x")
	h := x.held(vm, "node-a")
	m := want(t, x.move(vm, h.Token, "node-a", "node-b", "node-c"), CodeOK).Record
	x.now = x.now.Add(lease)
	// Registry time moves with commands; an expiry carries the leader's.
	want(t, x.run(messageExpire, &expireMessage{Now: x.now}), CodeOK)
	r, ok, _ := x.f.Lookup(vm)
	if !ok || r.Move != nil || r.Owner != "node-a" {
		t.Fatalf("after the lapse: %+v, %v", r, ok)
	}
	want(t, x.confirm(vm, m.Move.Token, "node-b"), CodeExpired, "node-a")
	want(t, x.confirm(vm, m.Move.Token, "node-b"), CodeStale)
	again := want(t, x.move(vm, h.Token, "node-a", "node-d", "node-z"), CodeOK).Record
	want(t, x.confirm(vm, again.Move.Token, "node-d"), CodeOK)
}

// A move needs the name held on its server under its current token.
func TestMoveRefusals(t *testing.T) {
	x := newFx(t)
	vm := Claim("vm-x")
	want(t, x.move(vm, 5, "node-a", "node-b", "node-c"), CodeNotFound)
	p := want(t, x.acquire(vm, "node-c", "req"), CodeOK).Record
	want(t, x.move(vm, p.Token, "node-a", "node-b", "node-c"), CodeConflict, "being placed")
	want(t, x.confirm(vm, p.Token, "node-a"), CodeOK)
	want(t, x.move(vm, p.Token+1, "node-a", "node-b", "node-c"), CodeStale)
	want(t, x.move(vm, p.Token, "node-d", "node-b", "node-c"), CodeConflict, "node-a")
	// Releasing the name under its token ends a move under way too.
	m := want(t, x.move(vm, p.Token, "node-a", "node-b", "node-c"), CodeOK).Record
	want(t, x.release(vm, p.Token, "node-a"), CodeOK)
	want(t, x.confirm(vm, m.Move.Token, "node-b"), CodeNotFound)
	// A lost name does not move.
	l := x.held(Claim("vm-l"), "node-a")
	want(t, x.run(messageRemoveMember, &removeMemberMessage{Node: "node-a", Now: x.now}), CodeOK)
	want(t, x.move(Claim("vm-l"), l.Token, "node-a", "node-b", "node-c"), CodeLost)
}

// Removing a server ends the moves to it and by it (they can never be
// confirmed); a moving name held on it becomes lost.
func TestRemoveMemberEndsMoves(t *testing.T) {
	x := newFx(t)
	to, by, on := x.held(Claim("to"), "node-a"), x.held(Claim("by"), "node-a"), x.held(Claim("on"), "node-a")
	want(t, x.move(Claim("to"), to.Token, "node-a", "node-gone", "node-c"), CodeOK)
	want(t, x.move(Claim("by"), by.Token, "node-a", "node-b", "node-gone"), CodeOK)
	want(t, x.move(Claim("on"), on.Token, "node-a", "node-b", "node-c"), CodeOK)
	res := want(t, x.run(messageRemoveMember, &removeMemberMessage{Node: "node-gone", Now: x.now}), CodeOK)
	if len(res.Keys) != 2 {
		t.Fatalf("changed %v, want the two moves", res.Keys)
	}
	for _, k := range []Key{Claim("to"), Claim("by")} {
		if r, _, _ := x.f.Lookup(k); r.Move != nil || r.Owner != "node-a" || r.State != StateHeld {
			t.Fatalf("%s after removal: %+v", k, r)
		}
	}
	want(t, x.run(messageRemoveMember, &removeMemberMessage{Node: "node-a", Now: x.now}), CodeOK)
	if r, _, _ := x.f.Lookup(Claim("on")); r.State != StateLost || r.Move != nil {
		t.Fatalf("moving name of a removed owner: %+v", r)
	}
}

func TestMoveDecodeAndSnapshot(t *testing.T) {
	for name, body := range map[string]*moveMessage{
		"no token":  {Key: Claim("vm"), From: "node-a", To: "node-b", Caller: "node-c", Now: t0, Lease: lease},
		"to itself": {Key: Claim("vm"), Token: 3, From: "node-a", To: "node-a", Caller: "node-c", Now: t0, Lease: lease},
		"bad to":    {Key: Claim("vm"), Token: 3, From: "node-a", To: "Node B", Caller: "node-c", Now: t0, Lease: lease},
		"no lease":  {Key: Claim("vm"), Token: 3, From: "node-a", To: "node-b", Caller: "node-c", Now: t0},
	} {
		if _, _, err := decodeMessageOf(t, messageMove, body); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}

	x := newFx(t)
	h := x.held(Claim("vm"), "node-a")
	want(t, x.move(Claim("vm"), h.Token, "node-a", "node-b", "node-c"), CodeOK)
	snap, err := x.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sink.String(), `"version":2`) {
		t.Fatalf("snapshot %s is not version 2", sink.String())
	}
	y := &fx{t: t, f: NewFSM(nil), idx: x.idx, now: x.now}
	if err := y.f.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	a, _, _ := x.f.Lookup(Claim("vm"))
	b, _, _ := y.f.Lookup(Claim("vm"))
	if !reflect.DeepEqual(a, b) || b.Move == nil {
		t.Fatalf("restored %+v, want %+v", b, a)
	}
	mt := a.Move.Token
	if ra, rb := x.confirm(Claim("vm"), mt, "node-b"), y.confirm(Claim("vm"), mt, "node-b"); !reflect.DeepEqual(ra, rb) || ra.Code != CodeOK {
		t.Fatalf("confirm on the original %+v, on the restored %+v", ra, rb)
	}

	// A version 1 snapshot (no moves) still restores.
	v1 := `{"version":1,"now":"2026-12-01T12:00:00Z","applied":1,"records":[{"kind":"claim","name":"vm","owner":"node-a","caller":"node-a","request":"r","state":"held","token":3,"index":3}]}`
	if err := NewFSM(nil).Restore(io.NopCloser(strings.NewReader(v1))); err != nil {
		t.Fatalf("version 1 snapshot: %v", err)
	}
	bad := `{"version":2,"now":"2026-12-01T12:00:00Z","applied":1,"records":[{"kind":"claim","name":"vm","caller":"node-a","request":"r","state":"pending","deadline":"2026-12-01T12:00:30Z","token":3,"index":3,"move":{"to":"node-b","token":4,"deadline":"2026-12-01T12:00:30Z","caller":"node-c"}}]}`
	if err := NewFSM(nil).Restore(io.NopCloser(strings.NewReader(bad))); err == nil {
		t.Fatal("restored a pending name that is moving")
	}
}

// A held group's request changes under its token (a resize), and only
// a held group's.
func TestSetRequest(t *testing.T) {
	x := newFx(t)
	set := func(k Key, token uint64, req string) Result {
		t.Helper()
		return x.run(messageSetRequest, &setRequestMessage{Key: k, Token: token, Request: req})
	}
	g := Group("pool")
	want(t, set(g, 3, "r2"), CodeNotFound)
	p := want(t, x.acquire(g, "node-a", "r1", "pool.node-0"), CodeOK).Record
	want(t, set(g, p.Token, "r2"), CodeConflict, "pending")
	want(t, x.confirm(g, p.Token, "node-a"), CodeOK)
	want(t, set(g, p.Token+1, "r2"), CodeStale)
	r := want(t, set(g, p.Token, "r2"), CodeOK).Record
	if r.Request != "r2" || r.Token != p.Token || r.Owner != "node-a" || len(r.Members) != 1 {
		t.Fatalf("after set-request: %+v", r)
	}
	want(t, set(g, p.Token, "r2"), CodeSame)
	// The request is the group's digest from now on.
	want(t, x.acquire(g, "node-b", "r2"), CodeSame)
	want(t, x.acquire(g, "node-b", "r1"), CodeConflict)
	if _, _, err := decodeMessageOf(t, messageSetRequest, &setRequestMessage{Key: Claim("vm"), Token: 3, Request: "r"}); err == nil {
		t.Error("set-request of a claim decoded")
	}
	if _, _, err := decodeMessageOf(t, messageSetRequest, &setRequestMessage{Key: g, Token: 3}); err == nil {
		t.Error("set-request without a request decoded")
	}
}

// Only a node confirms its own names; a move's coordinator may confirm
// that move for the node it moves to (putting a name back), no one else.
func TestConfirmForAnotherNode(t *testing.T) {
	x := newFx(t)
	vm := Claim("vm-c")
	confirmAs := func(token uint64, owner, caller string) Result {
		return x.run(messageConfirm, &confirmMessage{Key: vm, Token: token, Owner: owner, Caller: caller, Now: x.now, Limits: DefaultLimits()})
	}
	p := want(t, x.acquire(vm, "node-c", "req"), CodeOK).Record
	want(t, confirmAs(p.Token, "node-a", "node-m"), CodeConflict, "may not confirm")
	want(t, confirmAs(p.Token, "node-a", "node-a"), CodeOK)
	m := want(t, x.move(vm, p.Token, "node-a", "node-b", "node-c"), CodeOK).Record
	want(t, confirmAs(m.Move.Token, "node-b", "node-m"), CodeConflict, "may not confirm")
	r := want(t, confirmAs(m.Move.Token, "node-b", "node-c"), CodeOK).Record
	if r.Owner != "node-b" || r.Token != m.Move.Token {
		t.Fatalf("after the coordinator's confirm: %+v", r)
	}
}

// A stamp moves a held group's Index under its token and changes nothing
// else; a group operation that read the Index before it sees the change.
func TestStamp(t *testing.T) {
	x := newFx(t)
	stamp := func(k Key, token uint64) Result {
		t.Helper()
		return x.run(messageStamp, &stampMessage{Key: k, Token: token})
	}
	g := Group("pool")
	want(t, stamp(g, 3), CodeNotFound)
	p := want(t, x.acquire(g, "node-a", "r1", "pool.node-0"), CodeOK).Record
	want(t, stamp(g, p.Token), CodeConflict, "pending")
	c := want(t, x.confirm(g, p.Token, "node-a"), CodeOK).Record
	want(t, stamp(g, p.Token+1), CodeStale)
	r := want(t, stamp(g, p.Token), CodeOK).Record
	if r.Index <= c.Index {
		t.Fatalf("stamp left the Index at %d (was %d)", r.Index, c.Index)
	}
	c.Index = r.Index
	if !reflect.DeepEqual(r, c) {
		t.Fatalf("stamp changed more than the Index:\n got %+v\nwant %+v", r, c)
	}
	again := want(t, stamp(g, p.Token), CodeOK).Record
	if again.Index <= r.Index {
		t.Fatalf("a second stamp left the Index at %d", again.Index)
	}
	if _, _, err := decodeMessageOf(t, messageStamp, &stampMessage{Key: Claim("vm"), Token: 3}); err == nil {
		t.Error("stamp of a claim decoded")
	}
	if _, _, err := decodeMessageOf(t, messageStamp, &stampMessage{Key: g}); err == nil {
		t.Error("stamp without a token decoded")
	}
}
