package ledger

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestLedgerProperties drives the ledger with random sequences of every
// operation — reserve (fresh and retried), commit, extend, release, expire,
// drain, undrain, time passing, health changes, GPUs vanishing and coming
// back, and close-and-reopen — against a plain in-memory model, and checks
// the protocol's invariants after every step:
//
//   - a GPU is in at most one live claim;
//   - a claim's GPUs are of the requested models and counts, and were in the
//     inventory, healthy, undrained and unheld when it was reserved;
//   - the ledger holds exactly the claims the model expects, also after a
//     reopen (a committed claim survives; a reservation does not);
//   - an operation writes the file (one transaction) exactly when it changes
//     a committed claim or a drain: never for a reservation, and a reopen
//     starts from the revision of the last write;
//   - an expired reservation is never committed or extended;
//   - a reservation succeeds exactly when every item fits, and a refusal
//     lists exactly the items that do not;
//   - an idempotent retry returns the same claim, same GPUs.
func TestLedgerProperties(t *testing.T) {
	base := t.TempDir()
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		run++
		m := &machine{
			path: filepath.Join(base, fmt.Sprintf("ledger-%d.db", run)),
			now:  t0,
			inv:  map[string]GPU{},
			// vanished GPUs, kept so that they can come back
			gone:    map[string]GPU{},
			claims:  map[string]claimModel{},
			drains:  map[string]bool{},
			lastReq: map[string]Request{},
			// A small journal checkpoints every few writes.
			journal: rapid.SampledFrom([]int64{1 << 10, 4 << 10, journalSize}).Draw(rt, "journal"),
		}
		for _, g := range server() {
			m.inv[g.Address] = g
		}
		m.open(rt)
		defer func() { _ = m.l.Close() }()

		rt.Repeat(map[string]func(*rapid.T){
			"":         m.check,
			"reserve":  m.reserve,
			"commit":   m.commit,
			"extend":   m.extend,
			"release":  m.release,
			"expire":   m.expire,
			"drain":    m.drain,
			"undrain":  m.undrain,
			"advance":  m.advance,
			"health":   m.health,
			"vanish":   m.vanish,
			"reappear": m.reappear,
			"reopen":   m.reopen,
			"crash":    m.crash,
		})
	})
}

// claimModel is what the model knows of a claim: the claim as the ledger
// returned it, and the request it was made for.
type claimModel struct {
	claim Claim
	req   Request
}

type machine struct {
	path    string
	l       *Ledger
	now     time.Time
	inv     map[string]GPU
	gone    map[string]GPU
	claims  map[string]claimModel // stored, live or not
	drains  map[string]bool
	lastReq map[string]Request // per ID, to retry
	rev     uint64

	// The file: the last transaction committed to it, whether the
	// operation under test must write it, and the revision it holds.
	txid       int
	wantWrite  bool
	durableRev uint64
	journal    int64 // the journal's preallocated size
}

var (
	propIDs    = []string{"vm-a", "vm-b", "vm-c", "vm-d", "vm-e", "vm-f"}
	propModels = []string{h100, l40s, "A100 80GB"}
)

func (m *machine) open(rt *rapid.T) {
	l, err := Open(m.path, withJournalSize(m.journal))
	if err != nil {
		rt.Fatalf("Open: %v", err)
	}
	m.l = l
	// The file holds the revision of its last write, and Open writes
	// nothing to a file this gpuherd wrote.
	if r := l.Revision(); r != m.durableRev {
		rt.Fatalf("revision %d after Open, want %d, the revision of the last write", r, m.durableRev)
	}
	id, err := fileTxID(l)
	if err != nil {
		rt.Fatal(err)
	}
	if m.txid != 0 && id != m.txid {
		rt.Fatalf("Open wrote the file: transaction %d → %d", m.txid, id)
	}
	m.txid = id
	m.setInventory(rt)
}

func (m *machine) setInventory(rt *rapid.T) {
	gpus := slices.Collect(maps.Values(m.inv))
	slices.SortFunc(gpus, func(a, b GPU) int { return cmp.Compare(a.Address, b.Address) })
	if err := m.l.SetInventory(gpus); err != nil {
		rt.Fatalf("SetInventory: %v", err)
	}
}

func (m *machine) live(id string) bool {
	c, ok := m.claims[id]
	return ok && c.claim.Live(m.now)
}

// free is the model's answer to "which GPUs could be reserved now".
func (m *machine) free() map[string][]string {
	busy := map[string]bool{}
	for _, c := range m.claims {
		if c.claim.Live(m.now) {
			for _, g := range c.claim.GPUs {
				busy[g] = true
			}
		}
	}
	out := map[string][]string{}
	for addr, g := range m.inv {
		if g.Healthy && !m.drains[addr] && !busy[addr] {
			out[g.Model] = append(out[g.Model], addr)
		}
	}
	return out
}

func drawRequest(rt *rapid.T) Request {
	models := rapid.SliceOfNDistinct(rapid.SampledFrom(propModels), 1, 2, func(s string) string { return s }).Draw(rt, "models")
	var r Request
	for _, mdl := range models {
		r.Items = append(r.Items, Item{Model: mdl, Count: rapid.IntRange(1, 5).Draw(rt, "count")})
	}
	if rapid.Bool().Draw(rt, "labelled") {
		r.Labels = map[string]string{"team": rapid.SampledFrom([]string{"ml", "web"}).Draw(rt, "team")}
	}
	return r
}

func (m *machine) reserve(rt *rapid.T) {
	id := rapid.SampledFrom(propIDs).Draw(rt, "id")
	r, seen := m.lastReq[id]
	if !seen || rapid.Bool().Draw(rt, "fresh request") {
		r = drawRequest(rt)
	}
	m.lastReq[id] = r
	leaseFor := time.Duration(rapid.IntRange(1, 120).Draw(rt, "lease s")) * time.Second

	got, err := m.l.Reserve(id, r, "coord", m.now, leaseFor)

	if m.live(id) {
		old := m.claims[id]
		if sameRequest(old.claim, r) {
			if err != nil || !reflect.DeepEqual(got, old.claim) {
				rt.Fatalf("retry of %s = %+v, %v; want the same claim %+v", id, got, err, old.claim)
			}
			return
		}
		if !errors.Is(err, ErrConflict) {
			rt.Fatalf("Reserve(%s) with another request = %+v, %v; want ErrConflict", id, got, err)
		}
		return
	}

	free := m.free()
	var missing []Item
	for _, it := range r.Items {
		if len(free[it.Model]) < it.Count {
			missing = append(missing, it)
		}
	}
	if len(missing) > 0 {
		var na *NotAvailableError
		if !errors.As(err, &na) || !slices.Equal(na.Missing, missing) {
			rt.Fatalf("Reserve(%s %v) = %v; want missing %v (free %v)", id, r.Items, err, missing, free)
		}
		return
	}
	if err != nil {
		rt.Fatalf("Reserve(%s %v) with enough free (%v): %v", id, r.Items, free, err)
	}

	// Never hand out a GPU that is not free now: unknown, sick, drained or
	// held. And give each item exactly its count of its model.
	perModel := map[string]int{}
	for _, g := range got.GPUs {
		if !slices.Contains(free[m.inv[g].Model], g) {
			rt.Fatalf("Reserve(%s) handed out %s, which is not free (%+v, drained %v)", id, g, m.inv[g], m.drains[g])
		}
		perModel[m.inv[g].Model]++
	}
	for _, it := range r.Items {
		if perModel[it.Model] != it.Count {
			rt.Fatalf("Reserve(%s) gave %d × %s, asked %d: %v", id, perModel[it.Model], it.Model, it.Count, got.GPUs)
		}
	}
	if len(got.GPUs) != len(slices.Compact(slices.Clone(got.GPUs))) || !slices.IsSorted(got.GPUs) {
		rt.Fatalf("GPUs not sorted and distinct: %v", got.GPUs)
	}
	if got.State != StateReserved || !got.ExpiresAt.Equal(m.now.Add(leaseFor)) || got.ID != id {
		rt.Fatalf("Reserve(%s) = %+v", id, got)
	}
	m.claims[id] = claimModel{claim: got, req: r}
}

func (m *machine) commit(rt *rapid.T) {
	id := rapid.SampledFrom(propIDs).Draw(rt, "id")
	got, err := m.l.Commit(id, m.now)
	c, ok := m.claims[id]
	switch {
	case !ok:
		if !errors.Is(err, ErrNotFound) {
			rt.Fatalf("Commit(unknown %s) = %+v, %v", id, got, err)
		}
	case !c.claim.Live(m.now):
		if !errors.Is(err, ErrLeaseExpired) {
			rt.Fatalf("Commit(%s) after its lease (%v, now %v) = %+v, %v; want ErrLeaseExpired", id, c.claim.ExpiresAt, m.now, got, err)
		}
		delete(m.claims, id)
	case c.claim.State == StateCommitted:
		if err != nil || !reflect.DeepEqual(got, c.claim) {
			rt.Fatalf("Commit(committed %s) = %+v, %v; want it unchanged", id, got, err)
		}
	default:
		want := c.claim
		want.State, want.ExpiresAt, want.CommittedAt = StateCommitted, time.Time{}, m.now
		if err != nil || !reflect.DeepEqual(got, want) {
			rt.Fatalf("Commit(%s) = %+v, %v; want %+v", id, got, err, want)
		}
		c.claim = got
		m.claims[id] = c
		m.wantWrite = true
	}
}

func (m *machine) extend(rt *rapid.T) {
	id := rapid.SampledFrom(propIDs).Draw(rt, "id")
	leaseFor := time.Duration(rapid.IntRange(1, 120).Draw(rt, "lease s")) * time.Second
	got, err := m.l.Extend(id, m.now, leaseFor)
	c, ok := m.claims[id]
	switch {
	case !ok:
		if !errors.Is(err, ErrNotFound) {
			rt.Fatalf("Extend(unknown %s) = %v", id, err)
		}
	case !c.claim.Live(m.now):
		if !errors.Is(err, ErrLeaseExpired) {
			rt.Fatalf("Extend(%s) after its lease = %+v, %v; want ErrLeaseExpired", id, got, err)
		}
		delete(m.claims, id)
	default:
		want := c.claim
		if want.State == StateReserved && m.now.Add(leaseFor).After(want.ExpiresAt) {
			want.ExpiresAt = m.now.Add(leaseFor)
		}
		if err != nil || !reflect.DeepEqual(got, want) {
			rt.Fatalf("Extend(%s) = %+v, %v; want %+v", id, got, err, want)
		}
		c.claim = got
		m.claims[id] = c
	}
}

func (m *machine) release(rt *rapid.T) {
	id := rapid.SampledFrom(propIDs).Draw(rt, "id")
	got, err := m.l.Release(id, m.now)
	c, ok := m.claims[id]
	switch {
	case !ok || !c.claim.Live(m.now):
		if !errors.Is(err, ErrNotFound) {
			rt.Fatalf("Release(%s, not live) = %+v, %v; want ErrNotFound", id, got, err)
		}
	default:
		if err != nil || !reflect.DeepEqual(got, c.claim) {
			rt.Fatalf("Release(%s) = %+v, %v; want %+v", id, got, err, c.claim)
		}
		m.wantWrite = c.claim.State == StateCommitted
	}
	delete(m.claims, id)
}

func (m *machine) expire(rt *rapid.T) {
	got, err := m.l.Expire(m.now)
	if err != nil {
		rt.Fatalf("Expire: %v", err)
	}
	var want []Claim
	for _, id := range slices.Sorted(maps.Keys(m.claims)) {
		if c := m.claims[id]; !c.claim.Live(m.now) {
			want = append(want, c.claim)
			delete(m.claims, id)
		}
	}
	if !reflect.DeepEqual(got, want) {
		rt.Fatalf("Expire = %+v, want %+v", got, want)
	}
}

// drawAddress picks a GPU of the server, present or gone, or an address the
// server never had.
func (m *machine) drawAddress(rt *rapid.T) string {
	all := append(slices.Collect(maps.Keys(m.inv)), slices.Collect(maps.Keys(m.gone))...)
	all = append(all, "0000:ee:00.0")
	slices.Sort(all)
	return rapid.SampledFrom(all).Draw(rt, "address")
}

func (m *machine) drain(rt *rapid.T) {
	addr := m.drawAddress(rt)
	err := m.l.Drain(addr, "property test", m.now)
	if _, ok := m.inv[addr]; !ok {
		if !errors.Is(err, ErrUnknownGPU) {
			rt.Fatalf("Drain(%s, not in inventory) = %v; want ErrUnknownGPU", addr, err)
		}
		return
	}
	if err != nil {
		rt.Fatalf("Drain(%s): %v", addr, err)
	}
	m.wantWrite = !m.drains[addr] // a redrain with the same reason is a no-op
	m.drains[addr] = true
}

func (m *machine) undrain(rt *rapid.T) {
	addr := m.drawAddress(rt)
	err := m.l.Undrain(addr)
	_, present := m.inv[addr]
	if !present && !m.drains[addr] {
		if !errors.Is(err, ErrUnknownGPU) {
			rt.Fatalf("Undrain(%s, unknown) = %v; want ErrUnknownGPU", addr, err)
		}
		return
	}
	if err != nil {
		rt.Fatalf("Undrain(%s): %v", addr, err)
	}
	m.wantWrite = m.drains[addr]
	delete(m.drains, addr)
}

func (m *machine) advance(rt *rapid.T) {
	// Steps around the usual leases, sometimes landing exactly on one.
	m.now = m.now.Add(time.Duration(rapid.IntRange(0, 90).Draw(rt, "seconds")) * time.Second)
}

func (m *machine) health(rt *rapid.T) {
	if len(m.inv) == 0 {
		rt.Skip("no GPU left")
	}
	addr := rapid.SampledFrom(slices.Sorted(maps.Keys(m.inv))).Draw(rt, "address")
	g := m.inv[addr]
	g.Healthy = !g.Healthy
	m.inv[addr] = g
	m.setInventory(rt)
}

func (m *machine) vanish(rt *rapid.T) {
	if len(m.inv) == 0 {
		rt.Skip("no GPU left")
	}
	addr := rapid.SampledFrom(slices.Sorted(maps.Keys(m.inv))).Draw(rt, "address")
	m.gone[addr] = m.inv[addr]
	delete(m.inv, addr)
	m.setInventory(rt)
}

func (m *machine) reappear(rt *rapid.T) {
	if len(m.gone) == 0 {
		rt.Skip("no GPU gone")
	}
	addr := rapid.SampledFrom(slices.Sorted(maps.Keys(m.gone))).Draw(rt, "address")
	m.inv[addr] = m.gone[addr]
	delete(m.gone, addr)
	m.setInventory(rt)
}

// reopen is a restart of the agent: the file is all that survives, and the
// inventory is found again. Reservations live in memory only: gone. The
// revision starts again from the file's, which may be below the last one
// seen.
func (m *machine) reopen(rt *rapid.T) { m.restart(rt, m.l.Close) }

// crash is kill -9: the ledger lets go of its files without storing its
// journal in the file; every acknowledged write must come back.
func (m *machine) crash(rt *rapid.T) { m.restart(rt, m.l.Abandon) }

func (m *machine) restart(rt *rapid.T, stop func() error) {
	if err := stop(); err != nil {
		rt.Fatalf("stop: %v", err)
	}
	for id, c := range m.claims {
		if c.claim.State == StateReserved {
			delete(m.claims, id)
		}
	}
	m.rev = m.durableRev
	m.open(rt)
}

func (m *machine) check(rt *rapid.T) {
	if err := m.verify(); err != nil {
		rt.Fatal(err)
	}
}

// verify checks the invariants; it returns an error instead of failing so
// that a test can show it does catch a broken ledger.
func (m *machine) verify() error {
	// The ledger holds exactly the model's claims (live or awaiting Expire).
	want := make([]Claim, 0, len(m.claims))
	for _, id := range slices.Sorted(maps.Keys(m.claims)) {
		want = append(want, m.claims[id].claim)
	}
	got := m.l.List()
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("ledger holds %+v\nmodel expects %+v", got, want)
	}

	// A GPU is in at most one live claim; a claim holds what it asked for.
	holder := map[string]string{}
	for _, c := range got {
		if !c.Live(m.now) {
			continue
		}
		for _, g := range c.GPUs {
			if other, dup := holder[g]; dup {
				return fmt.Errorf("GPU %s is in live claims %s and %s", g, other, c.ID)
			}
			holder[g] = c.ID
		}
		total := 0
		for _, it := range c.Items {
			total += it.Count
		}
		if total != len(c.GPUs) {
			return fmt.Errorf("claim %s asks for %d GPUs, holds %v", c.ID, total, c.GPUs)
		}
	}

	// Capacity as published matches the model.
	wantFree := map[string]int{}
	for _, g := range m.inv {
		wantFree[g.Model] += 0
	}
	for mdl, addrs := range m.free() {
		wantFree[mdl] = len(addrs)
	}
	if gotFree := m.l.Free(m.now); !maps.Equal(gotFree, wantFree) {
		return fmt.Errorf("Free = %v, model %v", gotFree, wantFree)
	}
	for _, s := range m.l.GPUStates(m.now) {
		if (holder[s.GPU.Address] != "") != (s.Status == GPUClaimed || s.Status == GPUReserved) || holder[s.GPU.Address] != s.ClaimID {
			return fmt.Errorf("GPUState %+v disagrees with the live claims (holder %q)", s, holder[s.GPU.Address])
		}
	}

	// The revision never goes back while the ledger is open (reopen resets
	// m.rev to the revision of the last write).
	if r := m.l.Revision(); r < m.rev {
		return fmt.Errorf("revision went back from %d to %d", m.rev, r)
	}
	m.rev = m.l.Revision()

	// The file was written, in one transaction, exactly when the model
	// says it must be, and then holds the current revision.
	id, err := fileTxID(m.l)
	if err != nil {
		return err
	}
	switch wrote := id != m.txid; {
	case wrote != m.wantWrite:
		return fmt.Errorf("file written: %v (transaction %d → %d), want %v", wrote, m.txid, id, m.wantWrite)
	case wrote && id != m.txid+1:
		return fmt.Errorf("%d write transactions for one operation, want 1", id-m.txid)
	case wrote:
		m.durableRev = m.rev
	}
	m.txid, m.wantWrite = id, false
	// Totals counts what GPUStates says, model by model.
	if got, want := m.l.Totals(m.now), totalsOf(m.l.GPUStates(m.now)); !reflect.DeepEqual(got, want) {
		return fmt.Errorf("totals %+v, the GPUs' states count %+v", got, want)
	}
	return nil
}

// TestPropertiesCatchABrokenLedger shows that the invariant check can fail:
// a model that expects a claim the ledger lacks, or a GPU in two live
// claims, must be reported.
func TestPropertiesCatchABrokenLedger(t *testing.T) {
	l := newLedger(t)
	mustReserve(t, l, "vm-a", req(Item{Model: h100, Count: 1}), t0)
	c := mustCommit(t, l, "vm-a", t0)
	m := &machine{l: l, now: t0, inv: map[string]GPU{}, claims: map[string]claimModel{"vm-a": {claim: c}}}
	for _, g := range server() {
		m.inv[g.Address] = g
	}
	var err error
	if m.txid, err = fileTxID(l); err != nil {
		t.Fatal(err)
	}
	if err := m.verify(); err != nil {
		t.Fatalf("verify on a sound ledger: %v", err)
	}
	lost := c
	lost.ID = "vm-b"
	m.claims["vm-b"] = claimModel{claim: lost}
	if err := m.verify(); err == nil {
		t.Fatal("verify accepted a ledger that lost a claim")
	}
	delete(m.claims, "vm-b")
	if err := m.verify(); err != nil {
		t.Fatalf("verify on a sound ledger: %v", err)
	}
	// A write of the file that no operation of the model asked for.
	if err := l.PutFacts("0000:18:00.0", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := m.verify(); err == nil {
		t.Fatal("verify accepted a write of the file that the model did not expect")
	}
	m.drains = map[string]bool{c.GPUs[0]: false}
	m.inv["0000:2a:00.0"] = GPU{Address: "0000:2a:00.0", Model: h100, Healthy: false}
	if err := m.verify(); err == nil {
		t.Fatal("verify accepted capacity that disagrees with the model")
	}
}

// totalsOf counts states by model as Totals must: the GPUs not missing,
// healthy or unusable, and the free ones.
func totalsOf(states []GPUState) map[string]ModelTotals {
	out := map[string]ModelTotals{}
	for _, s := range states {
		if s.Missing {
			continue
		}
		t := out[s.GPU.Model]
		t.Total++
		switch {
		case s.GPU.Healthy && s.GPU.Unusable:
			t.Unusable++
		case s.GPU.Healthy:
			t.Healthy++
		}
		if s.Status == GPUFree {
			t.Free++
		}
		out[s.GPU.Model] = t
	}
	return out
}
