package gossip

import (
	"net"
	"testing"
	"time"
)

func freeIn(t *testing.T, v *view, name string) (free int, rev uint64) {
	t.Helper()
	m, ok := v.member(name)
	if !ok {
		t.Fatalf("%s is not in the view", name)
	}
	for _, c := range m.Summary.Models {
		free += int(c.Free)
	}
	return free, m.Summary.Revision
}

func capacity(boot, rev uint64, free uint16) Summary {
	return Summary{PeerAddr: "127.0.0.1:9", Boot: boot, Revision: rev,
		Models: []ModelCapacity{{Model: "NVIDIA L40S", Total: 4, Free: free, Healthy: 4}}}
}

// TestLearnTakesOnlyNewerCapacityOfTheSameRun: a summary a member sent
// itself replaces the capacity in the view when it is of the same run of
// its agent and has a higher revision, and nothing else.
func TestLearnTakesOnlyNewerCapacityOfTheSameRun(t *testing.T) {
	lo := net.IPv4(127, 0, 0, 1)
	v := newView("a", time.Minute)
	v.alive("a", lo, 1, mustEncode(t, capacity(1, 1, 4)))
	v.alive("b", lo, 2, mustEncode(t, capacity(7, 10, 4)))
	v.alive("dead", lo, 3, mustEncode(t, capacity(7, 10, 4)))
	v.gone("dead", nil)
	v.alive("odd", lo, 4, []byte{0xC9, 1}) // a summary this agent cannot read

	for _, c := range []struct {
		what string
		name string
		s    Summary
	}{
		{"an older revision", "b", capacity(7, 9, 1)},
		{"the same revision", "b", capacity(7, 10, 1)},
		{"another run of the agent", "b", capacity(8, 11, 1)},
		{"a member not in the view", "zz", capacity(7, 11, 1)},
		{"a dead member", "dead", capacity(7, 11, 1)},
		{"a member whose gossiped summary does not decode", "odd", capacity(7, 11, 1)},
		{"this agent itself", "a", capacity(1, 2, 1)},
	} {
		if v.learn(c.name, c.s) {
			t.Errorf("%s: learned", c.what)
		}
	}
	if free, rev := freeIn(t, v, "b"); free != 4 || rev != 10 {
		t.Fatalf("b after refused summaries: %d free at revision %d, want 4 at 10", free, rev)
	}

	before := v.list()
	ch, stop := v.subscribe(false)
	defer stop()
	if !v.learn("b", capacity(7, 12, 1)) {
		t.Fatal("a newer revision of the same run was not learned")
	}
	if free, rev := freeIn(t, v, "b"); free != 1 || rev != 12 {
		t.Fatalf("b learned: %d free at revision %d, want 1 at 12", free, rev)
	}
	select {
	case <-ch:
	default:
		t.Error("learning a capacity did not tell the view's subscribers")
	}
	for _, m := range before {
		if m.Name == "b" && (m.Summary.Revision != 10 || m.Summary.Models[0].Free != 4) {
			t.Errorf("a list read before learning changed under its reader: %+v", m.Summary)
		}
	}
	// A suspect member is still listed with its capacity: it may be learned.
	v.suspect("b")
	if !v.learn("b", capacity(7, 13, 2)) {
		t.Error("a suspect member's newer capacity was not learned")
	}
}

// TestLearnedCapacityOutlivesAnOlderAdvertisement: memberlist may deliver
// an advertisement the member encoded before its answer; the learned,
// newer capacity stays, while everything else in the advertisement (its
// flags) is taken. A newer advertisement, or another run, replaces it.
func TestLearnedCapacityOutlivesAnOlderAdvertisement(t *testing.T) {
	lo := net.IPv4(127, 0, 0, 1)
	v := newView("a", time.Minute)
	v.alive("b", lo, 2, mustEncode(t, capacity(7, 10, 4)))
	if !v.learn("b", capacity(7, 12, 1)) {
		t.Fatal("not learned")
	}

	older := capacity(7, 11, 3)
	older.Drained = true
	v.alive("b", lo, 2, mustEncode(t, older))
	m, _ := v.member("b")
	if free, rev := freeIn(t, v, "b"); free != 1 || rev != 12 {
		t.Errorf("after an older advertisement: %d free at revision %d, want the learned 1 at 12", free, rev)
	}
	if !m.Summary.Drained {
		t.Error("the older advertisement's drain flag was not taken")
	}

	v.alive("b", lo, 2, mustEncode(t, capacity(7, 13, 2)))
	if free, rev := freeIn(t, v, "b"); free != 2 || rev != 13 {
		t.Errorf("after a newer advertisement: %d free at revision %d, want 2 at 13", free, rev)
	}
	v.alive("b", lo, 2, mustEncode(t, capacity(9, 1, 4)))
	if free, rev := freeIn(t, v, "b"); free != 4 || rev != 1 {
		t.Errorf("after a restart of b's agent: %d free at revision %d, want 4 at 1", free, rev)
	}
}

// TestLearnFromLocalSummary: what one cluster's LocalSummary encodes,
// another's Learn reads; bytes that are no summary are refused.
func TestLearnFromLocalSummary(t *testing.T) {
	c := &Cluster{local: func() Summary { return capacity(7, 12, 1) }, view: newView("a", time.Minute)}
	c.view.alive("b", net.IPv4(127, 0, 0, 1), 2, mustEncode(t, capacity(7, 10, 4)))
	if c.Learn("b", []byte("not a summary")) {
		t.Error("bytes that are no summary were learned")
	}
	if !c.Learn("b", c.LocalSummary()) {
		t.Fatal("LocalSummary's encoding was not learned")
	}
	if free, rev := freeIn(t, c.view, "b"); free != 1 || rev != 12 {
		t.Errorf("%d free at revision %d, want 1 at 12", free, rev)
	}
	c.closing.Store(true)
	if c.LocalSummary() != nil {
		t.Error("a leaving agent still answers with its summary")
	}
}
