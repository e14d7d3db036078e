package names

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// localLog applies a local registry's writes to its state machine, one at
// a time, at consecutive log indexes, as raft's log would.
type localLog struct {
	mu   sync.Mutex
	next uint64
}

// NewLocal is a registry without raft: one state machine in this process,
// each call applied at once and in order, so every answer is linearizable
// and never lost. It runs the same commands through the same state machine
// as a raft registry, stamped with clock and lease, and answers with the
// same records and errors. Tests of a role and the deterministic
// simulation use it where raft's own timers cannot be driven; the faults
// raft adds (no leader, an answer lost after its entry committed) are
// theirs to inject around it.
func NewLocal(clock func() time.Time, lease time.Duration) *Registry {
	cfg := Config{Node: "local", Clock: clock, Lease: lease, Limits: DefaultLimits(),
		Logger: slog.New(slog.DiscardHandler), Timing: LANTiming()}
	if cfg.Lease == 0 {
		cfg.Lease = DefaultLease
	}
	return &Registry{cfg: cfg, fsm: NewFSM(nil), local: &localLog{next: 1},
		failing: map[string]bool{}, known: map[string]bool{}, stop: make(chan struct{})}
}

// Transport carries a call from a front of a local registry (Front) to its
// state machine, as a network and raft would: it may apply the call
// (apply answers as the registry does), apply it late, or answer without
// applying it or without telling what apply answered. The deterministic
// simulation injects its faults here.
type Transport func(ctx context.Context, req Request, apply func(Request) (Result, error)) (Result, error)

// Front is a registry that reaches r's state machine through t: what a
// server of a simulated cluster calls, all of them sharing r's names. The
// answers it gets are turned into records and errors as r's are.
func (r *Registry) Front(t Transport) *Registry {
	return &Registry{cfg: r.cfg, fsm: r.fsm, local: r.local, via: t,
		failing: map[string]bool{}, known: map[string]bool{}, stop: make(chan struct{})}
}

// doLocal answers req from the local state machine.
func (r *Registry) doLocal(ctx context.Context, req Request) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, &UnavailableError{Op: req.Op, Reason: err.Error()}
	}
	if isRead(req.Op) {
		return r.readLocal(req)
	}
	t, msg, err := r.command(req)
	if err != nil {
		return Result{Code: CodeInvalid, Detail: err.Error()}, nil
	}
	data, err := encodeMessage(t, msg)
	if err != nil {
		return Result{Code: CodeInvalid, Detail: err.Error()}, nil
	}
	if _, _, err := decodeMessage(data); err != nil {
		return Result{Code: CodeInvalid, Detail: err.Error()}, nil
	}
	r.local.mu.Lock()
	defer r.local.mu.Unlock()
	idx := r.local.next
	r.local.next++
	return r.fsm.applyCommand(idx, data), nil
}
