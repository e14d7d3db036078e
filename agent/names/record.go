package names

import (
	"fmt"
	"strings"
	"time"
	"unicode"
)

// Kind says which namespace a name lives in.
type Kind string

// The namespaces the registry keeps.
const (
	KindClaim Kind = "claim"
	KindGroup Kind = "group"
)

// maxName bounds a name; claim IDs and group names are far shorter.
const maxName = 253

// Key identifies one name.
type Key struct {
	Kind Kind   `json:"kind"`
	Name string `json:"name"`
}

// Claim is the key of a claim ID.
func Claim(id string) Key { return Key{Kind: KindClaim, Name: id} }

// Group is the key of a node-group name.
func Group(name string) Key { return Key{Kind: KindGroup, Name: name} }

func (k Key) String() string { return string(k.Kind) + " " + k.Name }

func (k Key) validate() error {
	switch k.Kind {
	case KindClaim, KindGroup:
	default:
		return fmt.Errorf("name kind %q: want %q or %q", k.Kind, KindClaim, KindGroup)
	}
	switch {
	case k.Name == "":
		return fmt.Errorf("%s name is empty", k.Kind)
	case len(k.Name) > maxName:
		return fmt.Errorf("%s name is %d bytes; at most %d are allowed", k.Kind, len(k.Name), maxName)
	case strings.IndexFunc(k.Name, func(r rune) bool { return !unicode.IsPrint(r) || r == unicode.ReplacementChar }) >= 0:
		return fmt.Errorf("%s name %q holds a character that is not printable", k.Kind, k.Name)
	}
	return nil
}

// State is where a name is in its life.
type State string

// The states of a name. A released name has no record: released is only
// ever the state of the record a Release answers with.
const (
	// StatePending: acquired by a caller that is placing it; it lapses at
	// its deadline unless the owner confirms it first.
	StatePending State = "pending"
	// StateHeld: confirmed by the owner that committed it.
	StateHeld State = "held"
	// StateReleased: let go; the name is free.
	StateReleased State = "released"
	// StateLost: its owner was removed from the cluster for good; the name
	// stays taken until someone releases it.
	StateLost State = "lost"
)

// Record is the registry's truth about one name.
type Record struct {
	Kind Kind   `json:"kind"`
	Name string `json:"name"`
	// Owner is the server that holds the name: for a pending name the
	// server the caller means to place it on, when it said so.
	Owner string `json:"owner,omitempty"`
	// Caller is the agent that acquired the name (a claim's coordinator).
	Caller string `json:"caller"`
	// Request is the digest of the request the name was acquired for; a
	// retry of the same request gets the same record back.
	Request string `json:"request"`
	State   State  `json:"state"`
	// Token is the raft index of the write that granted the name: it only
	// grows, for a name as for the whole registry, so an older token is a
	// grant that no longer holds.
	Token uint64 `json:"token"`
	// Deadline ends a pending name that no owner confirmed in time.
	Deadline time.Time `json:"deadline,omitzero"`
	// Members are a group's node claim IDs.
	Members []string `json:"members,omitempty"`
	// Index is the raft index of the record's last change.
	Index uint64 `json:"index"`
	// Move is a move of the held name to another server in progress: the
	// name stays held on Owner under Token until Move.To confirms
	// Move.Token, or the move lapses at Move.Deadline.
	Move *Move `json:"move,omitempty"`
	// MovedFrom is the server the name was held on before its last move.
	MovedFrom string `json:"moved_from,omitempty"`
}

// Move is a held name on its way to another server (Record.Move).
type Move struct {
	// To is the server that will hold the name once it confirms Token.
	To string `json:"to"`
	// Token is the raft index of the move: the name's token once To
	// confirms it.
	Token uint64 `json:"token"`
	// Deadline ends a move that To did not confirm in time.
	Deadline time.Time `json:"deadline"`
	// Caller is the agent moving the name (the resize's coordinator).
	Caller string `json:"caller"`
}

// Key returns the record's key.
func (r Record) Key() Key { return Key{Kind: r.Kind, Name: r.Name} }

// live reports whether a record still holds its name at now: a pending
// one lapses at its deadline, like a ledger reservation.
func (r Record) live(now time.Time) bool {
	return r.State != StatePending || now.Before(r.Deadline)
}

// holder names who answers for the name: the owner once held, the caller
// while pending.
func (r Record) holder() string {
	if r.State == StatePending || r.Owner == "" {
		return r.Caller
	}
	return r.Owner
}

func (r Record) clone() Record {
	r.Members = append([]string(nil), r.Members...)
	if len(r.Members) == 0 {
		r.Members = nil
	}
	if r.Move != nil {
		m := *r.Move
		r.Move = &m
	}
	return r
}

// at is the record as it stands at now: a move that lapsed is gone.
func (r Record) at(now time.Time) Record {
	r = r.clone()
	if r.Move != nil && !now.Before(r.Move.Deadline) {
		r.Move = nil
	}
	return r
}

func (r Record) validate() error {
	if err := r.Key().validate(); err != nil {
		return err
	}
	switch r.State {
	case StatePending:
		if r.Deadline.IsZero() {
			return fmt.Errorf("%s is pending without a deadline", r.Key())
		}
	case StateHeld, StateLost:
		if r.Owner == "" {
			return fmt.Errorf("%s is %s without an owner", r.Key(), r.State)
		}
	default:
		return fmt.Errorf("%s has state %q", r.Key(), r.State)
	}
	if r.Caller == "" || r.Request == "" || r.Token == 0 {
		return fmt.Errorf("%s lacks its caller, request or token", r.Key())
	}
	if r.Kind == KindClaim && len(r.Members) > 0 {
		return fmt.Errorf("%s has members; only groups have them", r.Key())
	}
	if m := r.Move; m != nil {
		switch {
		case r.State != StateHeld:
			return fmt.Errorf("%s is %s and moving; only a held name moves", r.Key(), r.State)
		case m.To == "" || m.Caller == "" || m.Token == 0 || m.Deadline.IsZero():
			return fmt.Errorf("%s: its move lacks its server, caller, token or deadline", r.Key())
		}
	}
	return nil
}
