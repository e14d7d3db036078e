package names

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/gpuherd/gpuherd/agent/pki"
)

// messageType is the first byte after the codec version of every command
// in the raft log. Values are never reused: a log written by one version
// is read by the next.
type messageType uint8

const (
	messageAcquire      messageType = 1
	messageConfirm      messageType = 2
	messageRelease      messageType = 3
	messageExpire       messageType = 4
	messageRemoveMember messageType = 5
	messageSetMembers   messageType = 6
	messageMove         messageType = 7
	messageSetRequest   messageType = 8
	messageHold         messageType = 9
	messageStamp        messageType = 10
)

func (t messageType) String() string {
	switch t {
	case messageAcquire:
		return "acquire"
	case messageConfirm:
		return "confirm"
	case messageRelease:
		return "release"
	case messageExpire:
		return "expire"
	case messageRemoveMember:
		return "remove-member"
	case messageSetMembers:
		return "set-members"
	case messageMove:
		return "move"
	case messageSetRequest:
		return "set-request"
	case messageHold:
		return "hold"
	case messageStamp:
		return "stamp"
	}
	return fmt.Sprintf("message type %d", uint8(t))
}

// codecVersion is the first byte of every command. A server that reads a
// version or a field it does not know stops applying the log (see FSM)
// instead of skipping it: skipping would leave its copy different from the
// others'.
const codecVersion byte = 1

// Limits bound what one caller can hold in the registry. The leader stamps
// its limits on each command, so every server applies the same ones.
type Limits struct {
	// PendingPerCaller bounds the names one caller is placing at once.
	PendingPerCaller int `json:"pending_per_caller"`
	// HeldPerOwner bounds the names one server holds.
	HeldPerOwner int `json:"held_per_owner"`
	// Members bounds a group's node claims.
	Members int `json:"members"`
}

// DefaultLimits are generous for real use (a server holds a claim per GPU
// at most, a coordinator places a few claims at once) and small enough that
// a misbehaving caller cannot grow the registry without bound.
func DefaultLimits() Limits {
	return Limits{PendingPerCaller: 1024, HeldPerOwner: 4096, Members: 1024}
}

// acquireMessage asks for a name for a request. A pending name lapses at
// Now+Lease unless confirmed.
type acquireMessage struct {
	Key     Key           `json:"key"`
	Caller  string        `json:"caller"`
	Owner   string        `json:"owner,omitempty"`
	Request string        `json:"request"`
	Members []string      `json:"members,omitempty"`
	Now     time.Time     `json:"now"`
	Lease   time.Duration `json:"lease"`
	Limits  Limits        `json:"limits"`
}

// holdMessage is a claim's one registry write, sent by the server that
// commits the claim: the name becomes held on Owner in one step, unless
// it is held or being placed already. Caller is the coordinator that
// placed it there, kept for the operator's view.
type holdMessage struct {
	Key     Key       `json:"key"`
	Owner   string    `json:"owner"`
	Caller  string    `json:"caller,omitempty"`
	Request string    `json:"request"`
	Now     time.Time `json:"now"`
	Limits  Limits    `json:"limits"`
	// Recall refuses the hold when the ID last ran on another server
	// within its remember window (CodeRecalled): a claim placed without
	// any_node goes back there. Older versions send none and halt on it.
	Recall bool `json:"recall,omitempty"`
}

// confirmMessage is sent by the server that commits the name, under the
// token it was granted with.
type confirmMessage struct {
	Key   Key    `json:"key"`
	Token uint64 `json:"token"`
	Owner string `json:"owner"`
	// Caller, when set and not Owner, is the coordinator of a move that
	// confirms it for Owner (undoing a move whose old copy stays); it
	// must be the move's own caller.
	Caller  string    `json:"caller,omitempty"`
	Members []string  `json:"members,omitempty"`
	Now     time.Time `json:"now"`
	Limits  Limits    `json:"limits"`
}

// releaseMessage frees a name. Token, when set, must be the name's
// current token; Node, when set, must be its holder (owner, or caller
// while pending). At least one is set.
type releaseMessage struct {
	Key   Key    `json:"key"`
	Token uint64 `json:"token,omitempty"`
	Node  string `json:"node,omitempty"`
	// Remember, when set, keeps where a released claim ID last ran until
	// Now+Remember (the owner's remember_released), for holds that recall
	// it. Older versions send neither and halt on them.
	Remember time.Duration `json:"remember,omitempty"`
	Now      time.Time     `json:"now,omitzero"`
}

// expireMessage ends the pending names whose deadline is not after Now.
type expireMessage struct {
	Now time.Time `json:"now"`
}

// removeMemberMessage declares a server gone for good: the names it holds
// become lost, the names it was placing are dropped.
type removeMemberMessage struct {
	Node string    `json:"node"`
	Now  time.Time `json:"now"`
}

// setMembersMessage replaces a group's node claims under its token.
type setMembersMessage struct {
	Key     Key      `json:"key"`
	Token   uint64   `json:"token"`
	Members []string `json:"members"`
	Limits  Limits   `json:"limits"`
}

// moveMessage starts moving a held name from its owner to another server
// (a claim resized onto another server): the name stays held on From under
// Token until To confirms the move's own token, or the move lapses at
// Now+Lease and the name simply stays where it was.
type moveMessage struct {
	Key    Key           `json:"key"`
	Token  uint64        `json:"token"`
	From   string        `json:"from"`
	To     string        `json:"to"`
	Caller string        `json:"caller"`
	Now    time.Time     `json:"now"`
	Lease  time.Duration `json:"lease"`
}

// setRequestMessage replaces a held group's request digest under its
// token: the group's request after a resize, so that its record keeps
// saying what every node has.
type setRequestMessage struct {
	Key     Key    `json:"key"`
	Token   uint64 `json:"token"`
	Request string `json:"request"`
}

// stampMessage marks a held group's record as changed, under its token,
// without changing anything else: a group operation's start, which every
// older operation on the group sees (its Index moves) and stops at.
type stampMessage struct {
	Key   Key    `json:"key"`
	Token uint64 `json:"token"`
}

func encodeMessage(t messageType, body any) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte(codecVersion)
	buf.WriteByte(byte(t))
	if err := json.NewEncoder(&buf).Encode(body); err != nil {
		return nil, fmt.Errorf("encode %s: %w", t, err)
	}
	return buf.Bytes(), nil
}

// decodeMessage reads a command written by encodeMessage and checks it.
func decodeMessage(b []byte) (messageType, any, error) {
	if len(b) < 2 {
		return 0, nil, fmt.Errorf("command of %d bytes is too short", len(b))
	}
	if b[0] != codecVersion {
		return 0, nil, fmt.Errorf("command codec version %d; this version reads %d", b[0], codecVersion)
	}
	t := messageType(b[1])
	var body interface{ check() error }
	switch t {
	case messageAcquire:
		body = new(acquireMessage)
	case messageConfirm:
		body = new(confirmMessage)
	case messageRelease:
		body = new(releaseMessage)
	case messageExpire:
		body = new(expireMessage)
	case messageRemoveMember:
		body = new(removeMemberMessage)
	case messageSetMembers:
		body = new(setMembersMessage)
	case messageMove:
		body = new(moveMessage)
	case messageSetRequest:
		body = new(setRequestMessage)
	case messageHold:
		body = new(holdMessage)
	case messageStamp:
		body = new(stampMessage)
	default:
		return t, nil, fmt.Errorf("unknown %s", t)
	}
	dec := json.NewDecoder(bytes.NewReader(b[2:]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(body); err != nil {
		return t, nil, fmt.Errorf("decode %s: %w", t, err)
	}
	// What json.Decoder.More says, read in place (More would grow the
	// decoder's buffer to look): anything after the value but JSON's white
	// space, or a closing bracket, is trailing data. Every server must
	// refuse exactly what the others refuse.
	if rest := bytes.TrimLeft(b[2+dec.InputOffset():], " \t\n\r"); len(rest) > 0 && rest[0] != ']' && rest[0] != '}' {
		return t, nil, fmt.Errorf("decode %s: trailing data", t)
	}
	if err := body.check(); err != nil {
		return t, nil, fmt.Errorf("%s: %w", t, err)
	}
	return t, body, nil
}

func checkNode(what, name string) error {
	if err := pki.ValidateNodeName(name); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func checkMembers(k Key, members []string) error {
	if k.Kind != KindGroup && len(members) > 0 {
		return fmt.Errorf("%s: only groups have members", k)
	}
	for _, m := range members {
		if err := Claim(m).validate(); err != nil {
			return fmt.Errorf("%s member: %w", k, err)
		}
	}
	return nil
}

func (m *acquireMessage) check() error {
	if err := m.Key.validate(); err != nil {
		return err
	}
	if err := checkNode("caller", m.Caller); err != nil {
		return err
	}
	if m.Owner != "" {
		if err := checkNode("owner", m.Owner); err != nil {
			return err
		}
	}
	if m.Request == "" || len(m.Request) > maxName {
		return fmt.Errorf("%s: request digest must be 1 to %d bytes", m.Key, maxName)
	}
	if m.Lease <= 0 || m.Now.IsZero() {
		return fmt.Errorf("%s: acquire carries no time or lease", m.Key)
	}
	return checkMembers(m.Key, m.Members)
}

func (m *holdMessage) check() error {
	if err := m.Key.validate(); err != nil {
		return err
	}
	if m.Key.Kind != KindClaim {
		return fmt.Errorf("%s: only a claim ID is held in one step; a group is acquired and confirmed", m.Key)
	}
	if err := checkNode("owner", m.Owner); err != nil {
		return err
	}
	if m.Caller != "" {
		if err := checkNode("caller", m.Caller); err != nil {
			return err
		}
	}
	if m.Request == "" || len(m.Request) > maxName {
		return fmt.Errorf("%s: request digest must be 1 to %d bytes", m.Key, maxName)
	}
	if m.Now.IsZero() {
		return fmt.Errorf("%s: hold carries no time", m.Key)
	}
	return nil
}

func (m *confirmMessage) check() error {
	if err := m.Key.validate(); err != nil {
		return err
	}
	if m.Token == 0 {
		return fmt.Errorf("%s: confirm needs the token the name was granted with", m.Key)
	}
	if m.Now.IsZero() {
		return fmt.Errorf("%s: confirm carries no time", m.Key)
	}
	if err := checkNode("owner", m.Owner); err != nil {
		return err
	}
	if m.Caller != "" {
		if err := checkNode("caller", m.Caller); err != nil {
			return err
		}
	}
	return checkMembers(m.Key, m.Members)
}

func (m *releaseMessage) check() error {
	if err := m.Key.validate(); err != nil {
		return err
	}
	if m.Token == 0 && m.Node == "" {
		return fmt.Errorf("%s: release needs the name's token or its holder", m.Key)
	}
	if m.Remember < 0 || m.Remember > MaxRemember {
		return fmt.Errorf("%s: remember %v is outside 0 to %v", m.Key, m.Remember, MaxRemember)
	}
	if m.Remember > 0 && m.Now.IsZero() {
		return fmt.Errorf("%s: a remembered release needs the leader's time", m.Key)
	}
	if m.Node != "" {
		return checkNode("node", m.Node)
	}
	return nil
}

func (m *expireMessage) check() error {
	if m.Now.IsZero() {
		return fmt.Errorf("expire carries no time")
	}
	return nil
}

func (m *removeMemberMessage) check() error {
	if m.Now.IsZero() {
		return fmt.Errorf("remove-member carries no time")
	}
	return checkNode("node", m.Node)
}

func (m *setMembersMessage) check() error {
	if err := m.Key.validate(); err != nil {
		return err
	}
	if m.Key.Kind != KindGroup {
		return fmt.Errorf("%s: only groups have members", m.Key)
	}
	if m.Token == 0 {
		return fmt.Errorf("%s: set-members needs the group's token", m.Key)
	}
	return checkMembers(m.Key, m.Members)
}

func (m *moveMessage) check() error {
	if err := m.Key.validate(); err != nil {
		return err
	}
	if m.Token == 0 {
		return fmt.Errorf("%s: move needs the token the name is held under", m.Key)
	}
	for _, n := range []struct{ what, name string }{{"from", m.From}, {"to", m.To}, {"caller", m.Caller}} {
		if err := checkNode(n.what, n.name); err != nil {
			return err
		}
	}
	if m.From == m.To {
		return fmt.Errorf("%s: move from %s to itself", m.Key, m.From)
	}
	if m.Lease <= 0 || m.Now.IsZero() {
		return fmt.Errorf("%s: move carries no time or lease", m.Key)
	}
	return nil
}

func (m *stampMessage) check() error {
	if err := m.Key.validate(); err != nil {
		return err
	}
	if m.Key.Kind != KindGroup {
		return fmt.Errorf("%s: only a group's record is stamped", m.Key)
	}
	if m.Token == 0 {
		return fmt.Errorf("%s: stamp needs the group's token", m.Key)
	}
	return nil
}

func (m *setRequestMessage) check() error {
	if err := m.Key.validate(); err != nil {
		return err
	}
	if m.Key.Kind != KindGroup {
		return fmt.Errorf("%s: only a group's request changes", m.Key)
	}
	if m.Token == 0 {
		return fmt.Errorf("%s: set-request needs the group's token", m.Key)
	}
	if m.Request == "" || len(m.Request) > maxName {
		return fmt.Errorf("%s: request digest must be 1 to %d bytes", m.Key, maxName)
	}
	return nil
}
