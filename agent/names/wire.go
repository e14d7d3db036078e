package names

import (
	"context"
	"errors"
	"time"
)

// Op names a registry operation on the wire.
type Op string

// The operations a Registry serves.
const (
	OpAcquire      Op = "acquire"
	OpConfirm      Op = "confirm"
	OpHold         Op = "hold"
	OpRelease      Op = "release"
	OpLookup       Op = "lookup"
	OpSetMembers   Op = "set_members"
	OpMove         Op = "move"
	OpSetRequest   Op = "set_request"
	OpStamp        Op = "stamp"
	OpRemoveMember Op = "remove_member"
	OpExpire       Op = "expire"
	OpAddVoter     Op = "add_voter"
	OpAddNonVoter  Op = "add_nonvoter"
	OpRemoveServer Op = "remove_server"
	// OpPing asks whether a server answers at all.
	OpPing Op = "ping"
	// OpStatus asks an agent what it knows of the registry (Status); read
	// only, answered by every agent, leader or not.
	OpStatus Op = "status"
)

// Request is one operation as it travels to the leader. The peer API that
// carries it must set Caller (acquire) and Owner (confirm, hold) to the
// calling agent's certificate name, never take them from the body.
type Request struct {
	Op      Op       `json:"op"`
	Key     Key      `json:"key,omitzero"`
	Caller  string   `json:"caller,omitempty"`
	Owner   string   `json:"owner,omitempty"`
	Node    string   `json:"node,omitempty"`
	Request string   `json:"request,omitempty"`
	Token   uint64   `json:"token,omitempty"`
	Members []string `json:"members,omitempty"`
	// To is the server a move takes the name to (Owner is where it is).
	To string `json:"to,omitempty"`
	// Stale lets any server answer a lookup from its own copy.
	Stale bool `json:"stale,omitempty"`
	// Recall (hold): refuse when the ID last ran on another server within
	// its remember window. Remember (release): how long to remember where
	// the released claim ID ran.
	Recall   bool          `json:"recall,omitempty"`
	Remember time.Duration `json:"remember,omitempty"`
	// Address is the raft address of a server to add.
	Address string `json:"address,omitempty"`
	// Filter selects the records of a list (OpList). It is a filter, not
	// an identity: the peer API never fills it from the caller.
	Filter *Filter `json:"filter,omitempty"`
}

// Response is a server's answer to a Request: a Result, or an Error.
type Response struct {
	Result *Result    `json:"result,omitempty"`
	Error  *WireError `json:"error,omitempty"`
	// Status answers OpStatus.
	Status *ServerStatus `json:"status,omitempty"`
}

// WireError is why a server did not produce a Result.
type WireError struct {
	// Code is "not_leader" (ask Leader, when set) or "unavailable".
	Code      string   `json:"code"`
	Message   string   `json:"message,omitempty"`
	Leader    string   `json:"leader,omitempty"`
	Unreached []string `json:"unreached,omitempty"`
	Uncertain bool     `json:"uncertain,omitempty"`
}

// ErrNotDelivered marks a Forwarder error after which the server
// certainly did not see the request.
var ErrNotDelivered = errors.New("request not delivered")

const (
	wireNotLeader   = "not_leader"
	wireUnavailable = "unavailable"
)

// Forwarder carries a Request to another registry server and returns its
// answer; the agent's mutual-TLS peer API is the real one. An error means
// the server did not answer; it wraps ErrNotDelivered when the request
// certainly never reached it (the connection was refused), so that a write
// can be sent elsewhere without doubt. Any other error leaves a write's
// outcome uncertain.
type Forwarder interface {
	Forward(ctx context.Context, server string, req Request) (Response, error)
}
