package names

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Registry is one agent's handle on the name registry: a raft server
// (voter or non-voter) with the FSM, or a client that forwards.
type Registry struct {
	cfg   Config
	raft  *raft.Raft // nil for a client
	fsm   *FSM       // nil for a client
	store *Store     // nil in memory or for a client
	// trans is raft's transport: Config.Transport, wrapped by
	// durableCommits where the leader's appends are written ahead.
	trans raft.Transport
	local *localLog // set for a registry without raft (NewLocal)
	via   Transport // set for a front of one (Front)

	// readyTerm is the term in which this server, as leader, saw a barrier
	// applied: from then its FSM holds every entry committed before its
	// term, and a read after VerifyLeader is linearizable.
	readyTerm atomic.Uint64

	mu sync.Mutex
	// leader is the last leader another server named.
	leader string
	// failing are the voters this server, as leader, failed to heartbeat.
	failing map[string]bool
	// known are the registry servers: the configured ones and those raft
	// added since, less those it removed.
	known map[string]bool

	// id names the registry this server belongs to (see Bootstrap); ""
	// until it bootstrapped one or adopted the leader's.
	id string

	stop chan struct{}
	wg   sync.WaitGroup
}

// Open starts the registry as cfg.Role says. A voter whose data directory
// holds no raft state bootstraps the cluster with the configured voters;
// every voter doing so with the same list is safe (raft keeps one).
func Open(cfg Config) (*Registry, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	r := &Registry{cfg: cfg, failing: map[string]bool{}, known: map[string]bool{}, stop: make(chan struct{})}
	for _, s := range cfg.Servers {
		r.known[s.ID] = true
	}
	if cfg.Role == RoleClient {
		return r, nil
	}
	r.fsm = NewFSM(cfg.Logger)
	var (
		logs   raft.LogStore
		stable raft.StableStore
		snaps  raft.SnapshotStore
	)
	hlog := newHCLog(cfg.Logger.With("component", "raft"))
	if cfg.DataDir == "" {
		mem := raft.NewInmemStore()
		logs, stable, snaps = mem, mem, raft.NewInmemSnapshotStore()
	} else {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("name registry data directory: %w", err)
		}
		st, err := OpenStore(filepath.Join(cfg.DataDir, "names.db"))
		if err != nil {
			return nil, err
		}
		fs, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, 2, hlog)
		if err != nil {
			st.Close()
			return nil, fmt.Errorf("name registry snapshots in %s: %w", cfg.DataDir, err)
		}
		r.store, logs, stable, snaps = st, st, st, fs
		if cfg.StorageResult != nil || cfg.StorageTime != nil {
			o := observer{report: cfg.StorageResult, time: cfg.StorageTime}
			logs, stable, snaps = observedLog{st, o}, observedStable{st, o}, observedSnapshots{fs, o.reported}
			st.reportAheadSyncs(func(start time.Time, err error) { o.done(StorageLog, "sync", start, err) })
		}
	}
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.Node)
	rc.HeartbeatTimeout = cfg.Timing.Heartbeat
	rc.ElectionTimeout = cfg.Timing.Election
	rc.LeaderLeaseTimeout = cfg.Timing.LeaderLease
	rc.CommitTimeout = cfg.Timing.Commit
	rc.SnapshotInterval = cfg.Timing.SnapshotInterval
	rc.SnapshotThreshold = cfg.Timing.SnapshotThreshold
	rc.TrailingLogs = cfg.Timing.TrailingLogs
	rc.Logger = hlog
	rc.NoLegacyTelemetry = true
	existing, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		r.closeStore()
		return nil, fmt.Errorf("name registry state in %s: %w", cfg.DataDir, err)
	}
	if r.id, err = readID(cfg.DataDir); err != nil {
		r.closeStore()
		return nil, err
	}
	// The leader's log appends are written ahead, beside the
	// replication, where the commit index its followers hear can be held
	// to its durable log (durableCommits) and its state machine waits for
	// its own copy (FSM.durable): docs/names.md, "Durability".
	trans := cfg.Transport
	full, ahead := trans.(transportWithAll)
	ahead = ahead && r.store != nil
	if ahead {
		trans = durableCommits{Transport: full, durable: r.store.durableIndex}
		r.fsm.durable = r.store.WaitDurable
	}
	r.trans = trans
	ra, err := raft.NewRaft(rc, r.fsm, logs, stable, snaps, trans)
	if err != nil {
		r.closeStore()
		return nil, fmt.Errorf("name registry: start raft: %w", err)
	}
	r.raft = ra
	if ahead {
		r.store.writeAheadWhile(func() bool { return ra.State() == raft.Leader })
	}
	if cfg.Role == RoleVoter && !existing {
		if err := r.bootstrap(cfg.Servers, VotersID(cfg.Servers)); err != nil {
			r.Close()
			return nil, err
		}
	}
	obs := make(chan raft.Observation, 64)
	observer := raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation, raft.LeaderObservation, raft.PeerObservation:
			return true
		}
		return false
	})
	ra.RegisterObserver(observer)
	r.wg.Add(2)
	go r.watch(obs, observer)
	go r.expireLoop()
	return r, nil
}

func (r *Registry) closeStore() {
	if r.store != nil {
		r.store.Close()
	}
}

// Close stops the registry on this agent; its data stays on disk.
func (r *Registry) Close() error {
	select {
	case <-r.stop:
		return nil
	default:
	}
	close(r.stop)
	r.wg.Wait()
	var errs []error
	if r.raft != nil {
		errs = append(errs, r.raft.Shutdown().Error())
		if c, ok := r.cfg.Transport.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	if r.store != nil {
		errs = append(errs, r.store.Close())
	}
	return errors.Join(errs...)
}

// watch keeps the set of voters the leader cannot heartbeat.
func (r *Registry) watch(obs chan raft.Observation, o *raft.Observer) {
	defer r.wg.Done()
	defer r.raft.DeregisterObserver(o)
	for {
		select {
		case <-r.stop:
			return
		case ob := <-obs:
			r.mu.Lock()
			switch d := ob.Data.(type) {
			case raft.FailedHeartbeatObservation:
				r.failing[string(d.PeerID)] = true
			case raft.ResumedHeartbeatObservation:
				delete(r.failing, string(d.PeerID))
			case raft.PeerObservation:
				if d.Removed {
					delete(r.known, string(d.Peer.ID))
				} else {
					r.known[string(d.Peer.ID)] = true
				}
			case raft.LeaderObservation:
				// Kept after leadership is lost: an unavailable answer
				// then names whom the last term could not reach.
				if string(d.LeaderID) == r.cfg.Node {
					clear(r.failing)
				}
			}
			r.mu.Unlock()
		}
	}
}

// expireLoop proposes an expiry, stamped with the leader's clock, when a
// pending name has lapsed; the FSM itself never reads a clock.
func (r *Registry) expireLoop() {
	defer r.wg.Done()
	t := time.NewTicker(r.cfg.Timing.Expire)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		r.servers() // refreshes the known servers from raft's configuration
		if r.raft.State() != raft.Leader || !r.fsm.pendingPast(r.cfg.Clock()) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Timing.Hold)
		resp := r.Serve(ctx, Request{Op: OpExpire})
		cancel()
		if resp.Result != nil && len(resp.Result.Keys) > 0 {
			r.cfg.Logger.Info("pending names lapsed", "names", len(resp.Result.Keys))
		}
	}
}

// IsServer reports whether node is a registry server as far as this
// agent knows: configured, or added by raft since it started. The TLS
// stream layer refuses raft connections from any other node.
func (r *Registry) IsServer(node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.known[node]
}

// Node is this agent's node name.
func (r *Registry) Node() string { return r.cfg.Node }

// IsLeader reports whether this agent leads the registry now.
func (r *Registry) IsLeader() bool { return r.raft != nil && r.raft.State() == raft.Leader }

// Leader is the leader this agent knows of, if any.
func (r *Registry) Leader() string {
	if r.raft != nil {
		if _, id := r.raft.LeaderWithID(); id != "" {
			return string(id)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leader
}

// Raft is the raft server under the registry, nil for a client; for
// tests and status pages.
func (r *Registry) Raft() *raft.Raft { return r.raft }

// Store is the on-disk store, nil for a client or an in-memory registry.
func (r *Registry) Store() *Store { return r.store }

// Grant is what Acquire answers.
type Grant struct {
	Record Record
	// Retry: the name was already granted to the same request; Record is
	// that first grant, token and all.
	Retry bool
}

// Acquire asks for key for a request (its digest) on behalf of caller,
// which will place it, on owner when it already knows where. The name
// stays pending until Confirm, or until the lease lapses.
func (r *Registry) Acquire(ctx context.Context, key Key, caller, owner, request string, members []string) (Grant, error) {
	res, err := r.do(ctx, Request{Op: OpAcquire, Key: key, Caller: caller, Owner: owner, Request: request, Members: members})
	if err != nil {
		return Grant{}, err
	}
	if res.Code != CodeOK && res.Code != CodeSame {
		return Grant{}, refused(OpAcquire, key, res)
	}
	return Grant{Record: *res.Record, Retry: res.Code == CodeSame}, nil
}

// Hold makes owner the holder of claim key for request (its digest), in
// one write: the step an owner takes at commit, before its ledger commits,
// on the claim path (docs/protocol.md, "Placing a claim"). caller is the
// coordinator that placed it there. A name held already on owner under
// the same request is answered as it is (a retried commit); held
// elsewhere, being placed, or held under another request, it is refused
// (ErrConflict, with the record).
//
// With recall, the hold is refused (ErrRecalled, the record naming the
// server) when the claim ID last ran on another server within the
// remember window of its release (ReleaseRemembering): a claim placed
// without any_node goes back there.
func (r *Registry) Hold(ctx context.Context, key Key, caller, owner, request string, recall bool) (Record, error) {
	return r.record(ctx, Request{Op: OpHold, Key: key, Caller: caller, Owner: owner, Request: request, Recall: recall})
}

// Confirm makes owner the holder of key under token: the step an owner
// takes at commit, before its ledger commits. An older token is refused
// (ErrStale), so a caller paused past its lease cannot commit.
func (r *Registry) Confirm(ctx context.Context, key Key, token uint64, owner string, members []string) (Record, error) {
	return r.record(ctx, Request{Op: OpConfirm, Key: key, Token: token, Owner: owner, Caller: owner, Members: members})
}

// ConfirmMove confirms, as caller (the coordinator that started the move
// under token), key's move to owner: how a coordinator puts a name back
// on the server whose copy it could not release. The registry refuses it
// from anyone but that move's caller.
func (r *Registry) ConfirmMove(ctx context.Context, key Key, token uint64, owner, caller string) (Record, error) {
	return r.record(ctx, Request{Op: OpConfirm, Key: key, Token: token, Owner: owner, Caller: caller})
}

// Release frees key. token, when not zero, must be its current token;
// node, when set, its holder. ErrNotFound means it was free already.
func (r *Registry) Release(ctx context.Context, key Key, token uint64, node string) (Record, error) {
	return r.record(ctx, Request{Op: OpRelease, Key: key, Token: token, Node: node})
}

// ReleaseRemembering is Release of a claim ID that ran on its holder (a
// VM stopped), remembering that server for keep: a hold with recall on
// another server is refused until then. keep is at most MaxRemember.
func (r *Registry) ReleaseRemembering(ctx context.Context, key Key, token uint64, node string, keep time.Duration) (Record, error) {
	return r.record(ctx, Request{Op: OpRelease, Key: key, Token: token, Node: node, Remember: keep})
}

// SetMembers replaces a group's node claims under its token.
func (r *Registry) SetMembers(ctx context.Context, key Key, token uint64, members []string) (Record, error) {
	return r.record(ctx, Request{Op: OpSetMembers, Key: key, Token: token, Members: members})
}

// Move starts moving key, held on from under token, to the server to, on
// behalf of caller (a resize's coordinator). The name stays held on from
// until to confirms the move's token (Record.Move.Token) with Confirm, in
// the one step that ends from's hold; a move nobody confirms lapses after
// the lease and the name stays on from. A retry by the same caller to the
// same server answers the move already under way.
func (r *Registry) Move(ctx context.Context, key Key, token uint64, from, to, caller string) (Record, error) {
	return r.record(ctx, Request{Op: OpMove, Key: key, Token: token, Owner: from, To: to, Caller: caller})
}

// SetRequest replaces a held group's request digest under its token: what
// the group's nodes have after a resize. A retry of the group's first
// request is then a conflict, as a create of another group would be.
func (r *Registry) SetRequest(ctx context.Context, key Key, token uint64, request string) (Record, error) {
	return r.record(ctx, Request{Op: OpSetRequest, Key: key, Token: token, Request: request})
}

// Stamp marks a held group's record under its token as changed now: its
// Index becomes this write's raft index, nothing else changes. A group
// operation stamps the group as it begins and reads the Index back
// between its steps: an operation that finds another Index than its own
// was overtaken by a newer one (a client's retry through another agent)
// and stops, instead of acting on the group behind the newer one's back.
func (r *Registry) Stamp(ctx context.Context, key Key, token uint64) (Record, error) {
	return r.record(ctx, Request{Op: OpStamp, Key: key, Token: token})
}

// ReadMode says how fresh a lookup must be.
type ReadMode bool

// The read modes.
const (
	// Linearizable: the leader confirms it still leads before answering.
	Linearizable ReadMode = false
	// Stale: any server answers from its own copy, which may lag.
	Stale ReadMode = true
)

// Lookup reads key's record; ErrNotFound when the name is free.
func (r *Registry) Lookup(ctx context.Context, key Key, mode ReadMode) (Record, error) {
	return r.record(ctx, Request{Op: OpLookup, Key: key, Stale: bool(mode)})
}

// RemoveMember declares node gone for good: the names it held become
// lost, the names it was placing are dropped. It returns the names changed.
func (r *Registry) RemoveMember(ctx context.Context, node string) ([]Key, error) {
	res, err := r.do(ctx, Request{Op: OpRemoveMember, Node: node})
	if err != nil {
		return nil, err
	}
	if res.Code != CodeOK {
		return nil, refused(OpRemoveMember, Key{}, res)
	}
	return res.Keys, nil
}

// ExpirePending ends, with the leader's clock, the pending names that
// lapsed; the leader does it by itself every Timing.Expire.
func (r *Registry) ExpirePending(ctx context.Context) ([]Key, error) {
	res, err := r.do(ctx, Request{Op: OpExpire})
	if err != nil {
		return nil, err
	}
	if res.Code != CodeOK {
		return nil, refused(OpExpire, Key{}, res)
	}
	return res.Keys, nil
}

// AddVoter adds a server to the voters; it must run the registry as a
// non-voter at address first.
func (r *Registry) AddVoter(ctx context.Context, id, address string) error {
	return r.changeServer(ctx, Request{Op: OpAddVoter, Node: id, Address: address})
}

// AddNonVoter adds a server that keeps a copy of the log without voting.
func (r *Registry) AddNonVoter(ctx context.Context, id, address string) error {
	return r.changeServer(ctx, Request{Op: OpAddNonVoter, Node: id, Address: address})
}

// RemoveServer takes a server out of the registry's raft configuration.
func (r *Registry) RemoveServer(ctx context.Context, id string) error {
	return r.changeServer(ctx, Request{Op: OpRemoveServer, Node: id})
}

func (r *Registry) changeServer(ctx context.Context, req Request) error {
	res, err := r.do(ctx, req)
	if err != nil {
		return err
	}
	if res.Code != CodeOK {
		return refused(req.Op, Key{}, res)
	}
	return nil
}

func (r *Registry) record(ctx context.Context, req Request) (Record, error) {
	res, err := r.do(ctx, req)
	if err != nil {
		return Record{}, err
	}
	if res.Code != CodeOK && res.Code != CodeSame {
		return Record{}, refused(req.Op, req.Key, res)
	}
	return *res.Record, nil
}

func refused(op Op, key Key, res Result) error {
	return &RefusedError{Op: op, Key: key, Code: res.Code, Record: res.Record, Detail: res.Detail}
}

// do runs req where it can be answered: here when this server leads (or
// for a stale read), else at the leader. While no leader answers it waits
// up to Timing.Hold, then names the servers it could not reach.
func (r *Registry) do(ctx context.Context, req Request) (Result, error) {
	if r.local != nil && r.via != nil {
		// A call delivered late is applied whatever its caller's context
		// has become since, as a leader applies what reached it.
		return r.via(ctx, req, func(q Request) (Result, error) { return r.doLocal(context.Background(), q) })
	}
	if r.local != nil {
		return r.doLocal(ctx, req)
	}
	if req.Stale && isRead(req.Op) && r.fsm != nil {
		return r.readLocal(req)
	}
	hold := time.NewTimer(r.cfg.Timing.Hold)
	defer hold.Stop()
	retry := r.cfg.Timing.Heartbeat / 2
	for {
		res, uerr := r.attempt(ctx, req)
		if uerr == nil {
			return res, nil
		}
		if uerr.Uncertain {
			// A retry could only answer "same" or "not found" for what
			// this call may have done: say so instead, and let the caller
			// retry, knowing every command is idempotent.
			return Result{}, uerr
		}
		wait := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			wait.Stop()
			uerr.Reason = fmt.Sprintf("%s (%v)", uerr.Reason, ctx.Err())
			return Result{}, uerr
		case <-hold.C:
			wait.Stop()
			return Result{}, uerr
		case <-wait.C:
		}
	}
}

// attempt asks the leader once: this server if it leads, else the leader
// it knows, else every configured server until one leads or names one.
func (r *Registry) attempt(ctx context.Context, req Request) (Result, *UnavailableError) {
	u := &UnavailableError{Op: req.Op, Key: req.Key, Reason: "no leader answered"}
	var order []string
	if r.raft != nil {
		resp := r.Serve(ctx, req)
		if res, done, err := r.take(r.cfg.Node, resp, u); done {
			return res, err
		}
	}
	if l := r.Leader(); l != "" {
		order = append(order, l)
	}
	order = append(order, r.servers()...)
	tried := map[string]bool{r.cfg.Node: r.raft != nil}
	for i := 0; i < len(order); i++ {
		s := order[i]
		if tried[s] || r.cfg.Forwarder == nil {
			continue
		}
		tried[s] = true
		resp, err := r.cfg.Forwarder.Forward(ctx, s, req)
		if err != nil {
			u.Unreached = appendOnce(u.Unreached, s)
			if !isRead(req.Op) && !errors.Is(err, ErrNotDelivered) {
				u.Uncertain = true
				u.Reason = fmt.Sprintf("%s did not answer: %v", s, err)
				slices.Sort(u.Unreached)
				return Result{}, u
			}
			continue
		}
		res, done, uerr := r.take(s, resp, u)
		if done {
			return res, uerr
		}
		if resp.Error.Leader != "" && !tried[resp.Error.Leader] {
			// Ask the leader it names next.
			order = slices.Insert(order, i+1, resp.Error.Leader)
		}
	}
	slices.Sort(u.Unreached)
	slices.Sort(u.NoLeader)
	return Result{}, u
}

// take reads one server's answer: done with a result, done with an
// unavailable leader, or not the leader (go on).
func (r *Registry) take(from string, resp Response, u *UnavailableError) (Result, bool, *UnavailableError) {
	switch {
	case resp.Error == nil && resp.Result != nil:
		if from != r.cfg.Node {
			r.mu.Lock()
			r.leader = from
			r.mu.Unlock()
		}
		return *resp.Result, true, nil
	case resp.Error != nil && resp.Error.Code == wireUnavailable:
		u.Reason = resp.Error.Message
		u.Leader = from
		u.Uncertain = resp.Error.Uncertain
		for _, s := range resp.Error.Unreached {
			u.Unreached = appendOnce(u.Unreached, s)
		}
		return Result{}, true, u
	case resp.Error != nil && resp.Error.Code == wireNotLeader:
		if resp.Error.Leader == "" {
			u.NoLeader = appendOnce(u.NoLeader, from)
		} else {
			u.Leader = resp.Error.Leader
		}
		return Result{}, false, nil
	}
	u.Unreached = appendOnce(u.Unreached, from)
	return Result{}, false, nil
}

func appendOnce(s []string, v string) []string {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}

// servers lists the registry servers to ask: raft's configuration when
// this agent has one, else the configured voters.
func (r *Registry) servers() []string {
	var conf []string
	if r.raft != nil {
		if f := r.raft.GetConfiguration(); f.Error() == nil {
			for _, s := range f.Configuration().Servers {
				conf = append(conf, string(s.ID))
			}
			if len(conf) > 0 {
				r.mu.Lock()
				clear(r.known)
				for _, id := range conf {
					r.known[id] = true
				}
				r.mu.Unlock()
			}
		}
	}
	// The discovered servers first: Discover names the likeliest leader
	// first and leaves out servers that are down.
	var out []string
	if r.cfg.Discover != nil {
		for _, s := range r.cfg.Discover() {
			out = appendOnce(out, s)
		}
	}
	for _, s := range conf {
		out = appendOnce(out, s)
	}
	for _, s := range r.cfg.Servers {
		out = appendOnce(out, s.ID)
	}
	return out
}

func (r *Registry) lookupLocal(k Key) (Result, error) {
	if err := k.validate(); err != nil {
		return Result{}, &RefusedError{Op: OpLookup, Key: k, Code: CodeInvalid, Detail: err.Error()}
	}
	rec, ok, err := r.fsm.Lookup(k)
	switch {
	case err != nil:
		return Result{}, &RefusedError{Op: OpLookup, Key: k, Code: CodeHalted, Detail: err.Error()}
	case !ok:
		return Result{Code: CodeNotFound, Detail: fmt.Sprintf("%s is not held", k)}, nil
	}
	return withRecord(CodeOK, rec), nil
}

// Serve answers a Request that another agent forwarded: with a Result
// when this server leads (or for a stale read), else with the leader it
// knows. It never forwards further.
func (r *Registry) Serve(ctx context.Context, req Request) Response {
	switch {
	case req.Op == OpPing:
		return Response{Result: &Result{Code: CodeOK}}
	case req.Op == OpStatus:
		st := r.Status()
		return Response{Result: &Result{Code: CodeOK}, Status: &st}
	case r.raft == nil:
		return Response{Error: &WireError{Code: wireNotLeader, Message: r.cfg.Node + " is a registry client", Leader: r.Leader()}}
	case isRead(req.Op) && req.Stale:
		return r.resultResponse(r.readLocal(req))
	}
	if r.raft.State() != raft.Leader {
		return r.notLeader()
	}
	switch req.Op {
	case OpLookup, OpList:
		if resp, ok := r.verifyLeader(ctx); !ok {
			return resp
		}
		return r.resultResponse(r.readLocal(req))
	case OpAddVoter, OpAddNonVoter, OpRemoveServer:
		return r.changeServers(ctx, req)
	}
	t, msg, err := r.command(req)
	if err != nil {
		return Response{Result: &Result{Code: CodeInvalid, Detail: err.Error()}}
	}
	data, err := encodeMessage(t, msg)
	if err != nil {
		return Response{Result: &Result{Code: CodeInvalid, Detail: err.Error()}}
	}
	// Check what a follower will check, so that a bad request is refused
	// here instead of halting every server that applies it.
	if _, _, err := decodeMessage(data); err != nil {
		return Response{Result: &Result{Code: CodeInvalid, Detail: err.Error()}}
	}
	f := r.raft.Apply(data, r.cfg.Timing.Hold)
	if resp, ok := r.wait(ctx, f, true); !ok {
		return resp
	}
	switch res := f.Response().(type) {
	case Result:
		return Response{Result: &res}
	case notDurable:
		r.cfg.Logger.Error("name registry: the leader's log failed on its disk", "err", res.err)
		return r.unavailable("the registry's leader could not make its log durable: "+res.err.Error(), true)
	}
	return r.unavailable("the leader applied no result", false)
}

// command builds the log command of a write, stamped with this leader's
// clock, lease and limits.
func (r *Registry) command(req Request) (messageType, any, error) {
	now := r.cfg.Clock()
	switch req.Op {
	case OpAcquire:
		return messageAcquire, &acquireMessage{Key: req.Key, Caller: req.Caller, Owner: req.Owner, Request: req.Request,
			Members: req.Members, Now: now, Lease: r.cfg.Lease, Limits: r.cfg.Limits}, nil
	case OpHold:
		return messageHold, &holdMessage{Key: req.Key, Owner: req.Owner, Caller: req.Caller, Request: req.Request,
			Now: now, Limits: r.cfg.Limits, Recall: req.Recall}, nil
	case OpConfirm:
		return messageConfirm, &confirmMessage{Key: req.Key, Token: req.Token, Owner: req.Owner, Caller: req.Caller, Members: req.Members,
			Now: now, Limits: r.cfg.Limits}, nil
	case OpRelease:
		m := &releaseMessage{Key: req.Key, Token: req.Token, Node: req.Node}
		if req.Remember > 0 {
			m.Remember, m.Now = req.Remember, now
		}
		return messageRelease, m, nil
	case OpSetMembers:
		return messageSetMembers, &setMembersMessage{Key: req.Key, Token: req.Token, Members: req.Members, Limits: r.cfg.Limits}, nil
	case OpSetRequest:
		return messageSetRequest, &setRequestMessage{Key: req.Key, Token: req.Token, Request: req.Request}, nil
	case OpStamp:
		return messageStamp, &stampMessage{Key: req.Key, Token: req.Token}, nil
	case OpMove:
		return messageMove, &moveMessage{Key: req.Key, Token: req.Token, From: req.Owner, To: req.To, Caller: req.Caller,
			Now: now, Lease: r.cfg.Lease}, nil
	case OpRemoveMember:
		return messageRemoveMember, &removeMemberMessage{Node: req.Node, Now: now}, nil
	case OpExpire:
		return messageExpire, &expireMessage{Now: now}, nil
	}
	return 0, nil, fmt.Errorf("unknown operation %q", req.Op)
}

func (r *Registry) resultResponse(res Result, err error) Response {
	if err != nil {
		var re *RefusedError
		if errors.As(err, &re) {
			return Response{Result: &Result{Code: re.Code, Record: re.Record, Detail: re.Detail}}
		}
		return r.unavailable(err.Error(), false)
	}
	return Response{Result: &res}
}

// verifyLeader makes a read linearizable: the first read of a term waits
// for a barrier (every earlier entry applied here), every read checks with
// a quorum that this server still leads.
func (r *Registry) verifyLeader(ctx context.Context) (Response, bool) {
	term := r.raft.CurrentTerm()
	if r.readyTerm.Load() != term {
		if resp, ok := r.wait(ctx, r.raft.Barrier(r.cfg.Timing.Hold), false); !ok {
			return resp, false
		}
		if r.raft.CurrentTerm() != term {
			return r.notLeader(), false
		}
		r.readyTerm.Store(term)
	}
	return r.wait(ctx, r.raft.VerifyLeader(), false)
}

// wait waits for a raft future. write says a log entry may have been
// appended, so a lost leadership leaves its outcome uncertain.
func (r *Registry) wait(ctx context.Context, f raft.Future, write bool) (Response, bool) {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		return r.unavailable("the leader did not answer in time: "+ctx.Err().Error(), write), false
	}
	switch {
	case err == nil:
		return Response{}, true
	case errors.Is(err, raft.ErrNotLeader):
		return r.notLeader(), false
	case errors.Is(err, raft.ErrLeadershipLost):
		return r.unavailable("the leader lost its leadership before the command was committed", write), false
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return r.unavailable("the leader is overloaded", false), false
	}
	return r.unavailable(err.Error(), write), false
}

func (r *Registry) notLeader() Response {
	_, id := r.raft.LeaderWithID()
	if string(id) == r.cfg.Node {
		id = ""
	}
	return Response{Error: &WireError{Code: wireNotLeader, Message: r.cfg.Node + " does not lead the name registry", Leader: string(id)}}
}

// unavailable is a leader's answer when it cannot commit or confirm its
// leadership: it names the servers it failed to heartbeat and those that
// do not answer a ping now (a partition that drops packets makes raft
// step down before its heartbeats time out).
func (r *Registry) unavailable(msg string, uncertain bool) Response {
	r.mu.Lock()
	var failing []string
	for id := range r.failing {
		failing = append(failing, id)
	}
	r.mu.Unlock()
	for _, id := range r.probe() {
		failing = appendOnce(failing, id)
	}
	slices.Sort(failing)
	return Response{Error: &WireError{Code: wireUnavailable, Message: msg, Unreached: failing, Uncertain: uncertain}}
}

// probe pings every other registry server at once and returns those that
// do not answer within a heartbeat.
func (r *Registry) probe() []string {
	if r.cfg.Forwarder == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Timing.Heartbeat)
	defer cancel()
	var (
		mu     sync.Mutex
		silent []string
		wg     sync.WaitGroup
	)
	for _, s := range r.servers() {
		if s == r.cfg.Node {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := r.cfg.Forwarder.Forward(ctx, s, Request{Op: OpPing}); err != nil {
				mu.Lock()
				silent = append(silent, s)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return silent
}

func (r *Registry) changeServers(ctx context.Context, req Request) Response {
	if err := checkNode("server", req.Node); err != nil {
		return Response{Result: &Result{Code: CodeInvalid, Detail: err.Error()}}
	}
	id, addr := raft.ServerID(req.Node), raft.ServerAddress(req.Address)
	if req.Op != OpRemoveServer && addr == "" {
		return Response{Result: &Result{Code: CodeInvalid, Detail: "server " + req.Node + " has no address"}}
	}
	var f raft.IndexFuture
	switch req.Op {
	case OpAddVoter:
		f = r.raft.AddVoter(id, addr, 0, r.cfg.Timing.Hold)
	case OpAddNonVoter:
		f = r.raft.AddNonvoter(id, addr, 0, r.cfg.Timing.Hold)
	default:
		f = r.raft.RemoveServer(id, 0, r.cfg.Timing.Hold)
	}
	if resp, ok := r.wait(ctx, f, true); !ok {
		return resp
	}
	return Response{Result: &Result{Code: CodeOK}}
}
