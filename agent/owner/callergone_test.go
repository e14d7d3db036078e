package owner

import (
	"context"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
)

// slowRelease is a registry whose name releases wait for the test: the
// owner's release holds the ID's commit lock meanwhile.
type slowRelease struct {
	Names
	entered chan struct{}
	proceed chan struct{}
}

func (s *slowRelease) ReleaseRemembering(ctx context.Context, key names.Key, token uint64, node string, keep time.Duration) (names.Record, error) {
	close(s.entered)
	<-s.proceed
	return s.Names.ReleaseRemembering(ctx, key, token, node, keep)
}

// A claim's retry, sent through a coordinator that then stopped waiting
// for it (killed, timed out), reaches the owner while the claim's release
// holds the ID's commit lock. Once the release is answered the client
// counts the ID free: the retry, served after it for nobody, must not
// reserve, hold or commit the claim again (it brought a released claim
// back in a chaos run: the coordinator had been killed and restarted).
func TestReserveOfACallerThatStoppedWaitingTakesNothing(t *testing.T) {
	for _, twoStep := range []bool{false, true} {
		name := "reserve and commit"
		if twoStep {
			name = "reserve, then commit"
		}
		t.Run(name, func(t *testing.T) {
			o := newTestOwner(t, "l40s-4", nil)
			local := names.NewLocal(o.clk.Now, 30*time.Second)
			reg := &slowRelease{Names: local, entered: make(chan struct{}), proceed: make(chan struct{})}
			o.namesNow = func() Names { return reg }
			ctx := context.Background()
			rr := api.ReserveRequest{Items: []api.Item{{Model: l40s, Count: 1}}, Coordinator: "a", Commit: true}
			if _, err := o.Reserve(ctx, "vm-1", rr); err != nil {
				t.Fatal(err)
			}

			released := make(chan error, 1)
			go func() {
				_, err := o.Abort(ctx, "vm-1")
				released <- err
			}()
			<-reg.entered // the ledger let the claim go; its name goes next

			gone, cancel := context.WithCancel(ctx)
			retried := make(chan error, 1)
			retry := rr
			retry.Coordinator = "b"
			retry.Commit = !twoStep
			go func() {
				_, err := o.Reserve(gone, "vm-1", retry)
				if err == nil && twoStep {
					_, err = o.Commit(gone, "vm-1")
				}
				retried <- err
			}()
			if !twoStep {
				// The retry waits for the commit lock.
				awaitUsers(t, "the commit lock of vm-1", func() int { return o.commitLocks.Users("vm-1") }, 2)
			}
			cancel() // its coordinator stops waiting
			close(reg.proceed)
			if err := <-released; err != nil {
				t.Fatalf("release: %v", err)
			}
			err := <-retried
			if !api.IsCode(err, api.CodeUnavailable) {
				t.Errorf("retry of a caller that stopped waiting: %v, want unavailable", err)
			}
			if c, err := o.ledger.Get("vm-1"); err == nil && (c.State == ledger.StateCommitted || !twoStep) {
				t.Errorf("vm-1 is %s on the owner after its release, for a caller that stopped waiting", c.State)
			}
			if rec, err := local.Lookup(ctx, names.Claim("vm-1"), names.Linearizable); err == nil {
				t.Errorf("the registry holds vm-1 again (%+v) after its release, for a caller that stopped waiting", rec)
			}
			if !twoStep && o.h.Recorder.Reservations(events.ReservationAbandoned) != 1 {
				t.Errorf("reservations counted abandoned: %d, want 1", o.h.Recorder.Reservations(events.ReservationAbandoned))
			}
		})
	}
}
