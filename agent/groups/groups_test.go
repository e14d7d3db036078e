package groups_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/groups"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/placement"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// The groups role built from fakes alone: a coordinator that places each
// claim on the first server with room, a name authority that keeps its
// records in a map, and the view those servers give.

const model = "L40S"

// fakeClaims is the coordinator over servers of one model.
type fakeClaims struct {
	mu     sync.Mutex
	free   map[string]int       // server → free GPUs
	order  []string             // servers, first tried first
	claims map[string]api.Claim // by ID
	// refuse answers a claim of these IDs not available, whatever the room.
	refuse map[string]bool
	// placed lists every claim placed, in order.
	placed []string
}

func newFakeClaims(free ...int) *fakeClaims {
	c := &fakeClaims{free: map[string]int{}, claims: map[string]api.Claim{}, refuse: map[string]bool{}}
	for i, n := range free {
		s := string(rune('a' + i))
		c.free[s] = n
		c.order = append(c.order, s)
	}
	return c
}

func count(items []api.Item) int {
	n := 0
	for _, it := range items {
		n += it.Count
	}
	return n
}

func (c *fakeClaims) Claim(_ context.Context, id string, req api.ClaimRequest) (api.Claim, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if have, ok := c.claims[id]; ok {
		return have, nil
	}
	n := count(req.GPUs)
	for _, s := range c.order {
		if c.refuse[id] || c.free[s] < n {
			continue
		}
		c.free[s] -= n
		cl := api.Claim{ID: id, Node: s, State: api.StateClaimed, Items: req.GPUs, Labels: req.Labels}
		c.claims[id] = cl
		c.placed = append(c.placed, id)
		return cl, nil
	}
	return api.Claim{}, &api.Error{Code: api.CodeNotAvailable, Message: api.NotAvailableMessage(req.GPUs), Missing: req.GPUs}
}

func (c *fakeClaims) Get(_ context.Context, id string) (api.Claim, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl, ok := c.claims[id]
	if !ok {
		return api.Claim{}, &api.Error{Code: api.CodeNotFound, Message: "claim " + id + " not found"}
	}
	return cl, nil
}

func (c *fakeClaims) Release(_ context.Context, id string) (api.Claim, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl, ok := c.claims[id]
	if !ok {
		return api.Claim{}, &api.Error{Code: api.CodeNotFound, Message: "claim " + id + " not found"}
	}
	delete(c.claims, id)
	c.free[cl.Node] += count(cl.Items)
	return cl, nil
}

func (c *fakeClaims) Resize(context.Context, string, api.ResizeRequest, string) (api.Claim, error) {
	return api.Claim{}, errors.New("the fake coordinator does not resize")
}

// held lists the claims held, sorted.
func (c *fakeClaims) held() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for id := range c.claims {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// Servers is the fake coordinator's servers as a View sees them.
func (c *fakeClaims) Servers() []placement.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []placement.Server
	for _, s := range c.order {
		out = append(out, placement.Server{Name: s, Free: map[string]int{model: c.free[s]}})
	}
	return out
}

// fakeView is the view of a fakeClaims' servers.
type fakeView struct {
	c       *fakeClaims
	keepers []groups.RecordKeeper
}

func (v *fakeView) Servers() []placement.Server { return v.c.Servers() }
func (v *fakeView) ServersNow(context.Context, []placement.Want) []placement.Server {
	return v.c.Servers()
}
func (v *fakeView) Keepers() []groups.RecordKeeper { return v.keepers }

// fakeCatalog knows one model, by its one name.
type fakeCatalog struct{}

func (fakeCatalog) Resolve(req api.ClaimRequest) (ledger.Request, error) {
	var out ledger.Request
	for _, it := range req.GPUs {
		if it.Model != model {
			return ledger.Request{}, &api.Error{Code: api.CodeUnknownModel, Message: "no model " + it.Model}
		}
		out.Items = append(out.Items, it)
	}
	return out, nil
}

func (fakeCatalog) ModelNames() []string { return []string{model} }

// fakeNames is a name authority in a map; every write takes the next
// index, as the registry's raft log does.
type fakeNames struct {
	mu    sync.Mutex
	index uint64
	recs  map[names.Key]names.Record
}

var (
	_ groups.Names   = (*fakeNames)(nil)
	_ groups.Stamper = (*fakeNames)(nil)
)

func newFakeNames() *fakeNames { return &fakeNames{recs: map[names.Key]names.Record{}} }

func refused(op names.Op, key names.Key, code names.Code, r *names.Record) error {
	return &names.RefusedError{Op: op, Key: key, Code: code, Record: r}
}

func (n *fakeNames) Acquire(_ context.Context, key names.Key, caller, owner, request string, members []string) (names.Grant, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if r, ok := n.recs[key]; ok {
		if r.Request == request {
			return names.Grant{Record: r, Retry: true}, nil
		}
		return names.Grant{}, refused(names.OpAcquire, key, names.CodeConflict, &r)
	}
	n.index++
	r := names.Record{Kind: key.Kind, Name: key.Name, Owner: owner, Caller: caller, Request: request,
		State: names.StatePending, Token: n.index, Index: n.index, Members: slices.Clone(members)}
	n.recs[key] = r
	return names.Grant{Record: r}, nil
}

// write changes key's record under token.
func (n *fakeNames) write(op names.Op, key names.Key, token uint64, change func(*names.Record)) (names.Record, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r, ok := n.recs[key]
	switch {
	case !ok:
		return names.Record{}, refused(op, key, names.CodeNotFound, nil)
	case r.Token != token:
		return names.Record{}, refused(op, key, names.CodeStale, &r)
	}
	n.index++
	r.Index = n.index
	change(&r)
	n.recs[key] = r
	return r, nil
}

func (n *fakeNames) Confirm(_ context.Context, key names.Key, token uint64, owner string, members []string) (names.Record, error) {
	return n.write(names.OpConfirm, key, token, func(r *names.Record) {
		r.State, r.Owner, r.Members = names.StateHeld, owner, slices.Clone(members)
	})
}

func (n *fakeNames) Stamp(_ context.Context, key names.Key, token uint64) (names.Record, error) {
	return n.write(names.OpStamp, key, token, func(*names.Record) {})
}

func (n *fakeNames) Release(_ context.Context, key names.Key, token uint64, _ string) (names.Record, error) {
	r, err := n.write(names.OpRelease, key, token, func(*names.Record) {})
	if err == nil {
		n.mu.Lock()
		delete(n.recs, key)
		n.mu.Unlock()
	}
	return r, err
}

func (n *fakeNames) Lookup(_ context.Context, key names.Key, _ names.ReadMode) (names.Record, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r, ok := n.recs[key]
	if !ok {
		return names.Record{}, refused(names.OpLookup, key, names.CodeNotFound, nil)
	}
	return r, nil
}

// world is one platform's fakes; through builds the groups role of one
// agent on them.
type world struct {
	claims *fakeClaims
	names  *fakeNames
}

func newWorld(free ...int) *world {
	return &world{claims: newFakeClaims(free...), names: newFakeNames()}
}

func (w *world) through(node string, onStep func(group, node string)) *groups.Groups {
	return groups.New(groups.Deps{
		Node:            node,
		MaxGPUsPerClaim: 8,
		Claims:          w.claims,
		Names:           func() groups.Names { return w.names },
		View:            &fakeView{c: w.claims},
		Catalog:         fakeCatalog{},
		OnStep:          onStep,
	})
}

func one() []api.Item { return []api.Item{{Model: model, Count: 1}} }

func apiErr(t *testing.T, err error) *api.Error {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) {
		t.Fatalf("error %v (%T) is not an *api.Error", err, err)
	}
	return ae
}

// A create places every node, node i as claim NAME.node-i labelled with
// its group, and holds the group's name with the nodes as members.
func TestCreatePlacesEveryNode(t *testing.T) {
	w := newWorld(2, 2)
	g, err := w.through("a", nil).CreateGroup(context.Background(), "pool", api.GroupRequest{Nodes: 3, GPUs: one()})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"pool.node-0", "pool.node-1", "pool.node-2"}
	var got []string
	for _, c := range g.Claims {
		got = append(got, c.ID)
		if c.Labels["gpuherd.group"] != "pool" {
			t.Errorf("%s labelled %v, want its group", c.ID, c.Labels)
		}
	}
	if !slices.Equal(got, want) || !slices.Equal(w.claims.held(), want) {
		t.Fatalf("group's claims %v, held %v; want %v", got, w.claims.held(), want)
	}
	r, err := w.names.Lookup(context.Background(), names.Group("pool"), names.Linearizable)
	if err != nil || r.State != names.StateHeld || !slices.Equal(r.Members, want) || r.Caller != "a" {
		t.Fatalf("the group's name: %+v, %v; want held by a with the nodes as members", r, err)
	}
}

// A create overtaken, between two nodes, by a delete of its group through
// another agent stops there: it places no further node, releases the one
// it placed that the delete could not see, and says the group was
// deleted.
func TestCreateOvertakenByDeleteStops(t *testing.T) {
	w := newWorld(4, 4)
	ctx := context.Background()
	other := w.through("b", nil)
	var deleted []api.Claim
	var once sync.Once
	a := w.through("a", func(_, node string) {
		if node != "pool.node-1" {
			return
		}
		once.Do(func() {
			g, err := other.DeleteGroupClaims(ctx, "pool")
			if err != nil {
				t.Errorf("delete while the create runs: %v", err)
			}
			deleted = g.Claims
		})
	})
	_, err := a.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 3, GPUs: one()})
	if e := apiErr(t, err); e.Code != api.CodeNotFound || !strings.Contains(e.Message, "deleted while this operation ran") {
		t.Fatalf("the overtaken create answered %+v", e)
	}
	if len(deleted) != 1 || deleted[0].ID != "pool.node-0" {
		t.Errorf("the delete released %v, want pool.node-0", deleted)
	}
	if !slices.Equal(w.claims.placed, []string{"pool.node-0"}) {
		t.Errorf("claims placed %v; the create must stop after pool.node-0", w.claims.placed)
	}
	if held := w.claims.held(); len(held) != 0 {
		t.Errorf("the deleted group's nodes are held: %v", held)
	}
}

// A node that cannot be placed although the view said it fits fails the
// whole create: the nodes placed before it are released, the group's
// name is let go, and the answer is not available for the group.
func TestCreateAllOrNothingReleasesWhatItPlaced(t *testing.T) {
	w := newWorld(4, 4)
	w.claims.refuse["pool.node-2"] = true
	ctx := context.Background()
	_, err := w.through("a", nil).CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 3, GPUs: one()})
	e := apiErr(t, err)
	if e.Code != api.CodeNotAvailable || !strings.Contains(e.Message, "3 nodes of group pool") || !strings.Contains(e.Message, "nothing was kept") {
		t.Fatalf("create with node-2 refused: %+v", e)
	}
	if !slices.Equal(w.claims.placed, []string{"pool.node-0", "pool.node-1"}) {
		t.Errorf("claims placed %v, want node-0 and node-1 tried before the refusal", w.claims.placed)
	}
	if held := w.claims.held(); len(held) != 0 {
		t.Errorf("the failed group keeps %v", held)
	}
	if free := w.claims.free; free["a"] != 4 || free["b"] != 4 {
		t.Errorf("free GPUs after the failed create: %v, want all", free)
	}
	if _, err := w.names.Lookup(ctx, names.Group("pool"), names.Linearizable); !errors.Is(err, names.ErrNotFound) {
		t.Errorf("the failed group's name: %v, want free", err)
	}
}

// Without a name authority the record is a file of the creating server,
// dated by the clock; a second create of the name is a conflict, and a
// delete removes the file.
func TestGroupInARecordFile(t *testing.T) {
	c := newFakeClaims(2)
	view := &fakeView{c: c}
	start := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	gs := groups.New(groups.Deps{Node: "a", Dir: t.TempDir(), MaxGPUsPerClaim: 8, Claims: c, View: view,
		Catalog: fakeCatalog{}, Clock: clock.NewManual(start)})
	view.keepers = []groups.RecordKeeper{gs}
	ctx := context.Background()
	if _, err := gs.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 2, GPUs: one()}); err != nil {
		t.Fatal(err)
	}
	rec, err := gs.LookupGroup(ctx, "pool")
	if err != nil || !rec.CreatedAt.Equal(start) || rec.Coordinator != "a" || rec.Nodes != 2 || !rec.WithGPUs {
		t.Fatalf("record file: %+v, %v", rec, err)
	}
	_, err = gs.CreateGroup(ctx, "pool", api.GroupRequest{Nodes: 1, GPUs: one()})
	if e := apiErr(t, err); e.Code != api.CodeConflict {
		t.Fatalf("second create: %+v, want conflict", e)
	}
	if g, err := gs.DeleteGroupClaims(ctx, "pool"); err != nil || len(g.Claims) != 2 {
		t.Fatalf("delete: %+v, %v", g, err)
	}
	if _, err := gs.LookupGroup(ctx, "pool"); apiErr(t, err).Code != api.CodeNotFound {
		t.Fatalf("record after delete: %v", err)
	}
	if held := c.held(); len(held) != 0 {
		t.Fatalf("claims after delete: %v", held)
	}
}
