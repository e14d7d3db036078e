package claim

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
	"github.com/gpuherd/gpuherd/agent/home"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/placement"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// attempt is one placement of one claim ID by this coordinator: the
// request as every owner is asked for it, and the view it was ranked on.
// Its methods are the steps of docs/protocol.md, "Placing a claim".
type attempt struct {
	*Coordinator
	id     string
	rr     api.ReserveRequest // what each owner is asked to reserve
	want   []placement.Want   // the request, as placement ranks it
	prefer string             // the preferred server, or ""
	// anyNode lets a remembered ID be placed elsewhere than the server it
	// last ran on (lifecycle.go).
	anyNode bool
	// stay places the claim on prefer or nowhere (samenode.go).
	stay bool
	view []Target // the servers as this attempt saw them first
	// vouch, when set, says whether the claim ID's home vouched that
	// nobody else is placing it; it is asked once a reservation is made,
	// before committing it (it may wait for the home's answer), and a
	// false stops the placement with a *notVouched naming that
	// reservation. Without vouch, the copies that concurrent coordinators
	// may have placed are settled after the commit.
	// It is asked with the server reserved on; "" asks for the home's
	// word alone.
	vouch func(server string) bool
	// named: the claim ID is free in the name registry, and the owner
	// that commits holds it there first (namedclaim.go): no other copy
	// can be committed, so none is settled.
	named bool
}

// PendingPatience is how long a coordinator waits on another agent's
// intent to place the same claim ID before it looks the ID up on every
// server itself. A real placement shows within it: its reservation (which
// the every-server lookup then finds and finishes, or settles against) or
// its commit. An intent alone proves nothing — any member can post one for
// any ID — so it must not hold a real claim for a whole reservation's life.
const PendingPatience = 2 * time.Second

// PendingTTL is how long an intent counts as a placement in progress: a
// coordinator reserves within api.ReserveTimeout and commits within a
// lease.
func PendingTTL(lease time.Duration) time.Duration {
	return api.ReserveTimeout + lease + 5*time.Second
}

func (co *Coordinator) pendingTTL() time.Duration { return PendingTTL(co.cfg.ReservationLease) }

// lookUp places a claim through its ID's home (see agent/home). It
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
func (at *attempt) lookUp(ctx context.Context) (c api.Claim, done bool, err error) {
	home := home.Of(at.id, at.view, targetName)
	dir, ok := home.owner.(api.Directory)
	if !ok {
		return api.Claim{}, false, nil
	}
	type answer struct {
		ans api.DirAnswer
		err error
	}
	begin := func() answer {
		bctx, cancel := context.WithTimeout(ctx, api.LookupTimeout)
		defer cancel()
		ans, err := dir.BeginClaim(bctx, at.id, api.DirBegin{Coordinator: at.cfg.NodeName})
		return answer{ans, err}
	}
	placed := func(c api.Claim, err error) (api.Claim, bool, error) {
		if err != nil && !errors.Is(err, errCommitUnknown) {
			at.abandon(ctx, home)
		}
		return c, true, err
	}
	deadline := clock.NewDeadline(at.clk, min(at.pendingTTL(), PendingPatience))
	defer deadline.Stop()
	wait := 10 * time.Millisecond
	for first := true; ; first = false {
		var r answer
		if first {
			asked := make(chan answer, 1)
			go func() { asked <- begin() }()
			got := false
			vouch := func(server string) bool {
				if !got {
					r, got = <-asked, true
				}
				return r.err == nil && r.ans.State == api.DirNew && (server == "" || at.stays(recalled(at.prefer, r.ans.LastOwner), server))
			}
			c, err := at.placeVouched(ctx, vouch)
			if vouch("") {
				// The ID's home vouched for it: a reservation elsewhere
				// than the server the ID last ran on goes back there, or
				// (any_node) goes back there first when it can hold it
				// (lifecycle.go).
				last := recalled(at.prefer, r.ans.LastOwner)
				if !at.anyNode && last != "" {
					return placed(at.mustReturn(ctx, last, c, err))
				}
				return placed(at.returnTo(ctx, last, c, err))
			}
			var nv *notVouched
			if errors.As(err, &nv) && !nv.held && r.err == nil && (r.ans.State == api.DirHeld || r.ans.State == api.DirPending) {
				at.abortReservation(ctx, nv.t)
			}
		} else {
			r = begin()
		}
		if r.err != nil {
			at.log.Debug("claim directory: home did not answer; asking every server", "claim", at.id, "home", home.name, "err", r.err)
			return api.Claim{}, false, nil
		}
		ans := r.ans
		switch ans.State {
		case api.DirNew:
			last := recalled(at.prefer, ans.LastOwner)
			if !at.anyNode && last != "" {
				return placed(api.Claim{}, &goBack{node: last})
			}
			p := *at
			if last != "" {
				p.prefer = last
			}
			c, err := p.placeVouched(ctx, func(string) bool { return true })
			return placed(at.notePlaced(last, c, err))
		case api.DirHeld:
			if len(ans.Owners) != 1 {
				return api.Claim{}, false, nil // several copies: the slow way settles them
			}
			t, ok := targetNamed(at.view, ans.Owners[0])
			if !ok {
				return api.Claim{}, false, nil
			}
			lctx, cancel := context.WithTimeout(ctx, api.LookupTimeout)
			c, err := t.owner.Lookup(lctx, at.id)
			cancel()
			if err != nil {
				return api.Claim{}, false, nil // stale, or the owner does not answer
			}
			c, err = at.resume(ctx, c, t)
			return c, true, err
		case api.DirPending:
			// Another coordinator is placing it (a client retried
			// elsewhere): wait for its outcome rather than place a copy.
			if ans.Coordinator == at.cfg.NodeName || deadline.Passed() {
				return api.Claim{}, false, nil
			}
			if _, alive := targetNamed(at.servers.Targets(), ans.Coordinator); !alive {
				return api.Claim{}, false, nil
			}
			select {
			case <-ctx.Done():
				return api.Claim{}, true, ctx.Err()
			case <-clock.After(at.clk, wait):
			}
			wait = min(2*wait, 200*time.Millisecond)
		default:
			return api.Claim{}, false, nil
		}
	}
}

// rank is step 3: the servers that, by their figures in servers, can hold
// every item of the request, the preferred one first, then best fit, ties
// shuffled.
func (at *attempt) rank(servers []placement.Server) []string {
	ranked := at.servers.RankAvoidedLast(placement.Rank(servers, at.want, at.prefer, at.rnd()))
	if len(at.rr.Devices) > 0 || at.stay {
		// GPUs named by address are those of one server: no other
		// server's GPU of the same address is the one asked for. A claim
		// that must stay goes nowhere else.
		ranked = slices.DeleteFunc(ranked, func(n string) bool { return n != at.prefer })
	}
	return ranked
}

// place runs steps 3 to 8: it ranks the servers that, by this agent's view,
// can hold the whole request (rank, probe), asks their owners in turn until
// one takes it (ask, commit, settle), re-checks the capacity before giving
// up (recheck) and otherwise refuses (refuse). See attempt.vouch for how
// the home's word is awaited.
func (at *attempt) place(ctx context.Context) (api.Claim, error) {
	servers := make([]placement.Server, len(at.view))
	for i, t := range at.view {
		servers[i] = t.server
	}
	ranked := at.rank(servers)
	if busy(at.view, at.want) {
		ranked = at.probe(ctx, servers, ranked)
	}
	if len(ranked) > maxOwnerRetries {
		ranked = ranked[:maxOwnerRetries]
	}
	var (
		lastErr  error    // the last failure that was not a plain "no"
		failures []string // each such failure, in words (ownerFailure)
		refused  int
		tried    []string
		refusals []string // owners' reasons beyond "no" (unusable GPUs)
	)
	for round := 0; round < 2; round++ {
		if round == 1 {
			// The view says nothing (more) fits; it may be stale. Before
			// answering "not available", read the capacity of every server
			// that could hold the request, and try again on the fresh figures.
			servers = at.recheck(ctx, at.view)
			ranked = slices.DeleteFunc(at.rank(servers), func(n string) bool { return slices.Contains(tried, n) })
			if len(ranked) > maxOwnerRetries {
				ranked = ranked[:maxOwnerRetries]
			}
		}
		for _, name := range ranked {
			// A scan, not an index of the view: most claims ask one
			// server, and an index cost a map of every member per claim.
			t, _ := targetNamed(at.view, name)
			c, err := at.ask(ctx, t)
			if err == nil {
				if len(tried) > 0 {
					at.log.Info("claim placed after stale answers", "claim", at.id, "node", name, "attempt", len(tried)+1)
				}
				if at.vouch != nil || at.named || at.rr.Token != 0 {
					return c, nil // vouched for, or named by the registry: no other copy
				}
				return at.settle(ctx, c, t, tried)
			}
			tried = append(tried, name)
			if errors.Is(err, errCommitUnknown) || errors.Is(err, errRegistryDown) || errors.As(err, new(*notVouched)) || errors.As(err, new(*goBack)) ||
				api.IsCode(err, api.CodeConflict) || api.IsCode(err, api.CodeInvalid) || ctx.Err() != nil ||
				(at.rr.Token != 0 && api.IsCode(err, api.CodeLeaseExpired)) { // the name grant ended

				return api.Claim{}, err
			}
			if api.IsCode(err, api.CodeNotAvailable) {
				refused++
				refusals = append(refusals, api.RefusalsOf(err)...)
				at.refreshView(name, api.SummaryOf(err))
			} else {
				lastErr = fmt.Errorf("%s: %w", name, err)
				failures = append(failures, ownerFailure(name, err))
			}
			at.log.Debug("owner could not take the claim; next candidate", "claim", at.id, "node", name, "err", err)
		}
		if lastErr != nil && refused == 0 {
			break
		}
	}
	if len(tried) > 0 && refused == 0 {
		// Every server that should fit failed rather than said no (a full
		// disk, a broken owner): "not available" would hide why.
		return api.Claim{}, &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s was not placed: every server that could hold it failed to take it (%s); nothing was claimed: retry the claim, and if it keeps failing read the agent's log on those servers (journalctl -u gpuherd)",
				at.id, strings.Join(failures, "; "))}
	}
	if c, done, err := at.askSuspects(ctx, tried); done {
		return c, err
	}
	return api.Claim{}, withRefusals(at.refuse(at.rr.Items, servers), refusals)
}

// refreshView brings this agent's view of a peer that refused what the
// view said it could hold up to date, from the capacity the peer answered
// with (summary) or through gossip: the view was stale, and every later
// claim through this agent would rank that server by it until its next
// re-advertisement or the next full-state exchange.
func (at *attempt) refreshView(name string, summary []byte) {
	if name != at.cfg.NodeName {
		at.servers.Refresh(name, summary)
	}
}

// askSuspects is the last resort before "not available": the servers
// gossip holds suspect that, by their last summary, could hold the
// request, asked in rank order after every alive one. A suspect may be
// alive and merely slow to answer probes (a loaded machine), and then it
// takes the claim. One that does not answer makes the answer a retryable
// 503 naming it: "not available" would say that no server can hold the
// request, which nobody knows while a server that could is unheard. It
// reports done=false when no suspect could hold it, or every one asked
// said no.
func (at *attempt) askSuspects(ctx context.Context, tried []string) (api.Claim, bool, error) {
	if !at.servers.Clustered() {
		return api.Claim{}, false, nil
	}
	sus := at.servers.Suspects()
	servers := make([]placement.Server, len(sus))
	for i, t := range sus {
		servers[i] = t.server
	}
	var silent []string
	for _, name := range at.rank(servers) {
		if slices.Contains(tried, name) {
			continue
		}
		t, _ := targetNamed(sus, name)
		c, err := at.ask(ctx, t)
		if err == nil {
			at.log.Info("claim placed on a server gossip holds suspect", "claim", at.id, "node", name)
			if at.vouch != nil || at.named || at.rr.Token != 0 {
				return c, true, nil
			}
			c, err = at.settle(ctx, c, t, append(tried, name))
			return c, true, err
		}
		if errors.Is(err, errCommitUnknown) || errors.Is(err, errRegistryDown) || errors.As(err, new(*notVouched)) || errors.As(err, new(*goBack)) ||
			api.IsCode(err, api.CodeConflict) || api.IsCode(err, api.CodeInvalid) || ctx.Err() != nil ||
			(at.rr.Token != 0 && api.IsCode(err, api.CodeLeaseExpired)) {
			return api.Claim{}, true, err
		}
		if !api.IsCode(err, api.CodeNotAvailable) {
			silent = append(silent, name)
		}
		at.log.Debug("suspect server could not take the claim", "claim", at.id, "node", name, "err", err)
	}
	if len(silent) == 0 {
		return api.Claim{}, false, nil
	}
	return api.Claim{}, true, &api.Error{Code: api.CodeUnavailable,
		Message: fmt.Sprintf("claim %s: no server that answered can hold it; %s could by its last summary, but gossip holds it suspect (its probes go unanswered) and it did not answer: retry once it is back, or free GPUs elsewhere",
			at.id, strings.Join(silent, ", "))}
}

// placeVouched places with vouch as the home's word, leaving at itself
// as it was: the every-server path after it places without one.
func (at *attempt) placeVouched(ctx context.Context, vouch func(server string) bool) (api.Claim, error) {
	p := *at
	p.vouch = vouch
	return p.place(ctx)
}

// busy reports whether, by the view, at least busyShare of the healthy GPUs
// of a requested model are taken: the servers with room then change hands
// faster than gossip reports it, and choosing among them on stale figures
// is what scatters the free GPUs, so placements are probed first. Below
// that share a stale view costs at most a refused reservation (one
// request; the next candidate fits), which is cheaper than the probe's
// reads, and leaves room for what comes next anyway.
func busy(targets []Target, want []placement.Want) bool {
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

// probe re-ranks the candidates on their capacity read now, dropping
// those that cannot hold the request after all. Its first read (one
// parallel round trip) covers the probeWide servers whose free GPUs, by
// the view, are nearest the request on either side (placement.Nearest):
// best fit wants the server left with the fewest free GPUs, and when views
// lag the claims that is often one the view shows a little too full (a
// release not yet gossiped) or with a little more room than it has now.
// When none of them can hold it, the next best candidates by the view are
// read, probeTop at a time (at most probeRounds reads in all); the
// candidates not read follow unchanged. This replaces a "no" per stale
// candidate, and a worse fit chosen on stale figures, with one cheap read.
func (at *attempt) probe(ctx context.Context, servers []placement.Server, ranked []string) []string {
	var batch []string
	if len(at.rr.Devices) > 0 || at.stay {
		batch = ranked[:min(probeTop, len(ranked))] // one server is asked at most
	} else {
		batch = placement.Nearest(servers, at.want, func(name string) bool {
			t, ok := targetNamed(at.view, name)
			return ok && at.canHold(t)
		}, probeWide, at.rnd())
		if at.prefer != "" && !slices.Contains(batch, at.prefer) && slices.Contains(ranked, at.prefer) {
			batch = append(batch, at.prefer)
		}
	}
	read := map[string]bool{}
	for round := 0; round < probeRounds && len(batch) > 0; round++ {
		var top []Target
		for _, name := range batch {
			read[name] = true
			if t, ok := targetNamed(at.view, name); ok {
				top = append(top, t)
			}
		}
		fresh := at.rank(at.recheck(ctx, top))
		rest := slices.DeleteFunc(slices.Clone(ranked), func(n string) bool { return read[n] })
		if len(fresh) > 0 {
			return append(fresh, rest...)
		}
		batch = rest[:min(probeTop, len(rest))]
	}
	return slices.DeleteFunc(ranked, func(n string) bool { return read[n] })
}

// canHold reports whether t, by its healthy totals, could hold the whole
// request at all.
func (at *attempt) canHold(t Target) bool {
	for _, w := range at.want {
		if t.caps[w.Model].Healthy < w.Count {
			return false
		}
	}
	return true
}

// recheck (step 8, and probe's read) returns the targets' servers with the free counts read now from
// every one that, by its gossiped totals, could hold the request; the others keep
// their view. A server that does not answer keeps its view too.
func (at *attempt) recheck(ctx context.Context, targets []Target) []placement.Server {
	out := make([]placement.Server, len(targets))
	for i, t := range targets {
		out[i] = t.server
	}
	var wg sync.WaitGroup
	for i, t := range targets {
		cr, ok := t.owner.(api.CapacityReader)
		if !at.canHold(t) || !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, api.LookupTimeout)
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

// ask asks one owner to reserve, then commits once at.vouch
// agrees. A reservation that cannot be confirmed is aborted best-effort; it
// expires by itself anyway.
func (at *attempt) ask(ctx context.Context, t Target) (api.Claim, error) {
	rr := at.rr
	// Named: nothing to check between the reservation and the commit
	// (the owner holds the ID at commit), so both go in one call.
	rr.Commit = at.named
	rctx, cancel := context.WithTimeout(ctx, api.ReserveTimeout)
	r, err := t.owner.Reserve(rctx, at.id, rr)
	cancel()
	if api.IsCode(err, api.CodeConflict) && at.dropOrphan(ctx, t) { // orphans.go
		rctx, cancel := context.WithTimeout(ctx, api.ReserveTimeout)
		r, err = t.owner.Reserve(rctx, at.id, rr)
		cancel()
	}
	if err == nil && at.vouch != nil && !at.vouch(t.name) {
		return api.Claim{}, &notVouched{t: t, held: r.State == api.StateClaimed}
	}
	if e := (*api.Error)(nil); errors.As(err, &e) && e.Code == api.CodeGoBack && e.Node != "" {
		// The ID last ran on e.Node (the owner dropped its reservation).
		return api.Claim{}, &goBack{node: e.Node}
	}
	if err != nil {
		if errors.Is(err, api.ErrNotSent) {
			return api.Claim{}, err // nothing reserved there: try the next
		}
		var e *api.Error
		if (!errors.As(err, &e) || e.ServerFault()) && !at.abortReservation(ctx, t) && rr.Commit {
			// Unanswered, or failed half-way, and still there: a call that
			// also commits may commit after its answer was lost. Never
			// "try elsewhere", never "not available".
			return api.Claim{}, fmt.Errorf("%w: %w", errCommitUnknown, &api.Error{Code: api.CodeUnavailable,
				Message: fmt.Sprintf("claim %s: reservation and commit on %s unconfirmed (%v); retry the claim with the same ID to learn its state", at.id, t.name, err)})
		}
		return api.Claim{}, err
	}
	if at.named && r.State == api.StateClaimed {
		return r, nil
	}
	if at.named {
		// The owner could not decide the commit: its hold of the ID got
		// no answer from the registry (or it failed otherwise). Before
		// committing again, this coordinator asks the registry itself:
		// when it cannot answer either, the reservation is dropped and
		// the claim is a 503 naming the registry's servers, instead of
		// commits retried against a registry that is down.
		if err := at.registryAnswers(ctx); err != nil {
			at.abortReservation(ctx, t)
			return api.Claim{}, err
		}
	}
	return at.commit(ctx, t)
}

// errRegistryDown: the name registry did not answer this coordinator; the
// claim stops there (a 503 naming the registry's servers), no other server
// is tried.
var errRegistryDown = errors.New("name registry unavailable")

// registryAnswers reads the attempt's claim ID in the registry and returns
// errRegistryDown, wrapping the API's 503, when the registry cannot answer.
func (at *attempt) registryAnswers(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, api.NameTimeout)
	_, err := at.names().Lookup(lctx, names.Claim(at.id), names.Linearizable)
	cancel()
	if names.IsUnavailable(err) {
		return fmt.Errorf("%w: %w", errRegistryDown, claimNameError(at.id, err))
	}
	return nil
}

// commit commits the reservation at.id on t, retrying an unanswered commit
// (commits are idempotent). Once a commit was sent, the claim may exist on
// t: an answer that never comes is errCommitUnknown, never "try elsewhere".
func (at *attempt) commit(ctx context.Context, t Target) (api.Claim, error) {
	var last error
	for range commitAttempts {
		cctx, cancel := context.WithTimeout(ctx, api.OwnerOpTimeout)
		c, err := t.owner.Commit(cctx, at.id)
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
		Message: fmt.Sprintf("claim %s: commit on %s unconfirmed (%v); retry the claim with the same ID to learn its state", at.id, t.name, last)})
}

// abortReservation drops, best-effort, a reservation this coordinator made
// on t and will not commit, and reports whether t answered that none is
// left. Only a reservation: under the same ID a
// concurrent coordinator (a client that retried elsewhere) may have
// committed the claim on t meanwhile, and that claim stays. What is not
// dropped here expires with its lease.
func (at *attempt) abortReservation(ctx context.Context, t Target) (gone bool) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), api.AbortTimeout)
	defer cancel()
	_, err := t.owner.AbortReservation(actx, at.id)
	if err == nil || api.IsCode(err, api.CodeNotFound) {
		return true
	}
	at.log.Warn("reservation not aborted; retrying until its lease would have expired it", "claim", at.id, "node", t.name, "err", err)
	at.keepAborting(t, err) // orphans.go
	return false
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
func (at *attempt) settle(ctx context.Context, mine api.Claim, t Target, tried []string) (api.Claim, error) {
	deadline := clock.NewDeadline(at.clk, time.Duration(at.cfg.ReservationLease)+time.Second)
	defer deadline.Stop()
	wait := 20 * time.Millisecond
	var committed []copyOf
	for {
		hits, _ := at.allCopies(ctx, at.servers.Targets(), at.id)
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
		if !pending || deadline.Passed() || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-clock.After(at.clk, wait):
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
	if len(committed) < 2 || committed[0].t.name == t.name {
		return mine, nil
	}
	keep := committed[0]
	at.log.Warn("claim committed on two servers by concurrent coordinators; releasing this copy",
		"claim", at.id, "released_on", t.name, "kept_on", keep.t.name)
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), api.OwnerOpTimeout)
	defer cancel()
	if _, err := t.owner.Abort(actx, at.id); err != nil && !api.IsCode(err, api.CodeNotFound) {
		return api.Claim{}, api.Annotate(err, "claim %[2]s: committed on %[3]s and %[4]s by concurrent requests; releasing the copy on %[4]s failed: %[1]s", at.id, keep.t.name, t.name)
	}
	return keep.c, nil
}

// asks reports whether c, a claim found under the attempt's ID, is what
// the attempt asks for: the same items and labels and, for GPUs named by
// address, those GPUs.
func (at *attempt) asks(c api.Claim) bool {
	if !api.SameItems(c.Items, at.rr.Items) || !maps.Equal(c.Labels, at.rr.Labels) {
		return false
	}
	if len(at.rr.Devices) == 0 {
		return true
	}
	held := make([]string, len(c.GPUs))
	for i, g := range c.GPUs {
		held[i] = g.PCIAddress
	}
	slices.Sort(held)
	return slices.Equal(held, at.rr.Devices)
}

// resume answers a claim request whose ID is already held on t: the claim
// itself when the request is the same, after finishing its placement when
// it is only reserved (its coordinator may be gone).
func (at *attempt) resume(ctx context.Context, c api.Claim, t Target) (api.Claim, error) {
	if !at.asks(c) {
		return api.Claim{}, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("claim %s already exists on %s with a different request (%s); release it first or use another ID", at.id, c.Node, api.DescribeItems(c.Items))}
	}
	if c.State == api.StateClaimed {
		return c, nil
	}
	c, err := at.commit(ctx, t)
	if err != nil {
		return api.Claim{}, err
	}
	return at.settle(ctx, c, t, nil)
}

// abandon tells the home that this coordinator placed nothing for at.id.
func (at *attempt) abandon(ctx context.Context, home Target) {
	dir, ok := home.owner.(api.Directory)
	if !ok {
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), api.LookupTimeout)
	defer cancel()
	u := api.DirUpdate{From: at.cfg.NodeName, Ops: []api.DirOp{{ID: at.id, Op: api.DirOpAbandon}}}
	if err := dir.UpdateDirectory(actx, u); err != nil {
		at.log.Debug("claim directory: abandon not delivered; the intent goes stale", "claim", at.id, "home", home.name, "err", err)
	}
}

// errCommitUnknown: the commit was sent but its answer never came. The
// coordinator must not try another server: the claim may be committed.
var errCommitUnknown = errors.New("commit unconfirmed")

// notVouched: the claim ID's home did not vouch that the ID is new, and
// nothing was committed. The reservation made meanwhile on t is still there;
// the caller drops it or lets the every-server lookup find and finish it.
type notVouched struct {
	t Target
	// held: the owner answered with a claim committed under the ID
	// before (a retry), not with a reservation of this placement.
	held bool
}

func (e *notVouched) Error() string {
	return fmt.Sprintf("claim ID not vouched for by its home; reserved on %s meanwhile", e.t.name)
}

// ownerFailure says what went wrong when the owner name failed to take a
// claim (rather than said no), in words that hold outside that server:
// the owner speaks of "this server", and "not found" at a commit means
// the reservation made a moment before was gone.
func ownerFailure(name string, err error) string {
	var e *api.Error
	if errors.As(err, &e) {
		switch e.Code {
		case api.CodeNotFound, api.CodeLeaseExpired:
			return fmt.Sprintf("on %s the reservation was gone before its commit (its lease expired, or that agent restarted)", name)
		case api.CodeBindFailed:
			return fmt.Sprintf("on %s a GPU could not be bound to vfio-pci (gpuherd status there shows it): %s", name, e.Message)
		}
	}
	return fmt.Sprintf("%s: %v", name, err)
}
