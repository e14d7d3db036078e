package names

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func TestRankVotersOrdersWhatChooseVotersPicks(t *testing.T) {
	members := []string{"gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-2"}
	rank := RankVoters(members)
	if len(rank) != 6 {
		t.Fatalf("rank %v: want each member once", rank)
	}
	for n := 1; n <= 6; n++ {
		want := slices.Sorted(slices.Values(rank[:n]))
		if got := ChooseVoters(members, n); !slices.Equal(got, want) {
			t.Errorf("ChooseVoters(%d) = %v, want the first %d of %v", n, got, n, rank)
		}
	}
}

func TestVotersIDIsTheSameForTheSameList(t *testing.T) {
	a := VotersID([]Server{{ID: "a"}, {ID: "b"}, {ID: "c"}})
	b := VotersID([]Server{{ID: "c", Address: "x"}, {ID: "a"}, {ID: "b"}})
	if a != b || a == VotersID([]Server{{ID: "a"}, {ID: "b"}, {ID: "d"}}) {
		t.Errorf("IDs %q, %q", a, b)
	}
	if FounderID("a", time.Unix(1, 0)) == FounderID("a", time.Unix(2, 0)) {
		t.Error("two foundings share an ID")
	}
}

// TestBootstrapLaterKeepsItsID: a server opened with no voters (standby)
// belongs to no registry; once bootstrapped it leads, knows its ID, and
// after a restart on its data directory still has both.
func TestBootstrapLaterKeepsItsID(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a")
	open := func() *Registry {
		_, trans := raft.NewInmemTransportWithTimeout("a", time.Second)
		r, err := Open(Config{Node: "a", Role: RoleNonVoter, DataDir: dir, Transport: trans,
			Forwarder: NewMemNetwork().From("a"), Discover: func() []string { return nil }, Timing: FastTiming()})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := open()
	if st := r.Status(); st.Role != StatusStandby || st.HasState || st.Registry != "" || r.HasState() {
		t.Fatalf("before bootstrap: %+v", st)
	}
	if r.InConfiguration("a") {
		t.Error("a standby is in a configuration")
	}
	id := FounderID("a", time.Now())
	if err := r.Bootstrap([]Server{{ID: "a", Address: "a"}}, id); err != nil {
		t.Fatal(err)
	}
	if err := r.Bootstrap([]Server{{ID: "a", Address: "a"}}, "other"); err == nil {
		t.Error("a second bootstrap was accepted")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !r.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("no leader after bootstrap")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := r.Status(); st.Role != StatusVoter || !st.HasState || st.Registry != id || !slices.Equal(st.Voters, []string{"a"}) {
		t.Errorf("after bootstrap: %+v", st)
	}
	r.Close()
	r = open()
	defer r.Close()
	if st := r.Status(); st.Registry != id || !st.HasState {
		t.Errorf("after a restart: %+v", st)
	}
	if err := r.AdoptID("bad id with spaces"); err == nil {
		t.Error("a bad ID was adopted")
	}
}
