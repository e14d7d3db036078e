package names

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

const lease = 30 * time.Second

// fx drives an FSM with encoded commands at increasing raft indexes, as
// raft would.
type fx struct {
	t   *testing.T
	f   *FSM
	idx uint64
	now time.Time
}

func newFx(t *testing.T) *fx { return &fx{t: t, f: NewFSM(nil), idx: 10, now: t0} }

func (x *fx) run(mt messageType, body any) Result {
	x.t.Helper()
	data, err := encodeMessage(mt, body)
	if err != nil {
		x.t.Fatal(err)
	}
	x.idx++
	return x.f.Apply(&raft.Log{Index: x.idx, Type: raft.LogCommand, Data: data}).(Result)
}

func (x *fx) acquire(k Key, caller, req string, members ...string) Result {
	x.t.Helper()
	return x.run(messageAcquire, &acquireMessage{Key: k, Caller: caller, Request: req, Members: members, Now: x.now, Lease: lease, Limits: DefaultLimits()})
}

func (x *fx) confirm(k Key, token uint64, owner string) Result {
	x.t.Helper()
	return x.run(messageConfirm, &confirmMessage{Key: k, Token: token, Owner: owner, Now: x.now, Limits: DefaultLimits()})
}

func (x *fx) release(k Key, token uint64, node string) Result {
	x.t.Helper()
	return x.run(messageRelease, &releaseMessage{Key: k, Token: token, Node: node})
}

func want(t *testing.T, res Result, code Code, parts ...string) Result {
	t.Helper()
	if res.Code != code {
		t.Fatalf("got %s (%s), want %s", res.Code, res.Detail, code)
	}
	for _, p := range parts {
		if !strings.Contains(res.Detail, p) {
			t.Fatalf("detail %q does not name %q", res.Detail, p)
		}
	}
	return res
}

func TestAcquire(t *testing.T) {
	x := newFx(t)
	vm := Claim("vm-x")
	g := want(t, x.acquire(vm, "node-a", "req-1"), CodeOK).Record
	if g.State != StatePending || g.Token != x.idx || g.Caller != "node-a" || !g.Deadline.Equal(t0.Add(lease)) {
		t.Fatalf("grant %+v", g)
	}

	// A retry of the same request, through another coordinator, gets the
	// first grant back: same token, same caller.
	x.now = x.now.Add(time.Second)
	again := want(t, x.acquire(vm, "node-c", "req-1"), CodeSame).Record
	if again.Token != g.Token || again.Caller != "node-a" {
		t.Fatalf("retry got %+v, want the first grant %+v", again, g)
	}
	// Another request is a conflict naming who is placing it.
	c := want(t, x.acquire(vm, "node-c", "req-2"), CodeConflict, "pending", "node-a").Record
	if c.Request != "req-1" {
		t.Fatalf("conflict record %+v", c)
	}
	// Once held, the conflict names the owner.
	want(t, x.confirm(vm, g.Token, "node-b"), CodeOK)
	want(t, x.acquire(vm, "node-c", "req-2"), CodeConflict, "held", "node-b")
	held := want(t, x.acquire(vm, "node-c", "req-1"), CodeSame).Record
	if held.State != StateHeld || held.Owner != "node-b" || held.Token != g.Token {
		t.Fatalf("retry after confirm got %+v", held)
	}

	// The same name in the other namespace is another name.
	want(t, x.acquire(Group("vm-x"), "node-a", "req-9"), CodeOK)
}

func TestAcquireAfterLapseGetsNewerToken(t *testing.T) {
	x := newFx(t)
	vm := Claim("vm-x")
	first := want(t, x.acquire(vm, "node-a", "req-1"), CodeOK).Record
	// Strictly before the deadline the name is still pending...
	x.now = t0.Add(lease - time.Nanosecond)
	want(t, x.acquire(vm, "node-c", "req-2"), CodeConflict)
	// ...at the deadline it is free, even before an expiry collects it.
	x.now = t0.Add(lease)
	second := want(t, x.acquire(vm, "node-c", "req-2"), CodeOK).Record
	if second.Token <= first.Token {
		t.Fatalf("new token %d is not after %d", second.Token, first.Token)
	}
	// The paused first caller's owner cannot confirm under the old token.
	want(t, x.confirm(vm, first.Token, "node-b"), CodeStale, "token")
	// Nor release the new grant with it.
	want(t, x.release(vm, first.Token, ""), CodeStale)
	want(t, x.confirm(vm, second.Token, "node-d"), CodeOK)
}

func TestConfirm(t *testing.T) {
	x := newFx(t)
	vm := Claim("vm-x")
	tok := want(t, x.acquire(vm, "node-a", "req-1"), CodeOK).Record.Token

	want(t, x.confirm(Claim("vm-unknown"), tok, "node-b"), CodeNotFound)
	want(t, x.confirm(vm, tok+100, "node-b"), CodeStale)
	r := want(t, x.confirm(vm, tok, "node-b"), CodeOK).Record
	if r.State != StateHeld || r.Owner != "node-b" || !r.Deadline.IsZero() {
		t.Fatalf("confirmed %+v", r)
	}
	// Idempotent for the same owner; a second owner is refused: one copy.
	want(t, x.confirm(vm, tok, "node-b"), CodeSame)
	want(t, x.confirm(vm, tok, "node-c"), CodeConflict, "node-b")
	// A held name does not lapse.
	x.now = t0.Add(10 * lease)
	want(t, x.run(messageExpire, &expireMessage{Now: x.now}), CodeOK)
	want(t, x.acquire(vm, "node-c", "req-1"), CodeSame)
}

func TestConfirmAfterDeadlineIsRefused(t *testing.T) {
	x := newFx(t)
	vm := Claim("vm-x")
	tok := want(t, x.acquire(vm, "node-a", "req-1"), CodeOK).Record.Token
	x.now = t0.Add(lease)
	want(t, x.confirm(vm, tok, "node-b"), CodeExpired, "lapsed")
	if _, ok, _ := x.f.Lookup(vm); ok {
		t.Fatal("a lapsed name is still listed")
	}
}

func TestRelease(t *testing.T) {
	x := newFx(t)
	vm := Claim("vm-x")
	tok := want(t, x.acquire(vm, "node-a", "req-1"), CodeOK).Record.Token
	want(t, x.confirm(vm, tok, "node-b"), CodeOK)

	want(t, x.release(vm, 0, "node-a"), CodeConflict, "node-b") // the caller no longer holds it
	want(t, x.release(vm, tok+1, ""), CodeStale)
	want(t, x.release(vm, tok, "node-c"), CodeConflict)
	r := want(t, x.release(vm, tok, "node-b"), CodeOK).Record
	if r.State != StateReleased || r.Token != tok {
		t.Fatalf("released %+v", r)
	}
	want(t, x.release(vm, tok, ""), CodeNotFound)

	// Free again: a new request gets a newer token.
	next := want(t, x.acquire(vm, "node-c", "req-2"), CodeOK).Record
	if next.Token <= tok {
		t.Fatalf("token %d after release is not after %d", next.Token, tok)
	}
	// A pending name is released by its caller.
	want(t, x.release(vm, 0, "node-c"), CodeOK)
}

func TestExpire(t *testing.T) {
	x := newFx(t)
	want(t, x.acquire(Claim("early"), "node-a", "r"), CodeOK)
	x.now = t0.Add(lease / 2)
	want(t, x.acquire(Claim("late"), "node-a", "r"), CodeOK)
	tok := want(t, x.acquire(Claim("kept"), "node-a", "r"), CodeOK).Record.Token
	want(t, x.confirm(Claim("kept"), tok, "node-b"), CodeOK)

	res := want(t, x.run(messageExpire, &expireMessage{Now: t0.Add(lease)}), CodeOK)
	if !reflect.DeepEqual(res.Keys, []Key{Claim("early")}) {
		t.Fatalf("expired %v", res.Keys)
	}
	// Time never goes back: an expiry from a leader whose clock is behind
	// changes nothing, and an acquire stamped earlier lapses from the
	// registry's time, not its own.
	res = want(t, x.run(messageExpire, &expireMessage{Now: t0}), CodeOK)
	if len(res.Keys) != 0 {
		t.Fatalf("expired %v with an older time", res.Keys)
	}
	x.now = t0
	r := want(t, x.acquire(Claim("behind"), "node-a", "r"), CodeOK).Record
	if !r.Deadline.Equal(t0.Add(lease).Add(lease)) {
		t.Fatalf("deadline %s, want the registry's time plus the lease", r.Deadline)
	}
	res = want(t, x.run(messageExpire, &expireMessage{Now: t0.Add(2 * lease)}), CodeOK)
	if !reflect.DeepEqual(res.Keys, []Key{Claim("behind"), Claim("late")}) {
		t.Fatalf("expired %v", res.Keys)
	}
	recs, _ := x.f.Records()
	if len(recs) != 1 || recs[0].Name != "kept" {
		t.Fatalf("left %+v", recs)
	}
}

func TestRemoveMember(t *testing.T) {
	x := newFx(t)
	hold := func(name, caller, owner string) uint64 {
		tok := want(t, x.acquire(Claim(name), caller, "req-"+name), CodeOK).Record.Token
		want(t, x.confirm(Claim(name), tok, owner), CodeOK)
		return tok
	}
	tokOnB := hold("on-b", "node-a", "node-b")
	hold("on-c", "node-b", "node-c")
	want(t, x.acquire(Claim("placing-by-b"), "node-b", "r"), CodeOK)
	want(t, x.acquire(Claim("placing-by-a"), "node-a", "r"), CodeOK)

	res := want(t, x.run(messageRemoveMember, &removeMemberMessage{Node: "node-b", Now: x.now}), CodeOK)
	if !reflect.DeepEqual(res.Keys, []Key{Claim("on-b"), Claim("placing-by-b")}) {
		t.Fatalf("changed %v", res.Keys)
	}
	lost, ok, _ := x.f.Lookup(Claim("on-b"))
	if !ok || lost.State != StateLost || lost.Owner != "node-b" || lost.Token != tokOnB {
		t.Fatalf("lost record %+v", lost)
	}
	if _, ok, _ := x.f.Lookup(Claim("placing-by-b")); ok {
		t.Fatal("a name its removed caller was placing is still pending")
	}
	for _, n := range []string{"on-c", "placing-by-a"} {
		if _, ok, _ := x.f.Lookup(Claim(n)); !ok {
			t.Fatalf("%s was changed", n)
		}
	}
	// A lost name is not given to anyone, and says why.
	want(t, x.acquire(Claim("on-b"), "node-a", "req-on-b"), CodeLost, "removed")
	want(t, x.acquire(Claim("on-b"), "node-a", "other"), CodeConflict, "lost")
	want(t, x.confirm(Claim("on-b"), tokOnB, "node-b"), CodeLost)
	// It can be released by its old owner's name, or by any node that
	// brings its token (an operator's release through any agent, whose
	// node the peer API writes in); then reused.
	want(t, x.release(Claim("on-b"), 0, "node-c"), CodeConflict)
	want(t, x.release(Claim("on-b"), tokOnB, "node-c"), CodeOK)
	want(t, x.acquire(Claim("on-b"), "node-a", "other"), CodeOK)
	hold("on-c2", "node-c", "node-c")
	x.run(messageRemoveMember, &removeMemberMessage{Node: "node-c", Now: x.now})
	want(t, x.release(Claim("on-c2"), 0, "node-c"), CodeOK)
}

func TestGroupMembers(t *testing.T) {
	x := newFx(t)
	g := Group("pool")
	tok := want(t, x.acquire(g, "node-a", "req", "pool-0", "pool-1"), CodeOK).Record.Token
	r := want(t, x.run(messageConfirm, &confirmMessage{Key: g, Token: tok, Owner: "node-a", Members: []string{"pool-0", "pool-1", "pool-2"}, Now: x.now}), CodeOK).Record
	if !reflect.DeepEqual(r.Members, []string{"pool-0", "pool-1", "pool-2"}) {
		t.Fatalf("members %v", r.Members)
	}
	set := func(tok uint64, m ...string) Result {
		return x.run(messageSetMembers, &setMembersMessage{Key: g, Token: tok, Members: m, Limits: DefaultLimits()})
	}
	// A group is the cluster's: another node releases it with its
	// current token, never without it.
	other := want(t, x.acquire(Group("other"), "node-a", "req"), CodeOK).Record.Token
	want(t, x.confirm(Group("other"), other, "node-a"), CodeOK)
	want(t, x.release(Group("other"), 0, "node-b"), CodeConflict)
	want(t, x.release(Group("other"), other, "node-b"), CodeOK)
	want(t, set(tok, "pool-0"), CodeOK)
	want(t, set(tok, "pool-0"), CodeSame)
	want(t, set(tok-1, "pool-9"), CodeStale)
	got, _, _ := x.f.Lookup(g)
	if !reflect.DeepEqual(got.Members, []string{"pool-0"}) {
		t.Fatalf("members %v", got.Members)
	}
	if _, _, err := decodeMessageOf(t, messageSetMembers, &setMembersMessage{Key: Claim("vm"), Token: 1}); err == nil {
		t.Fatal("a claim's members were accepted")
	}
}

func TestLimits(t *testing.T) {
	x := newFx(t)
	lim := Limits{PendingPerCaller: 2, HeldPerOwner: 1, Members: 2}
	acq := func(name, caller string) Result {
		return x.run(messageAcquire, &acquireMessage{Key: Claim(name), Caller: caller, Request: "r", Now: x.now, Lease: lease, Limits: lim})
	}
	a := want(t, acq("a", "node-a"), CodeOK).Record
	b := want(t, acq("b", "node-a"), CodeOK).Record
	want(t, acq("c", "node-a"), CodeLimit, "node-a")
	want(t, acq("c", "node-b"), CodeOK)   // another caller has its own bound
	want(t, acq("a", "node-a"), CodeSame) // a retry is not a new name
	conf := func(r *Record) Result {
		return x.run(messageConfirm, &confirmMessage{Key: r.Key(), Token: r.Token, Owner: "node-z", Now: x.now, Limits: lim})
	}
	want(t, conf(a), CodeOK)
	want(t, conf(b), CodeLimit, "node-z")
	// Confirming freed a pending slot.
	want(t, acq("d", "node-a"), CodeOK)
	gm := x.run(messageAcquire, &acquireMessage{Key: Group("g"), Caller: "node-c", Request: "r", Members: []string{"m0", "m1", "m2"}, Now: x.now, Lease: lease, Limits: lim})
	want(t, gm, CodeLimit, "members")
}

func TestDecodeRefusesWhatItCannotRead(t *testing.T) {
	good, _ := encodeMessage(messageRelease, &releaseMessage{Key: Claim("vm"), Token: 3})
	cases := map[string][]byte{
		"empty":         nil,
		"newer version": append([]byte{codecVersion + 1}, good[1:]...),
		"unknown type":  append([]byte{codecVersion, 99}, good[2:]...),
		"unknown field": append([]byte{codecVersion, byte(messageRelease)}, []byte(`{"key":{"kind":"claim","name":"vm"},"token":3,"new":1}`)...),
		"trailing":      append(append([]byte(nil), good...), []byte(`{}`)...),
		"bad kind":      append([]byte{codecVersion, byte(messageRelease)}, []byte(`{"key":{"kind":"vm","name":"vm"},"token":3}`)...),
		"no fence":      append([]byte{codecVersion, byte(messageRelease)}, []byte(`{"key":{"kind":"claim","name":"vm"}}`)...),
		"bad caller":    mustEncode(t, messageAcquire, &acquireMessage{Key: Claim("vm"), Caller: "Node A", Request: "r", Now: t0, Lease: lease}),
		"no lease":      mustEncode(t, messageAcquire, &acquireMessage{Key: Claim("vm"), Caller: "node-a", Request: "r", Now: t0}),
		"claim members": mustEncode(t, messageAcquire, &acquireMessage{Key: Claim("vm"), Caller: "node-a", Request: "r", Now: t0, Lease: lease, Members: []string{"x"}}),
		"long name":     mustEncode(t, messageRelease, &releaseMessage{Key: Claim(strings.Repeat("x", maxName+1)), Token: 1}),
		"control char":  mustEncode(t, messageRelease, &releaseMessage{Key: Claim("vm\x00"), Token: 1}),
	}
	for name, data := range cases {
		if _, _, err := decodeMessage(data); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, _, err := decodeMessage(good); err != nil {
		t.Fatal(err)
	}
}

func mustEncode(t *testing.T, mt messageType, body any) []byte {
	t.Helper()
	b, err := encodeMessage(mt, body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decodeMessageOf(t *testing.T, mt messageType, body any) (messageType, any, error) {
	return decodeMessage(mustEncode(t, mt, body))
}

// A command this server cannot read stops it applying the log: going on
// would make its copy differ from the servers that could.
func TestUnreadableCommandHaltsTheFSM(t *testing.T) {
	x := newFx(t)
	want(t, x.acquire(Claim("vm"), "node-a", "r"), CodeOK)
	x.idx++
	res := x.f.Apply(&raft.Log{Index: x.idx, Type: raft.LogCommand, Data: []byte{codecVersion + 1, 1}}).(Result)
	want(t, res, CodeHalted, "upgrade")
	want(t, x.acquire(Claim("other"), "node-a", "r"), CodeHalted)
	if _, _, err := x.f.Lookup(Claim("vm")); err == nil {
		t.Fatal("a halted FSM answered a lookup")
	}
	if _, err := x.f.Snapshot(); err == nil {
		t.Fatal("a halted FSM took a snapshot, which would drop the entry it could not apply")
	}
}

type memSink struct {
	bytes.Buffer
	closed, cancelled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }
func (s *memSink) Close() error  { s.closed = true; return nil }

func TestSnapshotRoundTrip(t *testing.T) {
	x := newFx(t)
	for i, name := range []string{"a", "b", "c", "d"} {
		r := want(t, x.acquire(Claim(name), "node-a", "req"), CodeOK).Record
		if i%2 == 0 {
			want(t, x.confirm(Claim(name), r.Token, "node-b"), CodeOK)
		}
	}
	gt := want(t, x.acquire(Group("g"), "node-c", "req", "g-0", "g-1"), CodeOK).Record.Token
	want(t, x.confirm(Group("g"), gt, "node-c"), CodeOK)
	want(t, x.run(messageRemoveMember, &removeMemberMessage{Node: "node-b", Now: x.now}), CodeOK)
	x.now = x.now.Add(time.Second)
	want(t, x.acquire(Claim("e"), "node-a", "req"), CodeOK)

	snap, err := x.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil || !sink.closed {
		t.Fatalf("persist: %v, closed %v", err, sink.closed)
	}
	y := &fx{t: t, f: NewFSM(nil), idx: x.idx, now: x.now}
	if err := y.f.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	a, _ := x.f.Records()
	b, _ := y.f.Records()
	if !reflect.DeepEqual(a, b) || len(a) != 6 {
		t.Fatalf("restored\n%+v\nwant\n%+v", b, a)
	}
	if !reflect.DeepEqual(x.f.st.pendingBy, y.f.st.pendingBy) || !reflect.DeepEqual(x.f.st.heldBy, y.f.st.heldBy) || !x.f.st.now.Equal(y.f.st.now) {
		t.Fatal("restored counts or time differ")
	}
	// Both copies answer the same commands the same way from here.
	for _, f := range []*fx{x, y} {
		f.now = t0.Add(lease + 2*time.Second)
	}
	steps := []func(*fx) Result{
		func(f *fx) Result { return f.acquire(Claim("b"), "node-z", "other") },
		func(f *fx) Result { return f.run(messageExpire, &expireMessage{Now: f.now}) },
		func(f *fx) Result { return f.release(Claim("a"), 0, "node-b") },
		func(f *fx) Result { return f.acquire(Claim("c"), "node-z", "req") },
	}
	for i, step := range steps {
		if ra, rb := step(x), step(y); !reflect.DeepEqual(ra, rb) {
			t.Fatalf("step %d: original %+v, restored %+v", i, ra, rb)
		}
	}
}

func TestRestoreRefusesBadSnapshots(t *testing.T) {
	for name, text := range map[string]string{
		"newer format":  `{"version":4,"now":"2026-12-01T12:00:00Z","applied":1,"records":[]}`,
		"unknown field": `{"version":1,"now":"2026-12-01T12:00:00Z","applied":1,"records":[],"x":1}`,
		"bad record":    `{"version":1,"now":"2026-12-01T12:00:00Z","applied":1,"records":[{"kind":"claim","name":"vm","caller":"node-a","request":"r","state":"held","token":3}]}`,
		"twice":         `{"version":1,"now":"2026-12-01T12:00:00Z","applied":1,"records":[{"kind":"claim","name":"vm","owner":"node-a","caller":"node-a","request":"r","state":"held","token":3},{"kind":"claim","name":"vm","owner":"node-a","caller":"node-a","request":"r","state":"held","token":3}]}`,
		"not json":      `hello`,
	} {
		f := NewFSM(nil)
		if err := f.Restore(io.NopCloser(strings.NewReader(text))); err == nil {
			t.Errorf("%s: restored", name)
		}
	}
}

func TestRefusedErrorMatchesSentinels(t *testing.T) {
	err := error(&RefusedError{Op: OpConfirm, Key: Claim("vm"), Code: CodeStale, Detail: "old token"})
	if !errors.Is(err, ErrStale) || errors.Is(err, ErrConflict) {
		t.Fatal("errors.Is does not follow the code")
	}
	u := &UnavailableError{Op: OpAcquire, Key: Claim("vm"), Unreached: []string{"node-b", "node-c"}, Uncertain: true}
	if !IsUnavailable(u) || !strings.Contains(u.Error(), "node-b, node-c") || !strings.Contains(u.Error(), "retry") {
		t.Fatalf("unavailable error %q", u)
	}
}

func TestChooseVoters(t *testing.T) {
	members := []string{"rack1-a", "rack1-b", "rack1-c", "rack2-a", "rack2-b", "rack3-a", "rack3-b"}
	v := ChooseVoters(members, 3)
	if len(v) != 3 {
		t.Fatalf("voters %v", v)
	}
	shuffled := append([]string{"rack3-b"}, members...)
	if !reflect.DeepEqual(ChooseVoters(shuffled, 3), v) {
		t.Fatal("the choice depends on the order of the members")
	}
	if got := ChooseVoters([]string{"a", "b"}, 3); len(got) != 2 {
		t.Fatalf("voters of two members %v", got)
	}
}
