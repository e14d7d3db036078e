package names

import (
	"fmt"
	"time"
)

// Machine is the registry's state machine without raft: each call encodes
// its command as the raft log would carry it, decodes it and applies it
// through the same FSM code, at the next log index. It is for the
// deterministic simulation of the protocol (agent/internal/dst), which
// cannot run raft's timers and goroutines: what raft adds (replication,
// elections, an answer that may be lost after the entry committed) the
// simulation injects as faults around these calls.
type Machine struct {
	fsm    *FSM
	next   uint64
	limits Limits
}

// NewMachine returns an empty state machine with the default limits.
func NewMachine() *Machine {
	return &Machine{fsm: NewFSM(nil), next: 1, limits: DefaultLimits()}
}

func (m *Machine) apply(t messageType, body any) Result {
	data, err := encodeMessage(t, body)
	if err != nil {
		return Result{Code: CodeInvalid, Detail: err.Error()}
	}
	idx := m.next
	m.next++
	return m.fsm.applyCommand(idx, data)
}

// Acquire grants key to request for caller, pending until now+lease.
func (m *Machine) Acquire(key Key, caller, request string, now time.Time, lease time.Duration) Result {
	return m.apply(messageAcquire, &acquireMessage{Key: key, Caller: caller, Request: request, Now: now, Lease: lease, Limits: m.limits})
}

// Hold makes owner the holder of claim key for request in one step;
// recall as in Registry.Hold.
func (m *Machine) Hold(key Key, caller, owner, request string, recall bool, now time.Time) Result {
	return m.apply(messageHold, &holdMessage{Key: key, Owner: owner, Caller: caller, Request: request, Now: now, Limits: m.limits, Recall: recall})
}

// Confirm makes owner the holder of key under token.
func (m *Machine) Confirm(key Key, token uint64, owner string, now time.Time) Result {
	return m.apply(messageConfirm, &confirmMessage{Key: key, Token: token, Owner: owner, Now: now, Limits: m.limits})
}

// Release frees key; token and node as in Registry.Release.
func (m *Machine) Release(key Key, token uint64, node string) Result {
	return m.apply(messageRelease, &releaseMessage{Key: key, Token: token, Node: node})
}

// ReleaseRemembering is Registry.ReleaseRemembering at now.
func (m *Machine) ReleaseRemembering(key Key, token uint64, node string, keep time.Duration, now time.Time) Result {
	return m.apply(messageRelease, &releaseMessage{Key: key, Token: token, Node: node, Remember: keep, Now: now})
}

// Move starts moving key, held on from under token, to to.
func (m *Machine) Move(key Key, token uint64, from, to, caller string, now time.Time, lease time.Duration) Result {
	return m.apply(messageMove, &moveMessage{Key: key, Token: token, From: from, To: to, Caller: caller, Now: now, Lease: lease})
}

// Expire ends the pending names whose deadline is not after now.
func (m *Machine) Expire(now time.Time) Result {
	return m.apply(messageExpire, &expireMessage{Now: now})
}

// Lookup reads key as a linearizable read on the leader would.
func (m *Machine) Lookup(key Key) (Record, bool) {
	r, ok, err := m.fsm.Lookup(key)
	if err != nil {
		panic(fmt.Sprintf("name machine halted: %v", err))
	}
	return r, ok
}

// Records returns every live record, sorted by key.
func (m *Machine) Records() []Record {
	recs, err := m.fsm.Records()
	if err != nil {
		panic(fmt.Sprintf("name machine halted: %v", err))
	}
	return recs
}
