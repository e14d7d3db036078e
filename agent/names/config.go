package names

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"time"

	"github.com/hashicorp/raft"
)

// Role is what an agent does in the registry.
type Role int

// The roles. Voters keep the log and vote; non-voters keep a copy of the
// log and can answer stale reads; clients keep nothing and forward.
const (
	RoleClient Role = iota
	RoleVoter
	RoleNonVoter
)

func (r Role) String() string {
	switch r {
	case RoleVoter:
		return "voter"
	case RoleNonVoter:
		return "non-voter"
	}
	return "client"
}

// Server is one registry server: its node name (the raft server ID) and
// its raft address.
type Server struct {
	ID      string `json:"id"`
	Address string `json:"address"`
}

// Timing holds raft's timeouts and the registry's own waits.
type Timing struct {
	Heartbeat   time.Duration
	Election    time.Duration
	LeaderLease time.Duration
	Commit      time.Duration
	// Hold is how long an operation waits for a leader (an election, a
	// restarting server) before answering unavailable.
	Hold time.Duration
	// Expire is how often the leader looks for lapsed pending names.
	Expire time.Duration
	// SnapshotInterval and SnapshotThreshold: raft snapshots when at least
	// Threshold entries were written since the last one, checked every
	// Interval.
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64
	// TrailingLogs is how many entries a snapshot leaves in the log, so a
	// follower that lags by fewer catches up without the whole snapshot.
	TrailingLogs uint64
}

// LANTiming is for servers on one network: raft's own defaults.
func LANTiming() Timing {
	return Timing{
		Heartbeat: time.Second, Election: time.Second, LeaderLease: 500 * time.Millisecond,
		Commit: 50 * time.Millisecond, Hold: 5 * time.Second, Expire: time.Second,
		SnapshotInterval: 2 * time.Minute, SnapshotThreshold: 8192, TrailingLogs: 10240,
	}
}

// FastTiming is for tests in one process: short enough for many elections
// a test, long enough that a loaded 2-core machine running -race does not
// make the leader step down between two heartbeats.
func FastTiming() Timing {
	return Timing{
		Heartbeat: 250 * time.Millisecond, Election: 250 * time.Millisecond, LeaderLease: 250 * time.Millisecond,
		Commit: 5 * time.Millisecond, Hold: 2 * time.Second, Expire: 20 * time.Millisecond,
		SnapshotInterval: time.Second, SnapshotThreshold: 8192, TrailingLogs: 10240,
	}
}

// Config is what Open needs.
type Config struct {
	// Node is this agent's node name.
	Node string
	Role Role
	// Servers are the configured voters: the cluster bootstraps with them,
	// and clients ask them for the leader. It may be empty when Discover
	// is set and the registry is bootstrapped later (Bootstrap).
	Servers []Server
	// Discover, when set, names more registry servers to ask for the
	// leader (the agent's gossip view), the likeliest leader first.
	Discover func() []string
	// DataDir holds the raft log (names.db) and snapshots; empty keeps
	// everything in memory, for tests only.
	DataDir string
	// Transport carries raft between servers (NewTLSTransport, or
	// raft.InmemTransport in tests); the registry closes it. Not used by
	// clients.
	Transport raft.Transport
	// Forwarder reaches other registry servers.
	Forwarder Forwarder
	// Clock stamps time on commands when this server leads; nil is time.Now.
	Clock func() time.Time
	// Lease is how long a pending name lives unconfirmed.
	Lease  time.Duration
	Limits Limits
	Timing Timing
	Logger *slog.Logger
	// StorageResult, when set, is told the outcome of every write to the
	// raft log, the stable store and the snapshots (part StorageLog or
	// StorageSnapshots; err nil when it succeeded); it must be quick.
	StorageResult func(part, op string, err error)
	// StorageTime, when set, is told how long every write to the raft
	// log and the stable store that succeeded took (part StorageLog; op
	// "append", "stable"), fsync included; it must be quick.
	StorageTime func(part, op string, d time.Duration)
}

// DefaultLease matches the owners' reservation lease.
const DefaultLease = 30 * time.Second

func (c *Config) fill() error {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Limits == (Limits{}) {
		c.Limits = DefaultLimits()
	}
	if c.Timing == (Timing{}) {
		c.Timing = LANTiming()
	}
	if err := checkNode("names node", c.Node); err != nil {
		return err
	}
	if len(c.Servers) == 0 && c.Discover == nil {
		return errors.New("names servers: no registry voters configured")
	}
	seen := map[string]bool{}
	for _, s := range c.Servers {
		if err := checkNode("names server", s.ID); err != nil {
			return err
		}
		if s.Address == "" {
			return fmt.Errorf("names server %s has no address", s.ID)
		}
		if seen[s.ID] {
			return fmt.Errorf("names server %s is listed twice", s.ID)
		}
		seen[s.ID] = true
	}
	if len(c.Servers) > 0 && len(c.Servers)%2 == 0 {
		return fmt.Errorf("names servers: %d voters; use an odd number (3 or 5): an even one tolerates no more failures than one fewer", len(c.Servers))
	}
	if c.Role != RoleClient && c.Transport == nil {
		return fmt.Errorf("names: a %s needs a raft transport", c.Role)
	}
	if c.Role == RoleVoter && !seen[c.Node] {
		return fmt.Errorf("names: %s starts as a voter but is not among the configured servers", c.Node)
	}
	if c.Forwarder == nil && (c.Role == RoleClient || len(c.Servers) > 1 || c.Discover != nil) {
		return errors.New("names: no forwarder to reach the leader")
	}
	return nil
}

// ChooseVoters picks n voters from the configured members by rendezvous
// hash, so every agent picks the same ones without talking, and names that
// share a prefix (a rack, a row) do not all land together as a sorted
// pick would have them. Fewer members than n: all of them.
func ChooseVoters(members []string, n int) []string {
	out := RankVoters(members)
	out = out[:min(n, len(out))]
	slices.Sort(out)
	return out
}

// RankVoters orders members (without duplicates) as ChooseVoters prefers
// them: ChooseVoters(members, n) is the first n of it, sorted.
func RankVoters(members []string) []string {
	type scored struct {
		name  string
		score uint64
	}
	all := make([]scored, 0, len(members))
	for _, m := range slices.Compact(slices.Sorted(slices.Values(members))) {
		h := fnv.New64a()
		h.Write([]byte("gpuherd-names-voter\x00" + m))
		all = append(all, scored{m, h.Sum64()})
	}
	slices.SortFunc(all, func(a, b scored) int {
		if a.score != b.score {
			if a.score > b.score {
				return -1
			}
			return 1
		}
		if a.name < b.name {
			return -1
		}
		return 1
	})
	out := make([]string, 0, len(all))
	for _, s := range all {
		out = append(out, s.name)
	}
	return out
}
