package gossip

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"
)

func mustEncode(t *testing.T, s Summary) []byte {
	t.Helper()
	b, err := s.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestViewStates(t *testing.T) {
	now := time.Unix(1000, 0)
	v := newView("a", time.Minute)
	v.now = func() time.Time { return now }
	lo := net.IPv4(127, 0, 0, 1)

	v.alive("a", lo, 1, mustEncode(t, Summary{Revision: 1}))
	v.alive("b", lo, 2, mustEncode(t, Summary{Revision: 2}))
	v.alive("c", lo, 3, []byte{0xC9, 1, 2}) // a newer agent's format
	v.alive("d", lo, 4, mustEncode(t, Summary{}))

	v.suspect("b")
	v.gone("c", nil)                                   // failed
	v.gone("d", mustEncode(t, Summary{Leaving: true})) // announced its leave
	v.suspect("zz")                                    // unknown: ignored

	want := map[string]string{"a": StateAlive, "b": StateSuspect, "c": StateDead, "d": StateLeft}
	ms := v.list()
	if len(ms) != 4 {
		t.Fatalf("%d members, want 4: %+v", len(ms), ms)
	}
	for i, m := range ms {
		if i > 0 && ms[i-1].Name >= m.Name {
			t.Errorf("members not sorted by name: %q before %q", ms[i-1].Name, m.Name)
		}
		if m.State != want[m.Name] {
			t.Errorf("%s: state %q, want %q", m.Name, m.State, want[m.Name])
		}
		if m.Self != (m.Name == "a") {
			t.Errorf("%s: Self = %v", m.Name, m.Self)
		}
	}
	if ms[2].SummaryErr == nil || ms[2].Usable() {
		t.Error("a member with undecodable metadata must be listed with SummaryErr and not be usable")
	}
	if ms[1].Usable() {
		t.Error("a suspect member must not be usable for placement")
	}
	if ms[1].Addr != "127.0.0.1:2" || ms[1].Summary.Revision != 2 {
		t.Errorf("b = %+v", ms[1])
	}

	v.acked("b")
	if m := v.list()[1]; m.State != StateAlive {
		t.Errorf("after an ack b is %q, want alive", m.State)
	}

	now = now.Add(2 * time.Minute)
	ms = v.list()
	if len(ms) != 2 || ms[0].Name != "a" || ms[1].Name != "b" {
		t.Errorf("departed members not forgotten after the remember period: %+v", ms)
	}
}

func TestViewSubscribeCoalesces(t *testing.T) {
	v := newView("a", time.Minute)
	ch, cancel := v.subscribe(false)
	for i := range 10 {
		v.alive("b", net.IPv4(127, 0, 0, 1), uint16(i), nil)
	}
	<-ch
	select {
	case <-ch:
		t.Error("ten changes in a row delivered more than one notification")
	default:
	}
	cancel()
	cancel()
	if _, ok := <-ch; ok {
		t.Error("channel still open after cancel")
	}
	v.alive("c", net.IPv4(127, 0, 0, 1), 1, nil) // must not panic on the closed channel
}

func TestMemberlistLogger(t *testing.T) {
	var buf bytes.Buffer
	var suspected []string
	l := newMemberlistLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
		func(name string) { suspected = append(suspected, name) })
	l.Printf("[DEBUG] memberlist: Stream connection from=127.0.0.1:1")
	l.Printf("[ERR] memberlist: Failed to send gossip to 10.0.0.1:7946: boom")
	l.Printf("[INFO] memberlist: Suspect gpu-07 has failed, no acks received")
	l.Printf("no level at all")

	out := buf.String()
	for _, want := range []string{
		`level=DEBUG msg="Stream connection from=127.0.0.1:1"`,
		`level=WARN msg="Failed to send gossip to 10.0.0.1:7946: boom"`,
		`level=DEBUG msg="Suspect gpu-07 has failed, no acks received"`,
		`msg="no level at all"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
	if len(suspected) != 1 || suspected[0] != "gpu-07" {
		t.Errorf("suspected %v, want [gpu-07]", suspected)
	}
}

// A membership subscriber hears of members joining, changing state or
// anything but capacity in their summaries, and not of capacity changes,
// which every claim in the cluster makes; an every-change subscriber hears
// of those too.
func TestViewSubscribeMembershipSkipsCapacity(t *testing.T) {
	v := newView("a", time.Minute)
	all, cancelAll := v.subscribe(false)
	defer cancelAll()
	members, cancelMembers := v.subscribe(true)
	defer cancelMembers()
	ip := net.IPv4(127, 0, 0, 1)
	meta := func(free uint16, drained bool) []byte {
		b, err := Summary{PeerAddr: "127.0.0.1:1", Drained: drained, Models: []ModelCapacity{{Model: "NVIDIA H100", Total: 8, Free: free, Healthy: 8}}}.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	pending := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	steps := []struct {
		what       string
		do         func()
		membership bool
	}{
		{"b joins", func() { v.alive("b", ip, 1, meta(8, false)) }, true},
		{"b's free count changes", func() { v.alive("b", ip, 1, meta(7, false)) }, false},
		{"b is drained", func() { v.alive("b", ip, 1, meta(7, true)) }, true},
		{"b moves to another port", func() { v.alive("b", ip, 2, meta(7, true)) }, true},
		{"b is suspected", func() { v.suspect("b") }, true},
		{"b answers again", func() { v.acked("b") }, true},
		{"b's summary stops decoding", func() { v.alive("b", ip, 2, []byte{0xff}) }, true},
		{"b goes", func() { v.gone("b", nil) }, true},
	}
	for _, s := range steps {
		s.do()
		if !pending(all) {
			t.Errorf("%s: the every-change subscriber was not told", s.what)
		}
		if got := pending(members); got != s.membership {
			t.Errorf("%s: the membership subscriber told %v, want %v", s.what, got, s.membership)
		}
		if got := v.list(); len(got) != 1 || got[0].Name != "b" {
			t.Errorf("%s: listed %+v, want b alone", s.what, got)
		}
	}
	if m := v.list()[0]; m.State != StateDead {
		t.Errorf("b is %q at the end, want dead", m.State)
	}
}

// member answers as list does, one member at a time, and forgets a
// departed member after the remember period as list does.
func TestViewMemberMatchesList(t *testing.T) {
	now := time.Unix(1000, 0)
	v := newView("a", time.Minute)
	v.now = func() time.Time { return now }
	lo := net.IPv4(127, 0, 0, 1)
	v.alive("a", lo, 1, mustEncode(t, Summary{Revision: 1}))
	v.alive("b", lo, 2, mustEncode(t, Summary{Revision: 2, Models: []ModelCapacity{{Model: "NVIDIA L40S", Total: 2, Free: 1}}}))
	v.alive("c", lo, 3, mustEncode(t, Summary{}))
	v.suspect("b")
	v.gone("c", nil)
	for _, want := range v.list() {
		got, ok := v.member(want.Name)
		if !ok {
			t.Fatalf("member(%q): not found, list has it", want.Name)
		}
		if got.Name != want.Name || got.State != want.State || got.Addr != want.Addr || got.Self != want.Self ||
			got.Summary.Revision != want.Summary.Revision || len(got.Summary.Models) != len(want.Summary.Models) {
			t.Errorf("member(%q) = %+v, list has %+v", want.Name, got, want)
		}
	}
	if _, ok := v.member("zz"); ok {
		t.Error("an unknown member was found")
	}
	m, _ := v.member("b")
	m.Summary.Models[0].Free = 9
	if again, _ := v.member("b"); again.Summary.Models[0].Free != 1 {
		t.Error("a caller's change to a member's models reached the view")
	}
	now = now.Add(2 * time.Minute)
	if _, ok := v.member("c"); ok {
		t.Error("a member dead for longer than the remember period is still found")
	}
	if _, ok := v.member("b"); !ok {
		t.Error("a suspect member was forgotten")
	}
}
