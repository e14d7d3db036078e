package names

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"
)

// idFile holds, in a server's data directory, the ID of the registry it
// belongs to.
const idFile = "registry-id"

// maxIDLen bounds a registry ID: it travels in gossip metadata.
const maxIDLen = 96

// VotersID is the ID of a registry bootstrapped with a fixed voter list:
// the same on every voter, so that they agree without talking.
func VotersID(servers []Server) string {
	ids := make([]string, 0, len(servers))
	for _, s := range servers {
		ids = append(ids, s.ID)
	}
	slices.Sort(ids)
	sum := sha256.Sum256([]byte(strings.Join(ids, "\x00")))
	return "voters:" + hex.EncodeToString(sum[:6])
}

// FounderID is the ID of a registry one agent founded alone: its node name
// and the moment, so two registries founded apart never share one.
func FounderID(founder string, at time.Time) string {
	return fmt.Sprintf("%s@%x", founder, at.UnixNano())
}

// Bootstrap founds a new registry with servers as its voters and id as
// its name. It refuses when this server already holds raft state: it
// belongs to a registry already.
func (r *Registry) Bootstrap(servers []Server, id string) error {
	if r.raft == nil {
		return errors.New("name registry: a client cannot bootstrap a registry")
	}
	if r.HasState() {
		return fmt.Errorf("name registry: %s already belongs to a registry (%s)", r.cfg.Node, r.ID())
	}
	return r.bootstrap(servers, id)
}

func (r *Registry) bootstrap(servers []Server, id string) error {
	var c raft.Configuration
	for _, s := range servers {
		c.Servers = append(c.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(s.ID), Address: raft.ServerAddress(s.Address)})
	}
	if err := r.raft.BootstrapCluster(c).Error(); err != nil {
		if errors.Is(err, raft.ErrCantBootstrap) {
			return nil // raft state appeared meanwhile: it keeps that one
		}
		return fmt.Errorf("name registry: bootstrap with %d voters: %w", len(c.Servers), err)
	}
	r.mu.Lock()
	for _, s := range servers {
		r.known[s.ID] = true
	}
	r.mu.Unlock()
	return r.AdoptID(id)
}

// HasState reports whether this server belongs to a registry: it has a
// raft configuration (it bootstrapped, or a leader added it).
func (r *Registry) HasState() bool {
	if r.raft == nil {
		return false
	}
	f := r.raft.GetConfiguration()
	return f.Error() == nil && len(f.Configuration().Servers) > 0
}

// ID is the ID of the registry this server belongs to, "" when it does
// not know it (a client, or a server not yet told).
func (r *Registry) ID() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.id
}

// AdoptID records id as the registry this server belongs to, on disk
// when it has a data directory. A server learns it when it bootstraps, or
// from its leader.
func (r *Registry) AdoptID(id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.id == id {
		return nil
	}
	if r.cfg.DataDir != "" {
		if err := writeFileSync(filepath.Join(r.cfg.DataDir, idFile), []byte(id+"\n")); err != nil {
			return fmt.Errorf("name registry: recording the registry ID: %w", err)
		}
	}
	r.id = id
	return nil
}

func checkID(id string) error {
	if id == "" || len(id) > maxIDLen {
		return fmt.Errorf("name registry ID %q: must be 1 to %d bytes", id, maxIDLen)
	}
	for _, c := range id {
		if c <= ' ' || c > '~' {
			return fmt.Errorf("name registry ID %q: printable ASCII only", id)
		}
	}
	return nil
}

func readID(dir string) (string, error) {
	if dir == "" {
		return "", nil
	}
	b, err := os.ReadFile(filepath.Join(dir, idFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("name registry ID: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if err := checkID(id); err != nil {
		return "", fmt.Errorf("%s: %w (remove the file; the server learns the ID again from its leader)", filepath.Join(dir, idFile), err)
	}
	return id, nil
}

// writeFileSync replaces path with data, durably.
func writeFileSync(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Roles as Status and gossip name them.
const (
	StatusVoter    = "voter"
	StatusNonVoter = "non-voter"
	// StatusStandby runs raft but is in no registry's configuration yet:
	// a leader may add it.
	StatusStandby = "standby"
	StatusClient  = "client"
)

// ServerStatus is what an agent knows of the registry: its answer to
// OpStatus, and what its status page and metrics show.
type ServerStatus struct {
	Node string `json:"node"`
	// Role is voter, non-voter, standby or client.
	Role string `json:"role"`
	// Leader is the leader this agent knows of, "" when none.
	Leader string `json:"leader,omitempty"`
	// Registry is the ID of the registry this agent belongs to, "" when
	// it does not know one.
	Registry string `json:"registry,omitempty"`
	// HasState: this agent holds raft state (it belongs to a registry).
	HasState bool `json:"has_state,omitempty"`
	// Voters are the voters of its raft configuration.
	Voters []string `json:"voters,omitempty"`
	// LastContact is how long ago a follower last heard from its leader
	// (0 on the leader, and when never).
	LastContact time.Duration `json:"last_contact,omitempty"`
	// Halted: this server met a log entry it cannot apply (see FSM).
	Halted string `json:"halted,omitempty"`
}

// Status is what this agent knows of the registry now.
func (r *Registry) Status() ServerStatus {
	st := ServerStatus{Node: r.cfg.Node, Role: StatusClient, Leader: r.Leader(), Registry: r.ID()}
	if r.raft == nil {
		return st
	}
	st.Role = StatusStandby
	if f := r.raft.GetConfiguration(); f.Error() == nil {
		for _, s := range f.Configuration().Servers {
			st.HasState = true
			if s.Suffrage == raft.Voter {
				st.Voters = append(st.Voters, string(s.ID))
			}
			if string(s.ID) != r.cfg.Node {
				continue
			}
			if s.Suffrage == raft.Voter {
				st.Role = StatusVoter
			} else {
				st.Role = StatusNonVoter
			}
		}
	}
	slices.Sort(st.Voters)
	if r.raft.State() != raft.Leader {
		if t := r.raft.LastContact(); !t.IsZero() {
			st.LastContact = time.Since(t)
		}
	}
	r.fsm.mu.RLock()
	if r.fsm.halted != nil {
		st.Halted = r.fsm.halted.Error()
	}
	r.fsm.mu.RUnlock()
	return st
}

// Voters are the voters of this server's raft configuration, with their
// addresses as raft stored them; nil for a client.
func (r *Registry) Voters() []Server {
	if r.raft == nil {
		return nil
	}
	f := r.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	var out []Server
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			out = append(out, Server{ID: string(s.ID), Address: string(s.Address)})
		}
	}
	return out
}

// TransferLeadership hands the leadership to another voter before this
// server stops, so the registry does not wait out an election timeout;
// a no-op unless this server leads and another voter exists.
func (r *Registry) TransferLeadership(timeout time.Duration) error {
	if !r.IsLeader() || len(r.Voters()) < 2 {
		return nil
	}
	f := r.raft.LeadershipTransfer()
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		return errors.New("name registry: leadership transfer timed out")
	}
}

// InConfiguration reports whether node is in this server's raft
// configuration, voter or not.
func (r *Registry) InConfiguration(node string) bool {
	if r.raft == nil {
		return false
	}
	f := r.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == node {
			return true
		}
	}
	return false
}

// WireNotLeader is the wire code of an answer from a server that does not
// lead; an agent that runs no registry answers it too.
const WireNotLeader = wireNotLeader
