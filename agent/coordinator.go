package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/placement"
)

// The coordinator side of the protocol: any agent places a claim by ranking
// the servers that, by its view, can hold the whole request, and asking
// their owners in turn. The owners decide; the view is only a hint. See
// docs/protocol.md.

// Timeouts of the calls a coordinator makes to owners. A reservation binds
// GPUs, which takes seconds; the rest only touch the owner's ledger.
const (
	reserveTimeout  = 20 * time.Second
	ownerOpTimeout  = 5 * time.Second
	lookupTimeout   = 2 * time.Second
	commitAttempts  = 3
	abortTimeout    = 2 * time.Second
	maxOwnerRetries = 8 // candidates asked for one claim before giving up
	// A coordinator an owner refused within contendedWindow, or that sees
	// busyShare of a requested model taken, reads the capacity of its best
	// candidates, probeTop at a time, before asking them.
	contendedWindow = 30 * time.Second
	probeTop        = 6
	probeRounds     = 3
	busyShare       = 0.5
)

// target is a server a coordinator may ask: this agent or a peer.
type target struct {
	name   string
	self   bool
	owner  api.Owner
	server placement.Server
	caps   map[string]ledger.ModelTotals
}

// targets is this agent's view of the servers: itself, exactly, from its
// ledger, and the peers from gossip.
func (a *Agent) targets() []target {
	now := a.now()
	caps := a.ledger.Totals(now)
	free := make(map[string]int, len(caps))
	for m, c := range caps {
		free[m] = c.Free
	}
	self := target{
		name:   a.cfg.NodeName,
		self:   true,
		owner:  a,
		server: placement.Server{Name: a.cfg.NodeName, Free: free, Drained: a.serverDrained()},
		caps:   caps,
	}
	out := []target{self}
	if a.cluster != nil {
		out = append(out, a.cluster.peers()...)
	}
	return out
}

// Claim places the request on one server of the platform, all of it or
// nothing, and returns the committed claim. A retry with the same ID and
// request, through any agent, returns the same claim.
func (a *Agent) Claim(ctx context.Context, id string, req api.ClaimRequest) (api.Claim, error) {
	start := time.Now()
	c, err := a.coordinate(ctx, id, req)
	a.rec.ClaimDone(outcome(err), time.Since(start))
	return c, err
}

// outcome names a claim's result for the metrics.
func outcome(err error) string {
	var e *api.Error
	switch {
	case err == nil:
		return ClaimGranted
	case !errors.As(err, &e):
		return ClaimError
	case e.Code == api.CodeNotAvailable:
		return ClaimNotAvailable
	case e.Code == api.CodeInvalid || e.Code == api.CodeUnknownModel:
		return ClaimInvalid
	case e.Code == api.CodeConflict:
		return ClaimConflict
	case e.Code == api.CodeBindFailed:
		return ClaimBindFailed
	}
	return ClaimError
}

func (a *Agent) coordinate(ctx context.Context, id string, req api.ClaimRequest) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, a.apiError(err)
	}
	// Requests for one ID through this agent go one at a time: a retry
	// waits for the first try and then finds its claim.
	unlock := a.claimLocks.lock(id)
	defer unlock()
	lreq, err := a.resolve(req)
	if err != nil {
		return api.Claim{}, err
	}
	if err := ledger.ValidateRequest(lreq, a.cfg.MaxGPUsPerClaim); err != nil {
		return api.Claim{}, a.apiError(err)
	}
	rr := api.ReserveRequest{Items: apiItems(lreq.Items), Labels: lreq.Labels, Coordinator: a.cfg.NodeName}
	targets := a.targets()
	want := wants(lreq.Items)

	// The fast way: the claim ID's home vouches that it is new, or says
	// where it is.
	if a.cluster != nil {
		if c, done, err := a.throughHome(ctx, id, rr, want, req.PreferNode, targets); done {
			a.rec.ClaimLookup(LookupDirectory)
			return c, err
		}
		a.rec.ClaimLookup(LookupEveryServer)
	}

	// Idempotency across the platform, the slow way: the claim may already
	// be held, by this call's earlier try through any agent.
	if c, t, err := a.find(ctx, targets, id, false); err == nil {
		return a.resume(ctx, id, c, t, rr)
	} else if !isCode(err, api.CodeNotFound) {
		return api.Claim{}, err
	}
	c, err := a.place(ctx, id, rr, want, req.PreferNode, targets, nil)
	if err != nil && a.cluster != nil && !errors.Is(err, errCommitUnknown) {
		// Nothing placed: drop the intent the home recorded for us.
		a.dirAbandon(ctx, homeOf(id, targets), id)
	}
	return c, err
}

// resume answers a claim request whose ID is already held on t: the claim
// itself when the request is the same, after finishing its placement when
// it is only reserved (its coordinator may be gone).
func (a *Agent) resume(ctx context.Context, id string, c api.Claim, t target, rr api.ReserveRequest) (api.Claim, error) {
	if !sameItems(c.Items, rr.Items) || !maps.Equal(c.Labels, rr.Labels) {
		return api.Claim{}, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("claim %s already exists on %s with a different request (%s); release it first or use another ID", id, c.Node, api.DescribeItems(c.Items))}
	}
	if c.State == api.StateClaimed {
		return c, nil
	}
	c, err := a.commitOn(ctx, t, id)
	if err != nil {
		return api.Claim{}, err
	}
	return a.settle(ctx, id, c, t, nil)
}

// place ranks the servers that, by this agent's view, can hold the whole
// request, and asks their owners in turn until one takes it. vouch, when
// set, says whether the claim ID's home vouched that nobody else is placing
// it; it is asked once a reservation is made, before committing it (it may
// wait for the home's answer), and a false stops the placement with a
// *notVouched naming that reservation. Without vouch, the copies that
// concurrent coordinators may have placed are settled after the commit.
func (a *Agent) place(ctx context.Context, id string, rr api.ReserveRequest, want []placement.Want, prefer string, targets []target, vouch func() bool) (api.Claim, error) {
	servers := make([]placement.Server, len(targets))
	byName := make(map[string]target, len(targets))
	for i, t := range targets {
		servers[i] = t.server
		byName[t.name] = t
	}
	ranked := placement.Rank(servers, want, prefer, a.rnd())
	if a.contended() || busy(targets, want) {
		ranked = a.probe(ctx, ranked, targets, want, prefer)
	}
	if len(ranked) > maxOwnerRetries {
		ranked = ranked[:maxOwnerRetries]
	}
	var (
		lastErr error // the last failure that was not a plain "no"
		refused int
		tried   []string
	)
	for round := 0; round < 2; round++ {
		if round == 1 {
			// The view says nothing (more) fits; it may be stale. Before
			// answering "not available", read the capacity of every server
			// that could hold the request, and try again on the fresh figures.
			servers = a.freshen(ctx, targets, want)
			ranked = slices.DeleteFunc(placement.Rank(servers, want, prefer, a.rnd()), func(n string) bool { return slices.Contains(tried, n) })
			if len(ranked) > maxOwnerRetries {
				ranked = ranked[:maxOwnerRetries]
			}
		}
		for _, name := range ranked {
			c, err := a.tryOwner(ctx, byName[name], id, rr, vouch)
			if err == nil {
				if len(tried) > 0 {
					a.log.Info("claim placed after stale answers", "claim", id, "node", name, "attempt", len(tried)+1)
				}
				if vouch != nil {
					return c, nil
				}
				return a.settle(ctx, id, c, byName[name], tried)
			}
			tried = append(tried, name)
			if errors.Is(err, errCommitUnknown) || errors.As(err, new(*notVouched)) || isCode(err, api.CodeConflict) || isCode(err, api.CodeInvalid) || ctx.Err() != nil {
				return api.Claim{}, err
			}
			if isCode(err, api.CodeNotAvailable) {
				refused++
				a.lastRefusal.Store(a.now().UnixNano())
			} else {
				lastErr = fmt.Errorf("%s: %w", name, err)
			}
			a.log.Debug("owner could not take the claim; next candidate", "claim", id, "node", name, "err", err)
		}
		if lastErr != nil && refused == 0 {
			break
		}
	}
	if len(tried) > 0 && refused == 0 {
		// Every server that should fit failed rather than said no (a full
		// disk, a broken owner): "not available" would hide why.
		return api.Claim{}, &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s: no server that fits could take it: %v", id, lastErr)}
	}
	return api.Claim{}, a.notAvailable(rr.Items, servers)
}

// contended reports whether an owner refused this coordinator (its view was
// stale) within contendedWindow: placements are then probed first.
func (a *Agent) contended() bool {
	last := a.lastRefusal.Load()
	return last != 0 && a.now().UnixNano()-last < int64(contendedWindow)
}

// busy reports whether, by the view, at least busyShare of the healthy GPUs
// of a requested model are taken: the servers with room then change hands
// faster than gossip reports it, so placements are probed first.
func busy(targets []target, want []placement.Want) bool {
	for _, w := range want {
		free, healthy := 0, 0
		for _, t := range targets {
			free += t.caps[w.Model].Free
			healthy += t.caps[w.Model].Healthy
		}
		if healthy > 0 && float64(healthy-free) >= busyShare*float64(healthy) {
			return true
		}
	}
	return false
}

// probe re-ranks the best candidates on their capacity read now, probeTop
// at a time (one parallel round trip each), dropping those that cannot hold
// the request after all, until one can (at most probeRounds rounds); the
// candidates not probed follow unchanged. When views lag the claims (many
// claims per gossip round), this replaces a "no" per stale candidate.
func (a *Agent) probe(ctx context.Context, ranked []string, targets []target, want []placement.Want, prefer string) []string {
	for round := 0; round < probeRounds && len(ranked) > 0; round++ {
		k := min(probeTop, len(ranked))
		var top []target
		for _, name := range ranked[:k] {
			if t, ok := targetNamed(targets, name); ok {
				top = append(top, t)
			}
		}
		fresh := placement.Rank(a.freshen(ctx, top, want), want, prefer, a.rnd())
		if len(fresh) > 0 {
			return append(fresh, ranked[k:]...)
		}
		ranked = ranked[k:]
	}
	return ranked
}

// freshen returns the targets' servers with the free counts read now from
// every one that, by its gossiped totals, could hold want; the others keep
// their view. A server that does not answer keeps its view too.
func (a *Agent) freshen(ctx context.Context, targets []target, want []placement.Want) []placement.Server {
	out := make([]placement.Server, len(targets))
	for i, t := range targets {
		out[i] = t.server
	}
	var wg sync.WaitGroup
	for i, t := range targets {
		fits := true
		for _, w := range want {
			if t.caps[w.Model].Healthy < w.Count {
				fits = false
			}
		}
		cr, ok := t.owner.(api.CapacityReader)
		if !fits || !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, lookupTimeout)
			defer cancel()
			capa, err := cr.Capacity(cctx)
			if err != nil {
				return
			}
			out[i] = placement.Server{Name: t.name, Free: capa.Free, Drained: capa.Drained}
		}()
	}
	wg.Wait()
	return out
}

// throughHome places a claim through its ID's home (see directory.go). It
// reports done=false when the home cannot vouch for the ID (or does not
// answer, or its record is stale): the caller then asks every server.
//
// The first placement does not wait for the home: its ranking, probing and
// reservation run while the home is asked, and only the commit waits for
// the home to vouch. A claim of a new ID costs the time of two round trips
// (the home's and the reservation's together, then the commit) instead of
// three. When the home does not vouch, its answer is followed as if it had
// come first. The reservation made meanwhile is dropped (as a reservation
// only: never a claim a concurrent coordinator committed) when the ID is
// held or being placed elsewhere; when the home cannot say, it is left for
// the every-server lookup, which finds it and commits it (then settles).
func (a *Agent) throughHome(ctx context.Context, id string, rr api.ReserveRequest, want []placement.Want, prefer string, targets []target) (c api.Claim, done bool, err error) {
	home := homeOf(id, targets)
	dir, ok := home.owner.(api.Directory)
	if !ok {
		return api.Claim{}, false, nil
	}
	type answer struct {
		ans api.DirAnswer
		err error
	}
	begin := func() answer {
		bctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		defer cancel()
		ans, err := dir.BeginClaim(bctx, id, api.DirBegin{Coordinator: a.cfg.NodeName})
		return answer{ans, err}
	}
	placed := func(c api.Claim, err error) (api.Claim, bool, error) {
		if err != nil && !errors.Is(err, errCommitUnknown) {
			a.dirAbandon(ctx, home, id)
		}
		return c, true, err
	}
	deadline := time.Now().Add(a.pendingTTL())
	wait := 10 * time.Millisecond
	for first := true; ; first = false {
		var r answer
		if first {
			asked := make(chan answer, 1)
			go func() { asked <- begin() }()
			got := false
			vouch := func() bool {
				if !got {
					r, got = <-asked, true
				}
				return r.err == nil && r.ans.State == api.DirNew
			}
			c, err := a.place(ctx, id, rr, want, prefer, targets, vouch)
			if vouch() {
				return placed(c, err)
			}
			var nv *notVouched
			if errors.As(err, &nv) && !nv.held && r.err == nil && (r.ans.State == api.DirHeld || r.ans.State == api.DirPending) {
				a.abortReservation(ctx, nv.t, id)
			}
		} else {
			r = begin()
		}
		if r.err != nil {
			a.log.Debug("claim directory: home did not answer; asking every server", "claim", id, "home", home.name, "err", r.err)
			return api.Claim{}, false, nil
		}
		ans := r.ans
		switch ans.State {
		case api.DirNew:
			return placed(a.place(ctx, id, rr, want, prefer, targets, func() bool { return true }))
		case api.DirHeld:
			if len(ans.Owners) != 1 {
				return api.Claim{}, false, nil // several copies: the slow way settles them
			}
			t, ok := targetNamed(targets, ans.Owners[0])
			if !ok {
				return api.Claim{}, false, nil
			}
			lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
			c, err := t.owner.Lookup(lctx, id)
			cancel()
			if err != nil {
				return api.Claim{}, false, nil // stale, or the owner does not answer
			}
			c, err = a.resume(ctx, id, c, t, rr)
			return c, true, err
		case api.DirPending:
			// Another coordinator is placing it (a client retried
			// elsewhere): wait for its outcome rather than place a copy.
			if ans.Coordinator == a.cfg.NodeName || time.Now().After(deadline) {
				return api.Claim{}, false, nil
			}
			if _, alive := targetNamed(a.targets(), ans.Coordinator); !alive {
				return api.Claim{}, false, nil
			}
			select {
			case <-ctx.Done():
				return api.Claim{}, true, ctx.Err()
			case <-time.After(wait):
			}
			wait = min(2*wait, 200*time.Millisecond)
		default:
			return api.Claim{}, false, nil
		}
	}
}

// dirAbandon tells the home that this coordinator placed nothing for id.
func (a *Agent) dirAbandon(ctx context.Context, home target, id string) {
	dir, ok := home.owner.(api.Directory)
	if !ok {
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lookupTimeout)
	defer cancel()
	u := api.DirUpdate{From: a.cfg.NodeName, Ops: []api.DirOp{{ID: id, Op: api.DirOpAbandon}}}
	if err := dir.UpdateDirectory(actx, u); err != nil {
		a.log.Debug("claim directory: abandon not delivered; the intent goes stale", "claim", id, "home", home.name, "err", err)
	}
}

func targetNamed(targets []target, name string) (target, bool) {
	for _, t := range targets {
		if t.name == name {
			return t, true
		}
	}
	return target{}, false
}

// locate finds the claim for get and resize: through its ID's home when
// the home knows, otherwise by asking every server.
func (a *Agent) locate(ctx context.Context, targets []target, id string) (api.Claim, target, error) {
	lookup := func(ctx context.Context, t target) (api.Claim, error) { return t.owner.Lookup(ctx, id) }
	c, t, done, unseen, err := a.viaHome(ctx, targets, id, lookup)
	if done {
		return c, t, err
	}
	return a.findStrict(ctx, targets, id, unseen)
}

// findStrict looks claim id up on every server of targets for a get or a
// release. unseen are owners the ID's home named that targets lack (this
// agent's gossip has not brought them yet, as after many servers started at
// once): a claim held there is not "not found".
func (a *Agent) findStrict(ctx context.Context, targets []target, id string, unseen []string) (api.Claim, target, error) {
	c, t, err := a.find(ctx, targets, id, true)
	if len(unseen) > 0 && isCode(err, api.CodeNotFound) {
		return api.Claim{}, target{}, &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s: its home says %s holds it, a server this agent does not see (stopped, or not in its gossip view yet); retry, or ask through another agent", id, strings.Join(unseen, ", "))}
	}
	return c, t, err
}

// viaHome asks the home of claim id where it is and runs op on the owner it
// names. done is false when the home cannot say, or says the ID is held
// nowhere, or the owner it names does not hold the claim: the caller then
// asks every server. A "not found" is never taken from the home alone: a
// caller that believes a claim gone takes its GPUs for free, and a home can
// miss an owner's notice (an owner it cannot reach while the membership
// changes); a new claim may go ahead on the home's word, a release may not.
// unseen are the owners the home named that targets lack.
func (a *Agent) viaHome(ctx context.Context, targets []target, id string, op func(context.Context, target) (api.Claim, error)) (c api.Claim, t target, done bool, unseen []string, err error) {
	if a.cluster == nil {
		return api.Claim{}, target{}, false, nil, nil
	}
	if c, err := a.ledger.Get(id); err == nil && c.State == ledger.StateCommitted {
		// This server holds it: no need to ask where.
		self := targets[0]
		octx, cancel := context.WithTimeout(ctx, ownerOpTimeout)
		c, err := op(octx, self)
		cancel()
		if err == nil || !isCode(err, api.CodeNotFound) {
			a.rec.ClaimLookup(LookupLocal)
			return c, self, true, nil, err
		}
	}
	home := homeOf(id, targets)
	dir, ok := home.owner.(api.Directory)
	if ok {
		lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		ans, err := dir.LookupDirectory(lctx, id)
		cancel()
		switch {
		case err != nil:
		case ans.State == api.DirHeld:
			for _, o := range ans.Owners {
				if _, ok := targetNamed(targets, o); !ok {
					unseen = append(unseen, o)
				}
			}
			if len(ans.Owners) != 1 {
				break
			}
			if t, ok := targetNamed(targets, ans.Owners[0]); ok {
				octx, cancel := context.WithTimeout(ctx, ownerOpTimeout)
				c, err := op(octx, t)
				cancel()
				if err == nil || !isCode(err, api.CodeNotFound) {
					a.rec.ClaimLookup(LookupDirectory)
					return c, t, true, nil, err
				}
			}
		}
	}
	a.rec.ClaimLookup(LookupEveryServer)
	return api.Claim{}, target{}, false, unseen, nil
}

// errCommitUnknown: the commit was sent but its answer never came. The
// coordinator must not try another server: the claim may be committed.
var errCommitUnknown = errors.New("commit unconfirmed")

// notVouched: the claim ID's home did not vouch that the ID is new, and
// nothing was committed. The reservation made meanwhile on t is still there;
// the caller drops it or lets the every-server lookup find and finish it.
type notVouched struct {
	t target
	// held: the owner answered with a claim committed under the ID
	// before (a retry), not with a reservation of this placement.
	held bool
}

func (e *notVouched) Error() string {
	return fmt.Sprintf("claim ID not vouched for by its home; reserved on %s meanwhile", e.t.name)
}

// tryOwner asks one owner to reserve, then commits once vouch (see place)
// agrees. A reservation that cannot be confirmed is aborted best-effort; it
// expires by itself anyway.
func (a *Agent) tryOwner(ctx context.Context, t target, id string, rr api.ReserveRequest, vouch func() bool) (api.Claim, error) {
	rctx, cancel := context.WithTimeout(ctx, reserveTimeout)
	r, err := t.owner.Reserve(rctx, id, rr)
	cancel()
	if err == nil && vouch != nil && !vouch() {
		return api.Claim{}, &notVouched{t: t, held: r.State == api.StateClaimed}
	}
	if err != nil {
		var e *api.Error
		if !errors.As(err, &e) || e.ServerFault() {
			// Unanswered, or failed half-way: make sure nothing stays.
			a.abortReservation(ctx, t, id)
		}
		return api.Claim{}, err
	}
	return a.commitOn(ctx, t, id)
}

// abortReservation drops, best-effort, a reservation this coordinator made
// on t and will not commit. Only a reservation: under the same ID a
// concurrent coordinator (a client that retried elsewhere) may have
// committed the claim on t meanwhile, and that claim stays. What is not
// dropped here expires with its lease.
func (a *Agent) abortReservation(ctx context.Context, t target, id string) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	if _, err := t.owner.AbortReservation(actx, id); err != nil && !isCode(err, api.CodeNotFound) {
		a.log.Warn("reservation not aborted; its lease will expire it", "claim", id, "node", t.name, "err", err)
	}
}

// commitOn commits the reservation id on t, retrying an unanswered commit
// (commits are idempotent). Once a commit was sent, the claim may exist on
// t: an answer that never comes is errCommitUnknown, never "try elsewhere".
func (a *Agent) commitOn(ctx context.Context, t target, id string) (api.Claim, error) {
	var last error
	for range commitAttempts {
		cctx, cancel := context.WithTimeout(ctx, ownerOpTimeout)
		c, err := t.owner.Commit(cctx, id)
		cancel()
		if err == nil {
			return c, nil
		}
		var e *api.Error
		if errors.As(err, &e) && !e.ServerFault() {
			return api.Claim{}, err // expired or gone: nothing is committed
		}
		last = err
		if ctx.Err() != nil {
			break
		}
	}
	return api.Claim{}, fmt.Errorf("%w: %w", errCommitUnknown, &api.Error{Code: api.CodeUnavailable,
		Message: fmt.Sprintf("claim %s: commit on %s unconfirmed (%v); retry the claim with the same ID to learn its state", id, t.name, last)})
}

// copyOf is one server's copy of a claim.
type copyOf struct {
	c api.Claim
	t target
}

// before orders the copies of one claim ID so that every agent picks the
// same one: a committed copy before a reservation, then the earliest
// commit, then the server name.
func before(x, y copyOf) int {
	if xc, yc := x.c.State == api.StateClaimed, y.c.State == api.StateClaimed; xc != yc {
		if xc {
			return -1
		}
		return 1
	}
	if c := x.c.CommittedAt.Compare(y.c.CommittedAt); c != 0 {
		return c
	}
	return strings.Compare(x.t.name, y.t.name)
}

// findAll looks for the claim on every server of the view, in parallel,
// and returns every copy, the one to keep first, and the servers that did
// not answer: those of the view whose lookup failed, and the members gossip
// knows now (except those that left) that were not asked.
func (a *Agent) findAll(ctx context.Context, targets []target, id string) ([]copyOf, []string) {
	var (
		mu         sync.Mutex
		hits       []copyOf
		unanswered []string
		wg         sync.WaitGroup
	)
	for _, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
			defer cancel()
			c, err := t.owner.Lookup(lctx, id)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				hits = append(hits, copyOf{c, t})
			case !isCode(err, api.CodeNotFound):
				a.log.Debug("lookup failed", "claim", id, "node", t.name, "err", err)
				unanswered = append(unanswered, t.name)
			}
		}()
	}
	wg.Wait()
	if a.cluster != nil {
		asked := make([]string, len(targets))
		for i, t := range targets {
			asked[i] = t.name
		}
		unanswered = append(unanswered, a.cluster.unasked(asked)...)
	}
	slices.SortFunc(hits, before)
	slices.Sort(unanswered)
	return hits, unanswered
}

// find returns the copy of the claim to use, wherever it is held. When no
// server has it but some did not answer, strict callers (get, release) get
// a retryable 503 rather than a "not found" that would let them believe the
// GPUs are free; a new claim (not strict) goes ahead.
func (a *Agent) find(ctx context.Context, targets []target, id string, strict bool) (api.Claim, target, error) {
	hits, unanswered := a.findAll(ctx, targets, id)
	if len(hits) == 0 {
		if strict && len(unanswered) > 0 {
			return api.Claim{}, target{}, &api.Error{Code: api.CodeUnavailable,
				Message: fmt.Sprintf("claim %s: no server that answered holds it, and %s did not answer; retry when they are back", id, strings.Join(unanswered, ", "))}
		}
		names := make([]string, len(targets))
		for i, t := range targets {
			names[i] = t.name
		}
		if strict {
			// Rare, and worth seeing: a caller is about to believe the GPUs free.
			a.log.Info("claim not found on any server", "claim", id, "asked", names, "members", a.memberStates())
		}
		return api.Claim{}, target{}, &api.Error{Code: api.CodeNotFound,
			Message: fmt.Sprintf("claim %s not found on any server", id)}
	}
	if len(hits) > 1 {
		var nodes []string
		for _, h := range hits {
			nodes = append(nodes, h.t.name+"="+h.c.State)
		}
		a.log.Warn("claim held on several servers", "claim", id, "copies", nodes)
	}
	return hits[0].c, hits[0].t, nil
}

// memberStates is the gossip view in one line, for logs.
func (a *Agent) memberStates() string {
	if a.cluster == nil {
		return ""
	}
	var parts []string
	for _, m := range a.cluster.g.Members() {
		p := m.Name + "=" + m.State
		if m.SummaryErr != nil {
			p += "(summary unusable: " + m.SummaryErr.Error() + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " ")
}

// settle runs after a commit on t: when the same claim ID was placed at the
// same time through another agent (a client that retried elsewhere before
// the first try answered), both may commit. Every coordinator must then keep
// the same copy, which needs them to decide on the same facts: while another
// copy is still only reserved, settle waits for it to be committed or to go
// (at most a lease), so that both see every committed copy. It keeps the
// first by (commit time, server name) and releases its own if that is not
// it, answering with the kept one.
//
// Reservations on servers this coordinator tried before (tried) are its own
// leftovers, aborted or expiring: they are not another coordinator's copy.
func (a *Agent) settle(ctx context.Context, id string, mine api.Claim, t target, tried []string) (api.Claim, error) {
	deadline := time.Now().Add(time.Duration(a.cfg.ReservationLease) + time.Second)
	wait := 20 * time.Millisecond
	var committed []copyOf
	for {
		hits, _ := a.findAll(ctx, a.targets(), id)
		committed = committed[:0]
		pending := false
		for _, h := range hits {
			switch {
			case h.c.State == api.StateClaimed:
				committed = append(committed, h)
			case h.t.name != t.name && !slices.Contains(tried, h.t.name):
				pending = true
			}
		}
		if !pending || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
	if len(committed) < 2 || committed[0].t.name == t.name {
		return mine, nil
	}
	keep := committed[0]
	a.log.Warn("claim committed on two servers by concurrent coordinators; releasing this copy",
		"claim", id, "released_on", t.name, "kept_on", keep.t.name)
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ownerOpTimeout)
	defer cancel()
	if _, err := t.owner.Abort(actx, id); err != nil && !isCode(err, api.CodeNotFound) {
		return api.Claim{}, fmt.Errorf("claim %s: committed on %s and %s by concurrent requests; releasing the copy on %s failed: %w", id, keep.t.name, t.name, t.name, err)
	}
	return keep.c, nil
}

// Get returns a claim, wherever it is held.
func (a *Agent) Get(ctx context.Context, id string) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, a.apiError(err)
	}
	c, _, err := a.locate(ctx, a.targets(), id)
	return c, err
}

// Release frees a claim's GPUs, wherever it is held.
func (a *Agent) Release(ctx context.Context, id string) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, a.apiError(err)
	}
	targets := a.targets()
	abort := func(ctx context.Context, t target) (api.Claim, error) { return t.owner.Abort(ctx, id) }
	c, _, done, unseen, err := a.viaHome(ctx, targets, id, abort)
	if done {
		return c, err
	}
	_, t, err := a.findStrict(ctx, targets, id, unseen)
	if err != nil {
		return api.Claim{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, ownerOpTimeout)
	defer cancel()
	return abort(rctx, t)
}

// Claims lists the claims of every reachable server.
func (a *Agent) Claims(ctx context.Context) ([]api.Claim, error) {
	targets := a.targets()
	lists := make([][]api.Claim, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
			defer cancel()
			cs, err := t.owner.List(lctx)
			if err != nil {
				a.log.Warn("listing claims failed", "node", t.name, "err", err)
				return
			}
			lists[i] = cs
		}()
	}
	wg.Wait()
	out := []api.Claim{}
	for _, l := range lists {
		out = append(out, l...)
	}
	slices.SortFunc(out, func(x, y api.Claim) int {
		if x.ID != y.ID {
			if x.ID < y.ID {
				return -1
			}
			return 1
		}
		if x.Node < y.Node {
			return -1
		}
		return 1
	})
	return out, nil
}

// Resize changes a claim's GPUs: in place on its server when it fits there,
// otherwise by moving it to a server that can hold the new request (the VM
// restarts anyway). A move reserves on the new server first, then releases
// the old GPUs, then commits, so the claim is never committed twice.
func (a *Agent) Resize(ctx context.Context, id string, req api.ResizeRequest) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, a.apiError(err)
	}
	lreq, err := a.resolve(api.ClaimRequest{GPUs: req.GPUs})
	if err != nil {
		return api.Claim{}, err
	}
	targets := a.targets()
	cur, owner, err := a.locate(ctx, targets, id)
	if err != nil {
		return api.Claim{}, err
	}
	if cur.State != api.StateClaimed {
		return api.Claim{}, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("claim %s is still being placed; retry the resize once it is claimed", id)}
	}
	items := apiItems(lreq.Items)
	rctx, cancel := context.WithTimeout(ctx, reserveTimeout)
	c, err := owner.owner.ResizeInPlace(rctx, id, items)
	cancel()
	if err == nil || !isCode(err, api.CodeNotAvailable) {
		return c, err
	}

	// Move: every other server that can hold the new request, best first.
	want := wants(lreq.Items)
	var servers []placement.Server
	byName := map[string]target{}
	for _, t := range targets {
		if t.name != owner.name {
			servers = append(servers, t.server)
			byName[t.name] = t
		}
	}
	rr := api.ReserveRequest{Items: items, Labels: cur.Labels, Coordinator: a.cfg.NodeName}
	for _, name := range placement.Rank(servers, want, "", a.rnd()) {
		t := byName[name]
		rctx, cancel := context.WithTimeout(ctx, reserveTimeout)
		_, err := t.owner.Reserve(rctx, id, rr)
		cancel()
		if err != nil {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, ownerOpTimeout)
		_, err = owner.owner.Abort(actx, id)
		cancel()
		if err != nil && !isCode(err, api.CodeNotFound) {
			a.abortReservation(ctx, t, id)
			return api.Claim{}, fmt.Errorf("moving claim %s from %s to %s: releasing the old GPUs failed, nothing changed: %w", id, owner.name, name, err)
		}
		a.log.Info("claim moving", "claim", id, "from", owner.name, "to", name)
		return a.commitOn(ctx, t, id)
	}
	all := append(servers, owner.server)
	return api.Claim{}, a.notAvailable(items, all)
}

// notAvailable is the answer when no server can hold the request: every
// item no single server can hold (all of them when each fits somewhere but
// never together), and what would fit instead.
func (a *Agent) notAvailable(items []api.Item, servers []placement.Server) error {
	var missing []api.Item
	for _, it := range items {
		if len(placement.Rank(servers, []placement.Want{{Model: it.Model, Count: it.Count}}, "", nil)) == 0 {
			missing = append(missing, it)
		}
	}
	if len(missing) == 0 {
		missing = items
	}
	e := &api.Error{Code: api.CodeNotAvailable,
		Message: api.NotAvailableMessage(missing), Missing: missing}
	var want []placement.Want
	for _, it := range items {
		want = append(want, placement.Want{Model: it.Model, Count: it.Count})
	}
	for _, alt := range placement.Alternatives(servers, want, a.modelNames()) {
		var g []api.Item
		for _, w := range alt.Items {
			g = append(g, api.Item{Model: w.Model, Count: w.Count})
		}
		e.Alternatives = append(e.Alternatives, api.Alternative{GPUs: g, Servers: alt.Servers})
	}
	return e
}

func isCode(err error, code string) bool {
	var e *api.Error
	return errors.As(err, &e) && e.Code == code
}

func apiItems(items []ledger.Item) []api.Item {
	out := make([]api.Item, len(items))
	for i, it := range items {
		out[i] = api.Item{Model: it.Model, Count: it.Count}
	}
	return out
}

func wants(items []ledger.Item) []placement.Want {
	out := make([]placement.Want, len(items))
	for i, it := range items {
		out[i] = placement.Want{Model: it.Model, Count: it.Count}
	}
	return out
}

func sameItems(x, y []api.Item) bool {
	count := func(items []api.Item) map[string]int {
		m := map[string]int{}
		for _, it := range items {
			m[it.Model] += it.Count
		}
		return m
	}
	return maps.Equal(count(x), count(y))
}
