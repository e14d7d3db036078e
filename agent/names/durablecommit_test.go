package names

import (
	"testing"

	"github.com/hashicorp/raft"
)

// sentCommits is a transport that records the commit index of every
// AppendEntries sent through it, directly or by its pipeline.
type sentCommits struct {
	raft.Transport
	sent []uint64
}

func (s *sentCommits) AppendEntries(_ raft.ServerID, _ raft.ServerAddress, args *raft.AppendEntriesRequest, _ *raft.AppendEntriesResponse) error {
	s.sent = append(s.sent, args.LeaderCommitIndex)
	return nil
}

func (s *sentCommits) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return &sentPipeline{s: s}, nil
}

type sentPipeline struct {
	raft.AppendPipeline
	s *sentCommits
}

func (p *sentPipeline) AppendEntries(args *raft.AppendEntriesRequest, _ *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	p.s.sent = append(p.s.sent, args.LeaderCommitIndex)
	return nil, nil
}

// The followers never hear a commit index past what the leader's own log
// has on disk, whichever way raft sends its entries; raft's own request
// is left as it was (its pipeline reads it back when answered).
func TestFollowersHearOnlyDurableCommits(t *testing.T) {
	rec := &sentCommits{}
	durable := uint64(7)
	tr := durableCommits{Transport: rec, durable: func() uint64 { return durable }}
	p, err := tr.AppendEntriesPipeline("b", "b")
	if err != nil {
		t.Fatal(err)
	}
	for _, commit := range []uint64{0, 5, 7, 10} {
		args := &raft.AppendEntriesRequest{LeaderCommitIndex: commit, PrevLogEntry: 8, Entries: []*raft.Log{{Index: 9}, {Index: 10}}}
		if err := tr.AppendEntries("b", "b", args, &raft.AppendEntriesResponse{}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.AppendEntries(args, &raft.AppendEntriesResponse{}); err != nil {
			t.Fatal(err)
		}
		if args.LeaderCommitIndex != commit {
			t.Fatalf("raft's request changed: commit %d, sent %d", args.LeaderCommitIndex, commit)
		}
	}
	want := []uint64{0, 0, 5, 5, 7, 7, 7, 7}
	if len(rec.sent) != len(want) {
		t.Fatalf("sent %v, want %v", rec.sent, want)
	}
	for i := range want {
		if rec.sent[i] != want[i] {
			t.Fatalf("sent %v, want %v (durable up to %d)", rec.sent, want, durable)
		}
	}
	durable = 12
	if err := tr.AppendEntries("b", "b", &raft.AppendEntriesRequest{LeaderCommitIndex: 10, PrevLogEntry: 10}, &raft.AppendEntriesResponse{}); err != nil {
		t.Fatal(err)
	}
	if got := rec.sent[len(rec.sent)-1]; got != 10 {
		t.Fatalf("commit 10 with the log durable up to 12: sent %d", got)
	}
	// A request proves the follower shares the leader's log up to its
	// previous entry and the entries it carries, no further: entries the
	// follower holds past them may be a deposed leader's.
	if err := tr.AppendEntries("b", "b", &raft.AppendEntriesRequest{LeaderCommitIndex: 11, PrevLogEntry: 6}, &raft.AppendEntriesResponse{}); err != nil {
		t.Fatal(err)
	}
	if got := rec.sent[len(rec.sent)-1]; got != 6 {
		t.Fatalf("commit 11 in a request whose previous entry is 6 and that carries none: sent %d, want 6", got)
	}
}

// A voter on disk with a transport that offers everything raft asks of
// one writes its leader's entries ahead; one whose transport lacks
// pre-vote or close keeps its appends synchronous rather than change how
// raft runs.
func TestWriteAheadOnlyWithAFullTransport(t *testing.T) {
	_, full := raft.NewInmemTransport("node-a")
	if _, ok := raft.Transport(full).(transportWithAll); !ok {
		t.Fatal("raft's in-memory transport lacks what a full one has")
	}
	if _, ok := raft.Transport(&sentCommits{}).(transportWithAll); ok {
		t.Fatal("a bare transport counted as full")
	}
	reg := singleVoter(t, t.TempDir())
	defer reg.Close()
	if _, wrapped := reg.trans.(durableCommits); !wrapped || reg.fsm.durable == nil || reg.store.leading.Load() == nil {
		t.Fatalf("a voter on disk with a full transport: transport %T, state machine waiting %v, writing ahead %v; want all three",
			reg.trans, reg.fsm.durable != nil, reg.store.leading.Load() != nil)
	}
}
