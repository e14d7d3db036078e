package claim

import (
	"context"
	"fmt"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// Orphan reservations (issue 11, point 4). A coordinator reserves ahead of
// knowing the claim ID is new and aborts when it learns otherwise; an abort
// that never arrives (the owner slow or cut off) leaves a reservation no
// placement will commit, under the ID and another request. Until its lease
// ran out it made the ID's next claim answer a false conflict naming that
// owner, and a release answer with "state":"reserved". The coordinator keeps
// sending the abort while the reservation may live (keepAborting), and
// three rules keep what is left from mattering:
//
//   - the owner replaces a reservation whose name token is older than the
//     new request's (ledger/tokens.go), and returns its GPUs to the idle
//     driver (replacedGPUs);
//   - a coordinator whose ID's home vouched that nobody holds or places the
//     ID drops a reservation that conflicts with its request, and asks again
//     (dropOrphan): by the home's word it belongs to no placement;
//   - a release that finds only a reservation drops it and answers "not
//     found" (neverClaimed): there was no claim to release.

// abortRetryEvery is how often keepAborting sends an abort again.
const abortRetryEvery = time.Second

// keepAborting sends the abort of at.id's reservation on the peer t again,
// in the background, every abortRetryEvery, until the owner answers (the
// reservation is gone, or a claim committed under the ID refuses it) or a
// lease has passed since the first failure (first): by then the owner's
// sweep has dropped the reservation anyway. An owner that was only slow
// loses the orphan seconds after it answers again, not a lease later.
func (at *attempt) keepAborting(t Target, first error) {
	if t.self {
		return // this agent's own ledger answered: nothing to retry
	}
	// A deadline read by a timer: it ends the goroutine whether or not a
	// test froze the clock's Now.
	deadline := clock.NewDeadline(at.clk, time.Duration(at.cfg.ReservationLease))
	go func() {
		defer deadline.Stop()
		tick := at.clk.NewTicker(abortRetryEvery)
		defer tick.Stop()
		last := first
		for !deadline.Passed() {
			<-tick.C()
			actx, cancel := context.WithTimeout(context.Background(), api.AbortTimeout)
			_, err := t.owner.AbortReservation(actx, at.id)
			cancel()
			if err == nil || api.IsCode(err, api.CodeNotFound) || api.IsCode(err, api.CodeConflict) {
				at.log.Info("late abort of a reservation delivered", "claim", at.id, "node", t.name, "answer", errText(err))
				return
			}
			last = err
		}
		at.log.Warn("reservation never aborted; its lease has expired it", "claim", at.id, "node", t.name, "err", last)
	}()
}

func errText(err error) string {
	if err == nil {
		return "dropped"
	}
	return err.Error()
}

// dropOrphan is ask's answer to a conflict from t's Reserve: when t's copy
// of the ID is only a reservation and the ID's home vouched that nobody
// holds or places it, the reservation is an orphan; dropOrphan aborts it
// and reports true, so that ask reserves again. Without the home's word (no
// vouch, or the home did not vouch) a conflicting reservation may be a
// live placement's, and the conflict stands.
func (at *attempt) dropOrphan(ctx context.Context, t Target) bool {
	if at.vouch == nil {
		return false
	}
	lctx, cancel := context.WithTimeout(ctx, api.LookupTimeout)
	c, err := t.owner.Lookup(lctx, at.id)
	cancel()
	if err != nil || c.State != api.StateReserved || !at.vouch("") {
		return false
	}
	at.log.Warn("dropping an orphan reservation of the claim ID: its home says no placement holds it",
		"claim", at.id, "node", t.name, "items", api.DescribeItems(c.Items))
	at.abortReservation(ctx, t)
	return true
}

// neverClaimed is a release's answer once the owner node dropped c. A
// release that found only a reservation dropped a placement that never
// committed (an orphan, or the client's own unfinished claim): there was no
// claim, and "state":"reserved" would tell the client one existed. It
// answers not found, saying what was dropped.
func neverClaimed(node string, c api.Claim, err error) (api.Claim, error) {
	if err != nil || c.State != api.StateReserved {
		return c, err
	}
	return api.Claim{}, &api.Error{Code: api.CodeNotFound,
		Message: fmt.Sprintf("claim %s was never claimed on %s; the reservation an unfinished placement left (%s) was dropped",
			c.ID, node, api.DescribeItems(c.Items))}
}
