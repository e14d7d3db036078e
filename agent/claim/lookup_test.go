package claim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// fakeOwner is an api.Owner that holds committed claims in a map.
type fakeOwner struct {
	name string
	mu   sync.Mutex
	held map[string]api.Claim
	down bool
}

func (o *fakeOwner) Reserve(context.Context, string, api.ReserveRequest) (api.Claim, error) {
	return api.Claim{}, errors.New("not faked")
}
func (o *fakeOwner) Commit(context.Context, string) (api.Claim, error) {
	return api.Claim{}, errors.New("not faked")
}
func (o *fakeOwner) Abort(context.Context, string) (api.Claim, error) {
	return api.Claim{}, errors.New("not faked")
}
func (o *fakeOwner) AbortReservation(context.Context, string) (api.Claim, error) {
	return api.Claim{}, errors.New("not faked")
}
func (o *fakeOwner) ResizeInPlace(context.Context, string, []api.Item) (api.Claim, error) {
	return api.Claim{}, errors.New("not faked")
}
func (o *fakeOwner) LookupGroup(context.Context, string) (api.GroupRecord, error) {
	return api.GroupRecord{}, &api.Error{Code: api.CodeNotFound}
}
func (o *fakeOwner) DeleteGroup(context.Context, string) (api.GroupRecord, error) {
	return api.GroupRecord{}, &api.Error{Code: api.CodeNotFound}
}

func (o *fakeOwner) Lookup(_ context.Context, id string) (api.Claim, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.down {
		return api.Claim{}, fmt.Errorf("%s: connection refused", o.name)
	}
	c, ok := o.held[id]
	if !ok {
		return api.Claim{}, &api.Error{Code: api.CodeNotFound, Message: "claim " + id + " not found"}
	}
	return c, nil
}

func (o *fakeOwner) List(context.Context) ([]api.Claim, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []api.Claim
	for _, c := range o.held {
		out = append(out, c)
	}
	return out, nil
}

// fakeView is a cluster of fake owners; Unasked names every member not
// asked.
type fakeView struct{ owners []*fakeOwner }

func (v fakeView) Targets() []Target {
	out := make([]Target, len(v.owners))
	for i, o := range v.owners {
		out[i] = NewTarget(o.name, i == 0, o, map[string]int{}, false, map[string]ledger.ModelTotals{})
	}
	return out
}
func (v fakeView) Self() Target       { return v.Targets()[0] }
func (v fakeView) Clustered() bool    { return true }
func (v fakeView) Joined() bool       { return true }
func (v fakeView) Suspects() []Target { return nil }
func (v fakeView) Unasked(asked []string) []string {
	var out []string
	for _, o := range v.owners {
		if !containsName(asked, o.name) {
			out = append(out, o.name)
		}
	}
	return out
}
func (v fakeView) Refresh(string, []byte)                   {}
func (v fakeView) MemberStates() string                     { return "" }
func (v fakeView) RankAvoidedLast(ranked []string) []string { return ranked }
func (v fakeView) Members(context.Context) ([]api.Member, error) {
	return nil, nil
}

func containsName(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

type nopRecorder struct{}

func (nopRecorder) ClaimDone(string, time.Duration)            {}
func (nopRecorder) Reservation(string)                         {}
func (nopRecorder) VFIOOperation(string, time.Duration, error) {}
func (nopRecorder) XID(string, string, uint64)                 {}
func (nopRecorder) ClaimLookup(string)                         {}

// newFakeCoordinator is a coordinator on server a of owners, with no name
// registry and no home: lookups ask every owner.
func newFakeCoordinator(owners ...*fakeOwner) *Coordinator {
	return New(Deps{
		Config:   Config{NodeName: owners[0].name, ReservationLease: 30 * time.Second, MaxGPUsPerClaim: 16},
		Clock:    clock.NewManual(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)),
		Recorder: nopRecorder{},
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		View:     fakeView{owners},
	})
}

// A strict lookup (get, release) that did not ask a member the view knows
// now — its targets were read earlier, as in an agent that just woke from a
// freeze — must not answer "not found": that member may hold the claim.
func TestStrictLookupNamesMembersItDidNotAsk(t *testing.T) {
	a := &fakeOwner{name: "a"}
	b := &fakeOwner{name: "b", held: map[string]api.Claim{"vm-1": {ID: "vm-1", Node: "b", State: api.StateClaimed}}}
	co := newFakeCoordinator(a, b)
	ctx := context.Background()

	old := co.servers.Targets()[:1] // a only: b joined after
	_, _, err := co.findOnEveryServer(ctx, old, "vm-1", true, nil)
	var e *api.Error
	if !errors.As(err, &e) || e.Code != api.CodeUnavailable || !strings.Contains(e.Message, "b did not answer") {
		t.Fatalf("strict lookup that did not ask b: %v; want unavailable naming b", err)
	}
	c, on, err := co.findOnEveryServer(ctx, co.servers.Targets(), "vm-1", true, nil)
	if err != nil || c.Node != "b" || on.Name() != "b" {
		t.Fatalf("strict lookup asking everyone: %+v on %s, %v; want vm-1 on b", c, on.Name(), err)
	}

	// A member that does not answer: a strict lookup cannot say "not
	// found", a new claim (not strict) may go ahead.
	b.mu.Lock()
	b.down = true
	b.mu.Unlock()
	if _, _, err := co.findOnEveryServer(ctx, co.servers.Targets(), "vm-2", true, nil); !errors.As(err, &e) || e.Code != api.CodeUnavailable {
		t.Fatalf("strict lookup with b down: %v; want unavailable", err)
	}
	if _, _, err := co.findOnEveryServer(ctx, co.servers.Targets(), "vm-2", false, nil); !errors.As(err, &e) || e.Code != api.CodeNotFound {
		t.Fatalf("lookup for a new claim with b down: %v; want not found", err)
	}
}
