package home

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// members is a fake Membership: a cluster this agent has joined (or not)
// with the given peers.
type members struct {
	joined bool
	peers  []string
}

func (m *members) Joined() bool    { return m.joined }
func (m *members) Peers() []string { return m.peers }

const (
	settle     = 10 * time.Second
	pendingTTL = time.Minute
)

// newHome is the home of agent "a" in a joined cluster with peers, on a
// manual clock.
func newHome(peers ...string) (*Home, *clock.Manual, *members) {
	clk := clock.NewManual(time.Unix(1_000_000, 0))
	m := &members{joined: true, peers: peers}
	h := New(Deps{
		NodeName:         "a",
		Clock:            clk,
		Members:          m,
		DirectorySettle:  settle,
		RememberReleased: 24 * time.Hour,
		PendingTTL:       pendingTTL,
	})
	return h, clk, m
}

// idHomedOn is the first ID "vm-N" whose home among all is want.
func idHomedOn(want string, all ...string) string {
	for i := 0; ; i++ {
		id := fmt.Sprintf("vm-%d", i)
		if Of(id, all, name) == want {
			return id
		}
	}
}

func begin(t *testing.T, h *Home, id, coordinator string) api.DirAnswer {
	t.Helper()
	ans, err := h.BeginClaim(context.Background(), id, api.DirBegin{Coordinator: coordinator})
	if err != nil {
		t.Fatalf("begin %s by %s: %v", id, coordinator, err)
	}
	return ans
}

func lookup(t *testing.T, h *Home, id string) api.DirAnswer {
	t.Helper()
	ans, err := h.LookupDirectory(context.Background(), id)
	if err != nil {
		t.Fatalf("lookup %s: %v", id, err)
	}
	return ans
}

// A home vouches for nothing until directory_settle has passed since it
// started, and again after every membership change (a member that came,
// went or restarted): until then it answers "unsure", after it "new" and
// "absent". Noting the same membership again changes nothing.
func TestHomeVouchesOnlyOnceSettled(t *testing.T) {
	h, clk, _ := newHome("b")
	i := 0
	next := func() string { // an ID homed here, not asked about before
		for {
			i++
			if id := fmt.Sprintf("vm-%d", i); h.IsHome(id) {
				return id
			}
		}
	}

	if ans := begin(t, h, next(), "a"); ans.State != api.DirUnsure {
		t.Fatalf("begin right after the start: %+v, want unsure", ans)
	}
	clk.Advance(settle - time.Nanosecond)
	if ans := lookup(t, h, next()); ans.State != api.DirUnsure {
		t.Fatalf("lookup just before directory_settle: %+v, want unsure", ans)
	}
	clk.Advance(time.Nanosecond)
	if ans := lookup(t, h, next()); ans.State != api.DirAbsent {
		t.Fatalf("lookup once settled: %+v, want absent", ans)
	}
	if ans := begin(t, h, next(), "a"); ans.State != api.DirNew {
		t.Fatalf("begin once settled: %+v, want new", ans)
	}

	for _, change := range []struct {
		what    string
		members []Member
		changed bool
	}{
		{"b joined", []Member{{"a", 1}, {"b", 1}}, true},
		{"the same members", []Member{{"b", 1}, {"a", 1}}, false},
		{"b restarted", []Member{{"a", 1}, {"b", 2}}, true},
		{"c joined", []Member{{"a", 1}, {"b", 2}, {"c", 1}}, true},
		{"c left", []Member{{"a", 1}, {"b", 2}}, true},
	} {
		clk.Advance(time.Hour)
		if got := h.NoteMembership(change.members); got != change.changed {
			t.Fatalf("%s: NoteMembership = %v, want %v", change.what, got, change.changed)
		}
		want := api.DirNew
		if change.changed {
			want = api.DirUnsure
		}
		if ans := begin(t, h, next(), "a"); ans.State != want {
			t.Fatalf("%s: begin at once: %+v, want %s", change.what, ans, want)
		}
		clk.Advance(settle - time.Nanosecond)
		if ans := begin(t, h, next(), "a"); ans.State != want {
			t.Fatalf("%s: begin just before directory_settle: %+v, want %s", change.what, ans, want)
		}
		clk.Advance(time.Nanosecond)
		if ans := begin(t, h, next(), "a"); ans.State != api.DirNew {
			t.Fatalf("%s: begin once settled: %+v, want new", change.what, ans)
		}
	}
}

// A home vouches only for the IDs it is home of by its own view, and only
// once it has joined the cluster: before, its view may lack servers.
func TestHomeVouchesOnlyForItsIDsOnceJoined(t *testing.T) {
	h, clk, m := newHome("b", "c")
	clk.Advance(settle)
	mine, theirs := idHomedOn("a", "a", "b", "c"), idHomedOn("c", "a", "b", "c")
	if !h.IsHome(mine) || h.IsHome(theirs) {
		t.Fatalf("IsHome disagrees with Of: %s %v, %s %v", mine, h.IsHome(mine), theirs, h.IsHome(theirs))
	}
	if ans := lookup(t, h, theirs); ans.State != api.DirUnsure {
		t.Errorf("lookup of an ID homed on c: %+v, want unsure", ans)
	}
	if ans := begin(t, h, theirs, "b"); ans.State != api.DirUnsure {
		t.Errorf("begin of an ID homed on c: %+v, want unsure", ans)
	}
	m.joined = false
	if ans := lookup(t, h, mine); ans.State != api.DirUnsure {
		t.Errorf("lookup before joining: %+v, want unsure", ans)
	}
	m.joined = true
	if ans := lookup(t, h, mine); ans.State != api.DirAbsent {
		t.Errorf("lookup once joined: %+v, want absent", ans)
	}
}

// An intent counts as a placement in progress for the pending TTL: another
// coordinator is told who is placing the ID until then, and "unsure" after
// (its own intent replacing the stale one); the owner's report ends it.
func TestHomeIntentExpires(t *testing.T) {
	h, clk, _ := newHome()
	clk.Advance(settle)
	if ans := begin(t, h, "vm-1", "a"); ans.State != api.DirNew {
		t.Fatalf("first begin: %+v, want new", ans)
	}
	clk.Advance(pendingTTL - time.Nanosecond)
	if ans := begin(t, h, "vm-1", "b"); ans.State != api.DirPending || ans.Coordinator != "a" {
		t.Fatalf("b's begin during a's placement: %+v, want pending by a", ans)
	}
	clk.Advance(time.Nanosecond)
	if ans := begin(t, h, "vm-1", "b"); ans.State != api.DirUnsure {
		t.Fatalf("b's begin once a's intent is stale: %+v, want unsure", ans)
	}
	if ans := lookup(t, h, "vm-1"); ans.State != api.DirPending || ans.Coordinator != "b" {
		t.Fatalf("lookup after b's begin: %+v, want pending by b", ans)
	}
	if st := h.Stats(); st.Intents["a"] != 0 || st.Intents["b"] != 1 {
		t.Errorf("intents %v, want b's alone", st.Intents)
	}
	if err := h.UpdateDirectory(context.Background(), api.DirUpdate{From: "owner-1", Ops: []api.DirOp{{ID: "vm-1", Op: api.DirOpHeld}}}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	if ans := lookup(t, h, "vm-1"); ans.State != api.DirHeld || len(ans.Owners) != 1 || ans.Owners[0] != "owner-1" {
		t.Errorf("lookup after the commit: %+v, want held on owner-1", ans)
	}
}

// A membership change drops the intents of coordinators that are no
// longer members, and keeps every held record.
func TestHomeForgetsIntentsOfCoordinatorsThatLeft(t *testing.T) {
	h, clk, _ := newHome()
	clk.Advance(settle)
	ctx := context.Background()
	h.NoteMembership([]Member{{"a", 1}, {"b", 1}})
	begin(t, h, "vm-1", "b")
	begin(t, h, "vm-2", "a")
	if err := h.UpdateDirectory(ctx, api.DirUpdate{From: "b", Ops: []api.DirOp{{ID: "vm-3", Op: api.DirOpHeld}}}); err != nil {
		t.Fatal(err)
	}
	h.NoteMembership([]Member{{"c", 1}})
	if h.Knows("vm-1") {
		t.Error("b left and its intent stayed")
	}
	if !h.Knows("vm-2") {
		t.Error("this agent's own intent was dropped")
	}
	if ans := lookup(t, h, "vm-3"); ans.State != api.DirHeld {
		t.Errorf("b left and its held record went: %+v", ans)
	}
}

// Bad notifications are refused whole, naming what is wrong.
func TestDirectoryRejectsBadUpdates(t *testing.T) {
	h, _, _ := newHome()
	ctx := context.Background()
	for _, u := range []api.DirUpdate{
		{From: "", Ops: []api.DirOp{{ID: "vm-1", Op: api.DirOpHeld}}},
		{From: "b c", Ops: []api.DirOp{{ID: "vm-1", Op: api.DirOpHeld}}},
		{From: "b", Ops: []api.DirOp{{ID: "vm-1", Op: api.DirOpHeld}, {ID: "../x", Op: api.DirOpHeld}}},
		{From: "b", Ops: []api.DirOp{{ID: "vm-1", Op: "steal"}}},
		{From: "b", Ops: make([]api.DirOp, api.MaxDirUpdateIDs+1)},
	} {
		if err := h.UpdateDirectory(ctx, u); !api.IsCode(err, api.CodeInvalid) {
			t.Errorf("update %+v: %v, want invalid", u.From, err)
		}
	}
	if st := h.Stats(); st.Entries != 0 {
		t.Errorf("a refused update changed the directory: %v", h.dir.entries)
	}
}

// A bad claim ID or coordinator is refused as every other request of the
// agent is: invalid, naming the field, in the ledger's words.
func TestHomeRefusesBadIDs(t *testing.T) {
	h, _, _ := newHome()
	ctx := context.Background()
	_, err := h.BeginClaim(ctx, "../x", api.DirBegin{Coordinator: "a"})
	var e *api.Error
	if !errors.As(err, &e) || e.Code != api.CodeInvalid || e.Field != "id" ||
		e.Message != `invalid request: id: "../x" has '/' at byte 2; use only letters, digits, '.', '_' and '-'` {
		t.Errorf("begin of ../x: %#v", err)
	}
	if _, err := h.LookupDirectory(ctx, ""); !api.IsCode(err, api.CodeInvalid) {
		t.Errorf("lookup of an empty ID: %v, want invalid", err)
	}
	if _, err := h.BeginClaim(ctx, "vm-1", api.DirBegin{Coordinator: "b c"}); !api.IsCode(err, api.CodeInvalid) {
		t.Errorf("begin by %q: %v, want invalid", "b c", err)
	}
	if h.Knows("vm-1") {
		t.Error("a refused begin left an intent")
	}
}
