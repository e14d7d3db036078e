package names

import "github.com/hashicorp/raft"

// durableCommits is the raft transport of a voter whose log writes the
// leader's entries ahead (wal.appendAhead): every AppendEntries it sends
// tells the followers a commit index no higher than this server's durable
// log. Raft counts the leader's copy of an entry from its write, so its
// commit index may pass an entry whose only durable copy is a follower's;
// a follower that applied such an entry, and then saw the leader lose it
// in a power cut and the voters that lack it elect the next leader, would
// keep a state the others never had. With the commit index held back, an
// entry is applied anywhere only once the leader's copy is durable too,
// that is, once a majority holds it on disk, as raft requires. A lower
// commit index is always safe to send: followers only ever raise theirs,
// and the next AppendEntries (the next write's, or raft's every commit
// timeout) carries the rest.
type durableCommits struct {
	raft.Transport
	durable func() uint64
}

// transportWithAll is what a transport must offer to be wrapped: raft
// asks its transport for pre-vote and close support, and a wrapper that
// hid them would change how raft runs.
type transportWithAll interface {
	raft.Transport
	raft.WithClose
	raft.WithPreVote
}

var _ transportWithAll = durableCommits{}

// clamp holds args's commit index to the leader's durable log, and to the
// last entry the request proves the follower shares with the leader: its
// previous entry plus the entries it carries. The Raft paper bounds a
// follower's commit index by that "index of last new entry";
// hashicorp/raft bounds it by the follower's own last index instead, so a
// request with no entries and a high commit index would make a follower
// apply entries of an older term it holds past the previous entry, which
// the leader never had (a deposed leader's, which the new leader will
// overwrite).
func (t durableCommits) clamp(args *raft.AppendEntriesRequest) *raft.AppendEntriesRequest {
	bound := min(t.durable(), args.PrevLogEntry+uint64(len(args.Entries)))
	if args.LeaderCommitIndex > bound {
		held := *args
		held.LeaderCommitIndex = bound
		return &held
	}
	return args
}

// AppendEntries sends args with its commit index held to what is durable.
func (t durableCommits) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	return t.Transport.AppendEntries(id, target, t.clamp(args), resp)
}

// AppendEntriesPipeline is the transport's pipeline, its requests' commit
// index held as AppendEntries holds it.
func (t durableCommits) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	p, err := t.Transport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	return durablePipeline{AppendPipeline: p, t: t}, nil
}

type durablePipeline struct {
	raft.AppendPipeline
	t durableCommits
}

func (p durablePipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	return p.AppendPipeline.AppendEntries(p.t.clamp(args), resp)
}

// Close closes the transport.
func (t durableCommits) Close() error { return t.Transport.(raft.WithClose).Close() }

// RequestPreVote sends a pre-vote request.
func (t durableCommits) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	return t.Transport.(raft.WithPreVote).RequestPreVote(id, target, args, resp)
}
