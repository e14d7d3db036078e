package agent

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/claimtest"
	"github.com/gpuherd/gpuherd/agent/home"
	"github.com/gpuherd/gpuherd/vfio"
)

// abortCutter is the in-memory peer network with one fault more: while on,
// every abort of a reservation (DELETE /peer/reservations/ID) from one node
// to another vanishes, as to an owner cut off just after it answered the
// reserve.
type abortCutter struct {
	*claimtest.Network
	from, to string
	on       atomic.Bool
	cut      atomic.Int32 // aborts that vanished
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (n *abortCutter) Transport(from string) http.RoundTripper {
	rt := n.Network.Transport(from)
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if n.on.Load() && from == n.from && strings.HasPrefix(r.URL.Host, n.to+".") &&
			r.Method == http.MethodDelete && strings.Contains(r.URL.Path, "/reservations/") {
			n.cut.Add(1)
			<-r.Context().Done()
			return nil, r.Context().Err()
		}
		return rt.RoundTrip(r)
	})
}

// Issue 11, point 4: a claim answered conflict left a reservation behind
// on another server; after the ID was released, the next claim of the ID
// got a false conflict naming that server. Here: vm-x is claimed on a (an
// A100); a second claim of vm-x for an L40S through b reserves on c (the
// only L40S server) while b asks the ID's home, learns the ID is held, and
// answers conflict, but its abort never reaches c. vm-x is released; the
// next claim of vm-x for two L40S must be placed on c, not refused.
func TestOrphanReservationMakesNoFalseConflict(t *testing.T) {
	tc := newTestCluster(t)
	// The directory path: with the name registry the second request is
	// refused at acquire and reserves nothing, so no orphan can arise.
	tc.names = nil
	tc.adjust = func(c *Config) { c.DirectorySettle = 0 } // the homes vouch at once
	cutter := &abortCutter{Network: tc.peers, from: "b", to: "c"}
	tc.opts = []Option{WithPeerNetwork(cutter)}
	a := tc.start("a", "a100-pcie-4")
	b := tc.start("b", "rtx6000pro-2")
	c := tc.start("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool {
		return freeOf(x, "NVIDIA L40S") == 4 && freeOf(x, a100) == 4 && len(x.targets()) == 3
	})
	ctx := context.Background()
	first, err := a.Claim(ctx, "vm-x", api.ClaimRequest{GPUs: []api.Item{{Model: a100, Count: 1}}})
	if err != nil || first.Node != "a" {
		t.Fatalf("first claim: %+v, %v", first, err)
	}

	cutter.on.Store(true)
	_, err = b.Claim(ctx, "vm-x", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}})
	if !api.IsCode(err, api.CodeConflict) {
		t.Fatalf("second claim of vm-x with another request: %v, want conflict", err)
	}
	orphan, lerr := c.ledger.Get("vm-x")
	if cutter.cut.Load() == 0 || lerr != nil || orphan.Coordinator != "b" {
		t.Fatalf("no orphan to test with: %d aborts cut, c holds %+v (%v)", cutter.cut.Load(), orphan, lerr)
	}
	// c stays cut off from b's aborts: only the rules of orphans.go help.

	if _, err := a.Release(ctx, "vm-x"); err != nil {
		t.Fatalf("release of vm-x: %v", err)
	}
	// The owner tells the ID's home of the release in the background: a
	// claim that reaches the home first finds the ID held on a, which no
	// longer has it, and takes the slow way, where no home vouches and a
	// conflicting reservation stands. That is the window of a release,
	// not the orphan's; the rule tested here is the one after it.
	homeAgent := tc.agents[home.Of("vm-x", a.targets(), targetName).Name()]
	waitFor(t, "the home to learn the release of vm-x", 5*time.Second, func() bool {
		ans, err := homeAgent.LookupDirectory(ctx, "vm-x")
		return err == nil && ans.State == api.DirAbsent
	})
	next, err := a.Claim(ctx, "vm-x", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}, AnyNode: true})
	if err != nil {
		t.Fatalf("next claim of vm-x after its release: %v (the orphan on c made it a conflict)", err)
	}
	if next.Node != "c" || next.State != api.StateClaimed || len(next.GPUs) != 2 {
		t.Fatalf("next claim = %+v, want 2 L40S claimed on c", next)
	}
	// The orphan's GPU, if not taken again, went back to the idle driver.
	for _, addr := range orphan.GPUs {
		if !slices.Contains(gpuAddrs(next), addr) {
			if d := driverOf(t, c.sim.Kernel, addr); d != vfio.DriverNVIDIA {
				t.Errorf("the orphan's GPU %s is on %q, want the idle driver", addr, d)
			}
		}
	}
}

// The coordinator keeps sending an abort that did not arrive: once the
// owner answers again, the orphan is gone within seconds, not a lease
// (30 s) later.
func TestLostAbortIsSentAgain(t *testing.T) {
	tc := newTestCluster(t)
	tc.names = nil // the directory path, as above
	tc.adjust = func(c *Config) { c.DirectorySettle = 0 }
	cutter := &abortCutter{Network: tc.peers, from: "b", to: "c"}
	tc.opts = []Option{WithPeerNetwork(cutter)}
	a := tc.start("a", "a100-pcie-4")
	b := tc.start("b", "rtx6000pro-2")
	c := tc.start("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool {
		return freeOf(x, "NVIDIA L40S") == 4 && freeOf(x, a100) == 4 && len(x.targets()) == 3
	})
	ctx := context.Background()
	if _, err := a.Claim(ctx, "vm-x", api.ClaimRequest{GPUs: []api.Item{{Model: a100, Count: 1}}}); err != nil {
		t.Fatal(err)
	}
	cutter.on.Store(true)
	if _, err := b.Claim(ctx, "vm-x", api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 1}}}); !api.IsCode(err, api.CodeConflict) {
		t.Fatalf("second claim of vm-x with another request: %v, want conflict", err)
	}
	if _, err := c.ledger.Get("vm-x"); err != nil || cutter.cut.Load() == 0 {
		t.Fatalf("no orphan to test with: %d aborts cut, %v", cutter.cut.Load(), err)
	}
	cutter.on.Store(false) // c answers b again
	took := waitFor(t, "the orphan on c dropped", 10*time.Second, func() bool {
		_, err := c.ledger.Get("vm-x")
		return err != nil
	})
	t.Logf("orphan dropped %v after the owner answered again", took)
	if n := localFree(c, "NVIDIA L40S"); n != 4 {
		t.Errorf("c has %d L40S free, want 4", n)
	}
}

// A release that finds only a reservation (an orphan, or its client's own
// unfinished claim) drops it and answers not found: never "state":
// "reserved", which tells the client a claim existed (issue 11, point 4).
func TestReleaseOfAReservationAnswersNotFound(t *testing.T) {
	dir := t.TempDir()
	m := machine(t, "a100-pcie-4", dir)
	a := startAgent(t, testConfig(t, dir), m, nil)
	defer a.Close()
	ctx := context.Background()
	r, err := a.Reserve(ctx, "vm-o", api.ReserveRequest{Items: []api.Item{{Model: a100, Count: 1}}, Coordinator: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := a.Release(ctx, "vm-o")
	if !api.IsCode(err, api.CodeNotFound) || !strings.Contains(err.Error(), "never claimed") {
		t.Fatalf("release of a reservation = %+v, %v; want not_found saying it was never claimed", c, err)
	}
	if _, err := a.ledger.Get("vm-o"); err == nil {
		t.Error("the reservation is still in the ledger")
	}
	wantHealthyFree(t, a, m, r.GPUs[0].PCIAddress)
	// Its own coordinator's abort still answers with what it dropped.
	if _, err := a.Reserve(ctx, "vm-p", api.ReserveRequest{Items: []api.Item{{Model: a100, Count: 1}}, Coordinator: "c1"}); err != nil {
		t.Fatal(err)
	}
	if c, err := a.AbortReservation(ctx, "vm-p"); err != nil || c.State != api.StateReserved {
		t.Errorf("abort of a reservation = %+v, %v; want the dropped reservation", c, err)
	}
}

// An owner asked to reserve under a newer name token replaces the
// reservation an older placement of the ID left, and returns the GPUs it no
// longer needs to the idle driver; an older token is refused.
func TestOwnerReplacesAReservationOfAnOlderToken(t *testing.T) {
	dir := t.TempDir()
	m := machine(t, "a100-pcie-4", dir)
	a := startAgent(t, testConfig(t, dir), m, nil)
	defer a.Close()
	ctx := context.Background()
	old, err := a.Reserve(ctx, "vm-x", api.ReserveRequest{Items: []api.Item{{Model: a100, Count: 1}}, Coordinator: "b", Token: 5})
	if err != nil {
		t.Fatal(err)
	}
	next, err := a.Reserve(ctx, "vm-x", api.ReserveRequest{Items: []api.Item{{Model: a100, Count: 3}}, Coordinator: "c", Token: 7})
	if err != nil {
		t.Fatalf("reserve under a newer token over an orphan: %v", err)
	}
	if len(next.GPUs) != 3 {
		t.Fatalf("reservation = %+v, want 3 GPUs", next)
	}
	for _, addr := range a.host.Addresses() {
		want := vfio.DriverNVIDIA
		if slices.Contains(gpuAddrs(next), addr) {
			want = vfio.DriverVFIO
		}
		if d := driverOf(t, m.Kernel, addr); d != want {
			t.Errorf("GPU %s on %q, want %s (old reservation %v, new %v)", addr, d, want, gpuAddrs(old), gpuAddrs(next))
		}
	}
	if _, err := a.Reserve(ctx, "vm-x", api.ReserveRequest{Items: []api.Item{{Model: a100, Count: 1}}, Coordinator: "b", Token: 5}); !api.IsCode(err, api.CodeConflict) {
		t.Errorf("a late reserve under the older token: %v, want conflict", err)
	}
	if _, err := a.Commit(ctx, "vm-x"); err != nil {
		t.Fatal(err)
	}
}
