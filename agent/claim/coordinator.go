package claim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/home"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/placement"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// The coordinator side of the protocol: any agent places a claim by ranking
// the servers that, by its view, can hold the whole request, and asking
// their owners in turn. The owners decide; the view is only a hint. See
// docs/protocol.md.

// The call timeouts are api's (ReserveTimeout, OwnerOpTimeout, …).
const (
	commitAttempts  = 3
	maxOwnerRetries = 8 // candidates asked for one claim before giving up
	// A coordinator that sees busyShare of a requested model taken reads
	// the capacity of the probeWide servers nearest the request, then of
	// its best candidates probeTop at a time, before asking them
	// (attempt.probe).
	probeWide   = 12
	probeTop    = 6
	probeRounds = 3
	busyShare   = 0.5
)

// Claim places the request on one server of the platform, all of it or
// nothing, and returns the committed claim. A retry with the same ID and
// request, through any agent, returns the same claim.
func (co *Coordinator) Claim(ctx context.Context, id string, req api.ClaimRequest) (api.Claim, error) {
	start := co.clk.Now()
	if err := validateVCPUs(req.VCPUs); err != nil {
		return api.Claim{}, err
	}
	if len(req.Devices) > 0 {
		var err error
		if req, err = co.pinned(req); err != nil {
			co.rec.ClaimDone(outcome(err), clock.Since(co.clk, start))
			return api.Claim{}, err
		}
	}
	c, err := co.claimWhere(ctx, id, req)
	co.rec.ClaimDone(outcome(err), clock.Since(co.clk, start))
	if err == nil {
		c = withVCPUWarning(c, req.VCPUs)
	}
	return c, err
}

// claimOutcomes is the metrics' outcome of a claim answered with each API
// error code: every code of api.ErrorCodes is here, so that a new code is
// counted as someone decided (TestEveryErrorCodeHasAClaimOutcome).
var claimOutcomes = map[string]string{
	api.CodeNotAvailable: events.ClaimNotAvailable,
	api.CodeInvalid:      events.ClaimInvalid,
	api.CodeUnknownModel: events.ClaimInvalid,
	api.CodeConflict:     events.ClaimConflict,
	api.CodeBindFailed:   events.ClaimBindFailed,
	api.CodeNotFound:     events.ClaimError,
	api.CodeLeaseExpired: events.ClaimError,
	api.CodeInternal:     events.ClaimError,
	api.CodeUnavailable:  events.ClaimError,
	api.CodeNotClaimed:   events.ClaimError,
	api.CodeInUse:        events.ClaimError,
	api.CodeNotBound:     events.ClaimError,
	api.CodeLost:         events.ClaimError,
	api.CodeForbidden:    events.ClaimError,
	api.CodeLimit:        events.ClaimError,
	api.CodeGoBack:       events.ClaimError,
}

// outcome is how the metrics count a claim answered with err.
func outcome(err error) string {
	var e *api.Error
	switch {
	case err == nil:
		return events.ClaimGranted
	case !errors.As(err, &e):
		return events.ClaimError
	}
	if o, ok := claimOutcomes[e.Code]; ok {
		return o
	}
	return events.ClaimError
}

// coordinate runs the steps of docs/protocol.md, "Placing a claim", on one
// attempt: validate, then look the ID up at its home (attempt.lookUp) or,
// when the home cannot vouch, on every server, then place.
func (co *Coordinator) coordinate(ctx context.Context, id string, req api.ClaimRequest) (api.Claim, error) {
	return co.coordinateOn(ctx, id, req, nil, false)
}

// coordinateOn is coordinate with the view's figures replaced by fresh
// ones for the servers in fresh (by name); with stay, the claim is placed
// on req.PreferNode or nowhere.
func (co *Coordinator) coordinateOn(ctx context.Context, id string, req api.ClaimRequest, fresh []placement.Server, stay bool) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, co.apiError(err)
	}
	// Requests for one ID through this agent go one at a time: a retry
	// waits for the first try and then finds its claim.
	unlock := co.claimLocks.Lock(id)
	defer unlock()
	at, err := co.validate(id, req)
	if err != nil {
		return api.Claim{}, err
	}
	at.view = withFresh(at.view, fresh)
	at.stay = stay
	if co.names() != nil {
		// The name registry decides the ID (namedclaim.go): no home to
		// vouch, no every-server lookup, no settling of copies.
		return at.placeNamed(ctx)
	}

	// The fast way: the claim ID's home vouches that it is new, or says
	// where it is.
	if co.servers.Clustered() {
		if c, done, err := at.lookUp(ctx); done {
			co.rec.ClaimLookup(events.LookupDirectory)
			return c, err
		}
		co.rec.ClaimLookup(events.LookupEveryServer)
	}

	// Idempotency across the platform, the slow way: the claim may already
	// be held, by this call's earlier try through any agent.
	if c, t, err := co.findOnEveryServer(ctx, at.view, id, false, nil); err == nil {
		return at.resume(ctx, c, t)
	} else if !api.IsCode(err, api.CodeNotFound) {
		return api.Claim{}, err
	}
	c, err := at.place(ctx)
	if err != nil && co.servers.Clustered() && !errors.Is(err, errCommitUnknown) {
		// Nothing placed: drop the intent the home recorded for us.
		at.abandon(ctx, home.Of(id, at.view, targetName))
	}
	return c, err
}

// validate is step 1: it resolves the request's models to catalog names and
// checks it, and returns the attempt that places it on this agent's view.
func (co *Coordinator) validate(id string, req api.ClaimRequest) (*attempt, error) {
	view := co.servers.Targets()
	lreq, err := co.resolveIn(req, view)
	if err != nil {
		return nil, err
	}
	if err := ledger.ValidateRequest(lreq, co.cfg.MaxGPUsPerClaim); err != nil {
		return nil, co.apiError(err)
	}
	return &attempt{
		Coordinator: co,
		id:          id,
		rr:          api.ReserveRequest{Items: lreq.Items, Labels: lreq.Labels, Coordinator: co.cfg.NodeName, Devices: lreq.Devices},
		want:        lreq.Items,
		prefer:      req.PreferNode,
		anyNode:     req.AnyNode,
		view:        view,
	}, nil
}

// Get returns a claim, wherever it is held.
func (co *Coordinator) Get(ctx context.Context, id string) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, co.apiError(err)
	}
	c, _, err := co.findClaim(ctx, co.servers.Targets(), id)
	return c, err
}

// Release frees a claim's GPUs, wherever it is held.
func (co *Coordinator) Release(ctx context.Context, id string) (released api.Claim, err error) {
	defer func() { released.NameReleased, released.NameElsewhere = false, false }() // between owner and coordinator only
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, co.apiError(err)
	}
	abort := func(ctx context.Context, t Target) (api.Claim, error) {
		c, err := t.owner.Abort(ctx, id)
		return neverClaimed(t.name, c, err) // orphans.go
	}
	if co.names() != nil {
		here, done, err := co.releaseHere(ctx, id, abort)
		if done {
			return here, err
		}
		targets := co.servers.Targets()
		c, err := co.releaseNamed(ctx, targets, id, abort)
		if here.ID == "" {
			return c, err
		}
		// The copy here was a leftover the registry does not name.
		switch {
		case api.IsCode(err, api.CodeNotFound):
			return here, nil
		case err == nil:
			c.Warnings = append(c.Warnings, fmt.Sprintf("claim %s had a leftover copy on %s (a move cut short), not the one the name registry names; it was released too", id, here.Node))
		}
		return c, err
	}
	targets := co.servers.Targets()
	h, err := co.askHome(ctx, targets, id, abort)
	if h.done {
		return h.claim, err
	}
	_, t, err := co.findOnEveryServer(ctx, targets, id, true, h.unseen)
	if err != nil {
		return api.Claim{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, api.OwnerOpTimeout)
	defer cancel()
	c, err := abort(rctx, t)
	return c, unanswered(ctx, id, t.name, err)
}

// releaseNamed is a release with the name registry: the copy the
// registry names is released, and every copy when it does not answer.
func (co *Coordinator) releaseNamed(ctx context.Context, targets []Target, id string, abort func(context.Context, Target) (api.Claim, error)) (api.Claim, error) {
	c, t, rec, handled, err := co.findNamed(ctx, targets, id, abort)
	switch {
	case handled && rec.State == names.StateLost:
		return co.releaseLost(ctx, id, rec)
	case handled && err == nil && c.NameReleased:
		return c, nil // the owner let the name go: no copy can hold it elsewhere
	case handled && err == nil:
		return co.releaseMovedAway(ctx, targets, id, t.name, rec, c, abort)
	case handled:
		return c, err
	}
	return co.releaseEveryCopy(ctx, targets, id, abort)
}

// releaseEveryCopy is a release while the name registry does not answer.
// Without it this agent cannot tell which copy of the claim is the one the
// registry names (a move cut short leaves two, one of them a leftover the
// anti-entropy pass would release), so it releases every copy the servers
// hold; while a member does not answer, a copy may be held there, and the
// answer is a 503 (retry the release) before anything is released.
func (co *Coordinator) releaseEveryCopy(ctx context.Context, targets []Target, id string, abort func(context.Context, Target) (api.Claim, error)) (api.Claim, error) {
	hits, silent := co.allCopies(ctx, targets, id)
	if len(silent) > 0 {
		return api.Claim{}, &api.Error{Code: api.CodeUnavailable,
			Message: fmt.Sprintf("claim %s: the name registry does not answer, and %s did not answer either, so a copy may be held there; retry the release when they are back (a server that will not come back: gpuherd members remove NODE)", id, strings.Join(silent, ", "))}
	}
	var (
		released api.Claim
		found    bool
	)
	for _, h := range hits { // the copy to answer with first (before)
		rctx, cancel := context.WithTimeout(ctx, api.OwnerOpTimeout)
		c, err := abort(rctx, h.t)
		cancel()
		switch {
		case api.IsCode(err, api.CodeNotFound):
		case err != nil:
			return api.Claim{}, unanswered(ctx, id, h.t.name, err)
		case !found:
			released, found = c, true
		default:
			released.Warnings = append(released.Warnings, fmt.Sprintf("claim %s had another copy on %s, released too", id, h.t.name))
		}
	}
	if !found {
		return api.Claim{}, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("claim %s not found on any server", id)}
	}
	return released, nil
}

// Claims lists the claims of every server that answered (ListClaims says
// which did not).
func (co *Coordinator) Claims(ctx context.Context) ([]api.Claim, error) {
	l, err := co.ListClaims(ctx)
	return l.Claims, err
}

// Resize changes a claim's GPUs: in place on its server when it fits there,
// otherwise by moving it to a server that can hold the new request (the VM
// restarts anyway). Without the name registry a move reserves on the new
// server first, then releases the old GPUs, then commits, so the claim is
// never committed twice; with it, the move commits the new placement
// before it releases the old one and the name goes along (resize_move.go).
func (co *Coordinator) Resize(ctx context.Context, id string, req api.ResizeRequest) (api.Claim, error) {
	return co.resizeOn(ctx, id, req, "")
}

// resizeOn is Resize with a server to prefer when the claim moves.
func (co *Coordinator) resizeOn(ctx context.Context, id string, req api.ResizeRequest, prefer string) (api.Claim, error) {
	if err := ledger.ValidateID(id); err != nil {
		return api.Claim{}, co.apiError(err)
	}
	lreq, err := co.resolve(api.ClaimRequest{GPUs: req.GPUs})
	if err != nil {
		return api.Claim{}, err
	}
	targets := co.servers.Targets()
	cur, owner, err := co.findClaim(ctx, targets, id)
	if err != nil {
		return api.Claim{}, err
	}
	if cur.State != api.StateClaimed {
		return api.Claim{}, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("claim %s is still being placed; retry the resize once it is claimed", id)}
	}
	items := lreq.Items
	rctx, cancel := context.WithTimeout(ctx, api.ReserveTimeout)
	c, err := owner.owner.ResizeInPlace(rctx, id, items)
	cancel()
	if err == nil || !api.IsCode(err, api.CodeNotAvailable) {
		return c, err
	}

	// Move: every other server that can hold the new request, best first.
	want := lreq.Items
	var servers []placement.Server
	byName := map[string]Target{}
	for _, t := range targets {
		if t.name != owner.name {
			servers = append(servers, t.server)
			byName[t.name] = t
		}
	}
	rr := api.ReserveRequest{Items: items, Labels: cur.Labels, Coordinator: co.cfg.NodeName}
	at := &attempt{Coordinator: co, id: id, rr: rr, want: want, view: targets}
	if co.names() != nil {
		return at.move(ctx, owner, placement.Rank(servers, want, prefer, co.rnd()), byName, append(servers, owner.server))
	}
	for _, name := range placement.Rank(servers, want, prefer, co.rnd()) {
		t := byName[name]
		rctx, cancel := context.WithTimeout(ctx, api.ReserveTimeout)
		_, err := t.owner.Reserve(rctx, id, rr)
		cancel()
		if err != nil {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, api.OwnerOpTimeout)
		_, err = owner.owner.Abort(actx, id)
		cancel()
		if err != nil && !api.IsCode(err, api.CodeNotFound) {
			at.abortReservation(ctx, t)
			// annotate, not %w: the API answers the *api.Error inside,
			// and its message alone (a release's advice) would not say
			// that this was a resize, nor that nothing changed.
			return api.Claim{}, api.Annotate(err, "moving claim %[2]s from %[3]s to %[4]s: the old GPUs could not be released (%[1]s); nothing changed, the claim stays on %[3]s: stop the VM that uses it, then resize again", id, owner.name, name)
		}
		co.log.Info("claim moving", "claim", id, "from", owner.name, "to", name)
		return at.commit(ctx, t)
	}
	all := append(servers, owner.server)
	return api.Claim{}, co.refuse(items, all)
}

// refuse (step 9) is the answer when no server can hold the request: every
// item no single server can hold (all of them when each fits somewhere but
// never together), and what would fit instead.
func (co *Coordinator) refuse(items []api.Item, servers []placement.Server) error {
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
	for _, alt := range placement.Alternatives(servers, items, co.modelNames()) {
		e.Alternatives = append(e.Alternatives, api.Alternative{GPUs: slices.Clone(alt.Items), Servers: alt.Servers})
	}
	return e
}
