package names

import (
	"bytes"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

func (x *fx) holdRecall(k Key, owner, req string, recall bool) Result {
	x.t.Helper()
	return x.run(messageHold, &holdMessage{Key: k, Owner: owner, Caller: owner, Request: req, Now: x.now, Limits: DefaultLimits(), Recall: recall})
}

func (x *fx) releaseRemembering(k Key, token uint64, node string, keep time.Duration) Result {
	x.t.Helper()
	return x.run(messageRelease, &releaseMessage{Key: k, Token: token, Node: node, Remember: keep, Now: x.now})
}

// A claim ID released with remember is held again only on the server it
// ran on by a hold with recall, until its window ends; a hold without
// recall (any_node, a server named) goes anywhere; a plain release, or a
// new hold, replaces what was remembered.
func TestHoldRecallsWhereTheIDLastRan(t *testing.T) {
	x := newFx(t)
	vm := Claim("vm-r")
	tok := want(t, x.holdRecall(vm, "node-a", "req", true), CodeOK).Record.Token
	want(t, x.releaseRemembering(vm, tok, "node-a", time.Hour), CodeOK)

	res := want(t, x.holdRecall(vm, "node-b", "req", true), CodeRecalled, "node-a")
	if res.Record == nil || res.Record.Owner != "node-a" || res.Record.State != StateReleased {
		t.Fatalf("recalled record %+v; want node-a, released", res.Record)
	}
	if _, held, _ := x.f.Lookup(vm); held {
		t.Fatal("a recalled hold left the name held")
	}
	// Back where it ran: held, and the memory is spent.
	tok = want(t, x.holdRecall(vm, "node-a", "req", true), CodeOK).Record.Token
	if _, ok := x.f.st.recent[vm]; ok {
		t.Fatal("still remembered after it was held again")
	}
	want(t, x.releaseRemembering(vm, tok, "node-a", time.Hour), CodeOK)
	// Without recall it goes anywhere.
	tok = want(t, x.holdRecall(vm, "node-b", "req", false), CodeOK).Record.Token
	// A plain release forgets.
	want(t, x.release(vm, tok, "node-b"), CodeOK)
	want(t, x.holdRecall(vm, "node-c", "req", true), CodeOK)

	// The window ends at the leader's time: the next command after it
	// forgets (forgetPast), and the hold goes anywhere.
	w := Claim("vm-w")
	tok = want(t, x.holdRecall(w, "node-a", "req", true), CodeOK).Record.Token
	want(t, x.releaseRemembering(w, tok, "node-a", time.Minute), CodeOK)
	x.now = x.now.Add(59 * time.Second)
	want(t, x.holdRecall(w, "node-b", "req", true), CodeRecalled)
	x.now = x.now.Add(time.Second)
	want(t, x.holdRecall(w, "node-b", "req", true), CodeOK)
	if len(x.f.st.recent) != 0 {
		t.Fatalf("remembered %v after every window ended", x.f.st.recent)
	}
}

// A release remembers only a held claim, for at most MaxRemember, and a
// remembered release carries the leader's time.
func TestReleaseRememberingChecks(t *testing.T) {
	for name, m := range map[string]*releaseMessage{
		"negative":  {Key: Claim("vm"), Node: "node-a", Remember: -time.Second, Now: t0},
		"too long":  {Key: Claim("vm"), Node: "node-a", Remember: MaxRemember + time.Second, Now: t0},
		"no time":   {Key: Claim("vm"), Node: "node-a", Remember: time.Hour},
		"no holder": {Key: Claim("vm"), Remember: time.Hour, Now: t0},
	} {
		if err := m.check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	x := newFx(t)
	g := Group("g")
	gt := want(t, x.acquire(g, "node-a", "req", "g-0"), CodeOK).Record.Token
	want(t, x.confirm(g, gt, "node-a"), CodeOK)
	want(t, x.releaseRemembering(g, gt, "node-a", time.Hour), CodeOK)
	if len(x.f.st.recent) != 0 {
		t.Fatalf("a group release remembered %v", x.f.st.recent)
	}
}

// The memory is bounded: past maxRemembered, the ID that would be
// forgotten first goes, the same one on every server (ties by key).
func TestRememberedRunsAreBounded(t *testing.T) {
	s := newState()
	s.now = t0
	until := t0.Add(time.Hour)
	for i := range maxRemembered + 10 {
		k := Claim("vm-" + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + "-" + itoa(i))
		s.remember(k, "node-a", until.Add(time.Duration(i%7)*time.Second))
	}
	if len(s.recent) != maxRemembered {
		t.Fatalf("remembered %d; want %d", len(s.recent), maxRemembered)
	}
	for k, lr := range s.recent {
		if lr.Until.Equal(until) && compareKeys(k, Claim("vm-a-0")) < 0 {
			t.Fatalf("kept %s, which sorts before a forgotten one of the same window", k)
		}
	}
	if len(s.forget) > 2*len(s.recent)+1024 {
		t.Fatalf("forget queue of %d for %d remembered", len(s.forget), len(s.recent))
	}
}

func itoa(i int) string {
	var b [20]byte
	n := len(b)
	for {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
		if i == 0 {
			return string(b[n:])
		}
	}
}

// What is remembered is in the snapshot (format 3), and a copy restored
// from it refuses and forgets as the original does; a snapshot with
// nothing remembered stays format 2, which older servers read.
func TestSnapshotKeepsRememberedRuns(t *testing.T) {
	x := newFx(t)
	plain, err := x.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if v := plain.(*fsmSnapshot).file.Version; v != 2 {
		t.Fatalf("snapshot without remembered runs is format %d; want 2", v)
	}
	for i, id := range []string{"vm-1", "vm-2", "vm-3"} {
		tok := want(t, x.holdRecall(Claim(id), "node-a", "req", true), CodeOK).Record.Token
		want(t, x.releaseRemembering(Claim(id), tok, "node-a", time.Duration(i+1)*time.Minute), CodeOK)
	}
	snap, err := x.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sink.String(), `"version":3`) || !strings.Contains(sink.String(), `"recent":[`) {
		t.Fatalf("snapshot %s; want format 3 with recent", sink.String())
	}
	y := &fx{t: t, f: NewFSM(nil), idx: x.idx, now: x.now}
	if err := y.f.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(x.f.st.recent, y.f.st.recent) {
		t.Fatalf("restored %v; want %v", y.f.st.recent, x.f.st.recent)
	}
	for _, f := range []*fx{x, y} {
		f.now = f.now.Add(90 * time.Second)
	}
	for _, id := range []string{"vm-1", "vm-2"} {
		if ra, rb := x.holdRecall(Claim(id), "node-b", "req", true), y.holdRecall(Claim(id), "node-b", "req", true); !reflect.DeepEqual(ra, rb) {
			t.Fatalf("%s: original %+v, restored %+v", id, ra, rb)
		}
	}
	for name, text := range map[string]string{
		"a group":   `{"version":3,"now":"2026-12-01T12:00:00Z","applied":1,"records":[],"recent":[{"key":{"kind":"group","name":"g"},"owner":"node-a","until":"2026-12-01T13:00:00Z"}]}`,
		"no server": `{"version":3,"now":"2026-12-01T12:00:00Z","applied":1,"records":[],"recent":[{"key":{"kind":"claim","name":"vm"},"owner":"","until":"2026-12-01T13:00:00Z"}]}`,
		"twice":     `{"version":3,"now":"2026-12-01T12:00:00Z","applied":1,"records":[],"recent":[{"key":{"kind":"claim","name":"vm"},"owner":"node-a","until":"2026-12-01T13:00:00Z"},{"key":{"kind":"claim","name":"vm"},"owner":"node-b","until":"2026-12-01T13:00:00Z"}]}`,
	} {
		if err := NewFSM(nil).Restore(io.NopCloser(strings.NewReader(text))); err == nil {
			t.Errorf("%s: restored", name)
		}
	}
}
