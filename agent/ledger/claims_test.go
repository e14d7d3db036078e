package ledger

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestReserveCommitRelease(t *testing.T) {
	l := newLedger(t)
	r := Request{Items: []Item{{Model: h100, Count: 2}}, Labels: map[string]string{"vm": "vm-1"}}

	c := mustReserve(t, l, "vm-1", r, t0)
	want := Claim{
		ID:          "vm-1",
		State:       StateReserved,
		Items:       []Item{{Model: h100, Count: 2}},
		GPUs:        []string{"0000:18:00.0", "0000:2a:00.0"},
		Labels:      map[string]string{"vm": "vm-1"},
		Coordinator: "coord-1",
		CreatedAt:   t0,
		ExpiresAt:   t0.Add(lease),
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("Reserve = %+v\nwant %+v", c, want)
	}
	if got, err := l.Get("vm-1"); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Get = %+v, %v; want %+v", got, err, want)
	}

	at := t0.Add(30 * time.Second)
	c = mustCommit(t, l, "vm-1", at)
	want.State, want.ExpiresAt, want.CommittedAt = StateCommitted, time.Time{}, at
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("Commit = %+v\nwant %+v", c, want)
	}
	// Committed claims do not expire.
	if !c.Live(at.Add(1000 * time.Hour)) {
		t.Fatal("committed claim not live long after")
	}

	got, err := l.Release("vm-1", at)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Release = %+v, %v; want %+v", got, err, want)
	}
	if _, err := l.Get("vm-1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after release: %v, want ErrNotFound", err)
	}
	if free := l.Free(at)[h100]; free != 8 {
		t.Fatalf("free H100 after release = %d, want 8", free)
	}
}

func TestReserveUsesPlacement(t *testing.T) {
	l := newLedger(t)
	// Both nodes have 4 free H100: tie, node 0.
	if c := mustReserve(t, l, "a", req(Item{Model: h100, Count: 3}), t0); !slices.Equal(c.GPUs, []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"}) {
		t.Fatalf("a got %v", c.GPUs)
	}
	// Node 0 has 1 left, too few: node 1.
	if c := mustReserve(t, l, "b", req(Item{Model: h100, Count: 2}), t0); !slices.Equal(c.GPUs, []string{"0000:9a:00.0", "0000:ab:00.0"}) {
		t.Fatalf("b got %v", c.GPUs)
	}
	// Best fit: node 0's single GPU, keeping node 1's pair whole.
	if c := mustReserve(t, l, "c", req(Item{Model: h100, Count: 1}), t0); !slices.Equal(c.GPUs, []string{"0000:5d:00.0"}) {
		t.Fatalf("c got %v", c.GPUs)
	}
}

func TestReserveSeveralModels(t *testing.T) {
	l := newLedger(t)
	c := mustReserve(t, l, "vm-1", req(Item{Model: l40s, Count: 2}, Item{Model: h100, Count: 1}), t0)
	want := []string{"0000:18:00.0", "0000:61:00.0", "0000:62:00.0"}
	if !slices.Equal(c.GPUs, want) {
		t.Fatalf("GPUs = %v, want %v (sorted)", c.GPUs, want)
	}
	if !slices.Equal(c.Items, []Item{{Model: l40s, Count: 2}, {Model: h100, Count: 1}}) {
		t.Fatalf("Items = %v, want the request's order", c.Items)
	}
}

func TestReserveNotAvailable(t *testing.T) {
	l := newLedger(t)
	mustReserve(t, l, "big", req(Item{Model: h100, Count: 6}), t0)
	rev := l.Revision()

	_, err := l.Reserve("vm-2", req(Item{Model: h100, Count: 4}, Item{Model: l40s, Count: 1}, Item{Model: "A100 80GB", Count: 1}), "", t0, lease)
	var na *NotAvailableError
	if !errors.As(err, &na) || !errors.Is(err, ErrNotAvailable) {
		t.Fatalf("Reserve = %v, want *NotAvailableError", err)
	}
	// Every short item, each with its full count (2 H100 are free, but an
	// item is all or nothing); the L40S that would fit is not listed.
	want := []Item{{Model: h100, Count: 4}, {Model: "A100 80GB", Count: 1}}
	if na.ID != "vm-2" || !slices.Equal(na.Missing, want) {
		t.Fatalf("NotAvailableError = %+v, want missing %v", na, want)
	}
	for _, s := range []string{`"vm-2"`, "4 × H100 80GB", "1 × A100 80GB", "not available"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("message %q lacks %q", err, s)
		}
	}
	// Nothing written: the L40S that fit was not taken.
	if _, err := l.Get("vm-2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get(vm-2) = %v, want ErrNotFound", err)
	}
	if got := l.Free(t0)[l40s]; got != 2 {
		t.Fatalf("free L40S = %d, want 2", got)
	}
	if l.Revision() != rev {
		t.Fatalf("revision moved on a refused reservation: %d -> %d", rev, l.Revision())
	}
}

func TestReserveIdempotent(t *testing.T) {
	l := newLedger(t)
	r := Request{Items: []Item{{Model: h100, Count: 2}, {Model: l40s, Count: 1}}, Labels: map[string]string{"team": "ml"}}
	first := mustReserve(t, l, "vm-1", r, t0)
	rev := l.Revision()

	// Same request, items in another order, later, from another coordinator.
	retry, err := l.Reserve("vm-1", Request{Items: []Item{{Model: l40s, Count: 1}, {Model: h100, Count: 2}}, Labels: map[string]string{"team": "ml"}}, "coord-2", t0.Add(10*time.Second), lease)
	if err != nil || !reflect.DeepEqual(retry, first) {
		t.Fatalf("retry = %+v, %v; want the first claim unchanged %+v", retry, err, first)
	}
	if l.Revision() != rev {
		t.Fatal("an idempotent retry moved the revision")
	}

	committed := mustCommit(t, l, "vm-1", t0.Add(20*time.Second))
	retry, err = l.Reserve("vm-1", r, "coord-1", t0.Add(time.Hour), lease)
	if err != nil || !reflect.DeepEqual(retry, committed) {
		t.Fatalf("retry after commit = %+v, %v; want %+v", retry, err, committed)
	}

	for name, other := range map[string]Request{
		"count":  {Items: []Item{{Model: h100, Count: 3}, {Model: l40s, Count: 1}}, Labels: r.Labels},
		"model":  {Items: []Item{{Model: h100, Count: 2}}, Labels: r.Labels},
		"labels": {Items: r.Items, Labels: map[string]string{"team": "web"}},
	} {
		_, err := l.Reserve("vm-1", other, "coord-1", t0.Add(time.Hour), lease)
		var ce *ConflictError
		if !errors.As(err, &ce) || !errors.Is(err, ErrConflict) || ce.ID != "vm-1" || ce.Existing.State != StateCommitted {
			t.Errorf("%s differs: Reserve = %v, want *ConflictError for vm-1", name, err)
		}
	}
}

func TestReserveAfterLeaseExpired(t *testing.T) {
	l := newLedger(t)
	mustReserve(t, l, "vm-1", req(Item{Model: l40s, Count: 2}), t0)

	// At ExpiresAt exactly the reservation is no longer live: its GPUs are
	// free for someone else.
	end := t0.Add(lease)
	if got := l.Free(end)[l40s]; got != 2 {
		t.Fatalf("free L40S at the deadline = %d, want 2", got)
	}
	other := mustReserve(t, l, "vm-2", req(Item{Model: l40s, Count: 1}), end)

	// The same ID may reserve again, under a new lease, on what is left.
	again, err := l.Reserve("vm-1", req(Item{Model: l40s, Count: 1}), "coord-1", end, lease)
	if err != nil {
		t.Fatalf("re-reserve after expiry: %v", err)
	}
	if !again.CreatedAt.Equal(end) || !again.ExpiresAt.Equal(end.Add(lease)) {
		t.Fatalf("re-reservation = %+v, want a new lease from %v", again, end)
	}
	if slices.Equal(again.GPUs, other.GPUs) {
		t.Fatalf("vm-1 and vm-2 share %v", again.GPUs)
	}
}

func TestReserveSkipsUnavailableGPUs(t *testing.T) {
	l := newLedger(t)
	inv := server()
	inv[8].Healthy = false // 0000:61:00.0 L40S
	if err := l.SetInventory(inv); err != nil {
		t.Fatal(err)
	}
	if err := l.Drain("0000:62:00.0", "fan failure", t0); err != nil {
		t.Fatal(err)
	}
	_, err := l.Reserve("vm-1", req(Item{Model: l40s, Count: 1}), "", t0, lease)
	if !errors.Is(err, ErrNotAvailable) {
		t.Fatalf("Reserve with the only L40S sick and the other drained = %v, want ErrNotAvailable", err)
	}
}

func TestReserveRejectsInvalidInput(t *testing.T) {
	l := newLedger(t)
	tests := []struct {
		name        string
		id          string
		req         Request
		coordinator string
		lease       time.Duration
		field       string
	}{
		{"bad id", "vm 1", req(Item{Model: h100, Count: 1}), "", lease, "id"},
		{"bad request", "vm-1", req(Item{Model: h100, Count: 0}), "", lease, "items[0].count"},
		{"zero lease", "vm-1", req(Item{Model: h100, Count: 1}), "", 0, "lease"},
		{"negative lease", "vm-1", req(Item{Model: h100, Count: 1}), "", -time.Second, "lease"},
		{"coordinator too long", "vm-1", req(Item{Model: h100, Count: 1}), strings.Repeat("c", MaxCoordinatorLen+1), lease, "coordinator"},
	}
	for _, tt := range tests {
		_, err := l.Reserve(tt.id, tt.req, tt.coordinator, t0, tt.lease)
		var ve *ValidationError
		if !errors.As(err, &ve) || ve.Field != tt.field {
			t.Errorf("%s: Reserve = %v, want *ValidationError on %s", tt.name, err, tt.field)
		}
	}
	if n := len(l.List()); n != 0 {
		t.Fatalf("%d claims written by invalid requests", n)
	}
}

func TestMaxGPUsOption(t *testing.T) {
	l := newLedger(t, WithMaxGPUs(2))
	if l.MaxGPUs() != 2 {
		t.Fatalf("MaxGPUs = %d", l.MaxGPUs())
	}
	_, err := l.Reserve("vm-1", req(Item{Model: h100, Count: 3}), "", t0, lease)
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("Reserve of 3 with max 2 = %v, want ErrInvalid", err)
	}
}

func TestCommit(t *testing.T) {
	l := newLedger(t)
	if _, err := l.Commit("nope", t0); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("Commit(unknown) = %v, want ErrNotFound naming the claim", err)
	}

	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 1}), t0)
	first := mustCommit(t, l, "vm-1", t0.Add(time.Second))
	rev := l.Revision()
	again := mustCommit(t, l, "vm-1", t0.Add(time.Hour))
	if !reflect.DeepEqual(again, first) || l.Revision() != rev {
		t.Fatalf("second Commit = %+v (revision %d->%d), want %+v unchanged", again, rev, l.Revision(), first)
	}

	// A reservation is expired at its deadline exactly: never committed.
	mustReserve(t, l, "vm-2", req(Item{Model: h100, Count: 1}), t0)
	_, err := l.Commit("vm-2", t0.Add(lease))
	if !errors.Is(err, ErrLeaseExpired) || !strings.Contains(err.Error(), `"vm-2"`) {
		t.Fatalf("Commit at the deadline = %v, want ErrLeaseExpired naming vm-2", err)
	}
	// ... and it is dropped, so a retry says it is gone.
	if _, err := l.Get("vm-2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after a failed commit = %v, want ErrNotFound", err)
	}
	if _, err := l.Commit("vm-2", t0.Add(lease)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Commit retry = %v, want ErrNotFound", err)
	}
}

func TestExtend(t *testing.T) {
	l := newLedger(t)
	if _, err := l.Extend("nope", t0, lease); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Extend(unknown) = %v, want ErrNotFound", err)
	}
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 1}), t0)

	c, err := l.Extend("vm-1", t0.Add(50*time.Second), 2*lease)
	if err != nil || !c.ExpiresAt.Equal(t0.Add(50*time.Second+2*lease)) {
		t.Fatalf("Extend = %+v, %v", c, err)
	}
	// A shorter lease does not shorten it (a late retry of an old Extend).
	rev := l.Revision()
	c2, err := l.Extend("vm-1", t0.Add(51*time.Second), time.Second)
	if err != nil || !c2.ExpiresAt.Equal(c.ExpiresAt) || l.Revision() != rev {
		t.Fatalf("shorter Extend = %+v, %v; want deadline %v kept", c2, err, c.ExpiresAt)
	}
	if _, err := l.Extend("vm-1", t0, 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Extend with zero lease = %v, want ErrInvalid", err)
	}
	// The extended lease holds past the original deadline.
	mustCommit(t, l, "vm-1", t0.Add(lease+time.Second))
	if c, err := l.Extend("vm-1", t0.Add(time.Hour), lease); err != nil || c.State != StateCommitted || !c.ExpiresAt.IsZero() {
		t.Fatalf("Extend(committed) = %+v, %v; want it unchanged", c, err)
	}

	mustReserve(t, l, "vm-2", req(Item{Model: h100, Count: 1}), t0)
	if _, err := l.Extend("vm-2", t0.Add(lease), lease); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("Extend after the deadline = %v, want ErrLeaseExpired", err)
	}
	if _, err := l.Get("vm-2"); !errors.Is(err, ErrNotFound) {
		t.Fatal("expired reservation kept after a failed Extend")
	}
}

func TestRelease(t *testing.T) {
	l := newLedger(t)
	if _, err := l.Release("nope", t0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Release(unknown) = %v, want ErrNotFound", err)
	}
	res := mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 1}), t0)
	if got, err := l.Release("vm-1", t0.Add(time.Second)); err != nil || !reflect.DeepEqual(got, res) {
		t.Fatalf("Release(reserved) = %+v, %v; want %+v", got, err, res)
	}
	if _, err := l.Release("vm-1", t0.Add(time.Second)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second Release = %v, want ErrNotFound", err)
	}

	mustReserve(t, l, "vm-2", req(Item{Model: h100, Count: 1}), t0)
	if _, err := l.Release("vm-2", t0.Add(lease)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Release(expired) = %v, want ErrNotFound", err)
	}
	if len(l.List()) != 0 {
		t.Fatalf("Release left %v", l.List())
	}
}

// TestAbortReservationLeavesACommittedClaim: the abort a coordinator sends
// after a reserve it could not confirm drops a reservation, but never the
// claim a concurrent coordinator committed under the same ID.
func TestAbortReservationLeavesACommittedClaim(t *testing.T) {
	l := newLedger(t)
	if _, err := l.AbortReservation("nope", t0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("AbortReservation(unknown) = %v, want ErrNotFound", err)
	}
	res := mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 1}), t0)
	if got, err := l.AbortReservation("vm-1", t0.Add(time.Second)); err != nil || !reflect.DeepEqual(got, res) {
		t.Fatalf("AbortReservation(reserved) = %+v, %v; want %+v", got, err, res)
	}
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 1}), t0)
	held := mustCommit(t, l, "vm-1", t0.Add(time.Second))
	rev := l.Revision()
	_, err := l.AbortReservation("vm-1", t0.Add(2*time.Second))
	if !errors.Is(err, ErrCommitted) || !strings.Contains(err.Error(), "vm-1") {
		t.Fatalf("AbortReservation(committed) = %v, want ErrCommitted naming the claim", err)
	}
	if got, err := l.Get("vm-1"); err != nil || !reflect.DeepEqual(got, held) {
		t.Fatalf("after the refused abort: %+v, %v; want the committed claim %+v", got, err, held)
	}
	if l.Revision() != rev {
		t.Error("a refused abort moved the revision")
	}
	if _, err := l.Release("vm-1", t0.Add(3*time.Second)); err != nil {
		t.Fatalf("Release(committed) = %v", err)
	}
}

func TestExpire(t *testing.T) {
	l := newLedger(t)
	mustReserve(t, l, "b-short", req(Item{Model: h100, Count: 1}), t0)
	mustReserve(t, l, "a-short", req(Item{Model: h100, Count: 1}), t0)
	mustReserve(t, l, "long", req(Item{Model: h100, Count: 1}), t0.Add(lease))
	mustReserve(t, l, "done", req(Item{Model: l40s, Count: 1}), t0)
	mustCommit(t, l, "done", t0)

	rev := l.Revision()
	if got, err := l.Expire(t0.Add(lease - time.Nanosecond)); err != nil || len(got) != 0 || l.Revision() != rev {
		t.Fatalf("Expire before any deadline = %v, %v (revision %d->%d)", got, err, rev, l.Revision())
	}
	got, err := l.Expire(t0.Add(lease))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range got {
		ids = append(ids, c.ID)
	}
	if !slices.Equal(ids, []string{"a-short", "b-short"}) {
		t.Fatalf("Expire removed %v, want [a-short b-short]", ids)
	}
	if l.Revision() != rev+1 {
		t.Fatalf("revision %d -> %d, want one bump", rev, l.Revision())
	}
	var left []string
	for _, c := range l.List() {
		left = append(left, c.ID)
	}
	if !slices.Equal(left, []string{"done", "long"}) {
		t.Fatalf("left %v, want [done long] sorted", left)
	}
}

func TestListReturnsCopies(t *testing.T) {
	l := newLedger(t)
	mustReserve(t, l, "vm-1", Request{Items: []Item{{Model: h100, Count: 1}}, Labels: map[string]string{"a": "b"}}, t0)
	c := l.List()[0]
	c.GPUs[0] = "0000:00:00.0"
	c.Labels["a"] = "changed"
	c.Items[0].Count = 99
	again, _ := l.Get("vm-1")
	if again.GPUs[0] != "0000:18:00.0" || again.Labels["a"] != "b" || again.Items[0].Count != 1 {
		t.Fatalf("caller's changes leaked into the ledger: %+v", again)
	}
}

func TestRevisionMovesOnEveryChange(t *testing.T) {
	l := newLedger(t)
	steps := []struct {
		name string
		do   func() error
	}{
		{"reserve", func() error { _, err := l.Reserve("vm-1", req(Item{Model: h100, Count: 1}), "", t0, lease); return err }},
		{"extend", func() error { _, err := l.Extend("vm-1", t0.Add(time.Second), lease); return err }},
		{"commit", func() error { _, err := l.Commit("vm-1", t0); return err }},
		{"drain", func() error { return l.Drain("0000:9a:00.0", "maintenance", t0) }},
		{"undrain", func() error { return l.Undrain("0000:9a:00.0") }},
		{"inventory", func() error { return l.SetInventory(server()[:4]) }},
		{"release", func() error { _, err := l.Release("vm-1", t0); return err }},
	}
	for _, s := range steps {
		before := l.Revision()
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if l.Revision() != before+1 {
			t.Fatalf("%s: revision %d -> %d, want +1", s.name, before, l.Revision())
		}
	}
}

// TestConcurrentReserve races many coordinators for the same GPUs: each GPU
// goes to exactly one of them and the losers are told it is not available.
func TestConcurrentReserve(t *testing.T) {
	l := newLedger(t)
	const n = 24
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		holders = map[string]string{}
		refused int
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("vm-%d", i)
			c, err := l.Reserve(id, req(Item{Model: h100, Count: 1}), "", t0, lease)
			if err == nil {
				_, err = l.Commit(id, t0)
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, ErrNotAvailable):
				refused++
			case err != nil:
				t.Errorf("%s: %v", id, err)
			default:
				for _, g := range c.GPUs {
					if other, dup := holders[g]; dup {
						t.Errorf("GPU %s given to %s and %s", g, other, id)
					}
					holders[g] = id
				}
			}
		}()
	}
	wg.Wait()
	if len(holders) != 8 || refused != n-8 {
		t.Fatalf("%d GPUs handed out, %d refused; want 8 and %d", len(holders), refused, n-8)
	}
}

// TestCommitUnder: the token the registry held the claim ID under at
// commit is kept with the claim, through a restart; a retried commit
// keeps the first one.
func TestCommitUnder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l := openAt(t, path)
	if err := l.SetInventory(server()); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 1}), t0)
	c, err := l.CommitUnder("vm-1", 42, t0)
	if err != nil || c.NameToken != 42 || c.State != StateCommitted {
		t.Fatalf("CommitUnder = %+v, %v", c, err)
	}
	if c, _ := l.CommitUnder("vm-1", 43, t0); c.NameToken != 42 {
		t.Fatalf("a retried commit moved the token to %d", c.NameToken)
	}
	l.Close()
	l = openAt(t, path)
	if c, err := l.Get("vm-1"); err != nil || c.NameToken != 42 {
		t.Fatalf("after a restart: %+v, %v", c, err)
	}
}

// TestCommitReservation: only the reservation made at the time given is
// committed; one that replaced it under the same ID is left reserved.
func TestCommitReservation(t *testing.T) {
	l := newLedger(t)
	first, err := l.Reserve("vm-1", req(Item{Model: h100, Count: 1}), "coord-1", t0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	later := t0.Add(2 * time.Second) // the first lapsed
	again := mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 2}), later)
	if _, err := l.CommitReservation("vm-1", first.CreatedAt, 7, later); !errors.Is(err, ErrNotFound) {
		t.Fatalf("commit of the replaced reservation: %v, want ErrNotFound", err)
	}
	if c, err := l.Get("vm-1"); err != nil || c.State != StateReserved || c.NameToken != 0 {
		t.Fatalf("the new reservation after that: %+v, %v; want reserved, no token", c, err)
	}
	c, err := l.CommitReservation("vm-1", again.CreatedAt, 7, later)
	if err != nil || c.State != StateCommitted || c.NameToken != 7 {
		t.Fatalf("commit of the new reservation: %+v, %v", c, err)
	}
}
