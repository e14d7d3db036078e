package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/api/peerwire"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/pki"
	"github.com/gpuherd/gpuherd/vfio"
)

// The claim protocol under faults: racing coordinators, a coordinator that
// dies between reserve and commit, a slow owner, a stale gossip view, a lost
// commit answer. Every test ends with the invariants (checker_test.go) and,
// where clients make calls, the porcupine check of what they saw.

// faultLease is the reservation lease of the fault tests: short, so that
// an abandoned reservation expires within the test, yet long enough that a
// reserve or commit starved of CPU still finishes within it. At 2 s, runs
// of go test -race on a loaded 2-core machine failed now and then with a
// lease that expired inside a call ("reservation lease expired", or the
// reservation already swept: "not found on this server").
const faultLease = 4 * time.Second

// startShortLease is tc.start with the fault tests' short lease (and so
// a sweep every half second).
func (tc *testCluster) startShortLease(name, profile string) *Agent {
	tc.t.Helper()
	return tc.startWith(name, profile, func(c *Config) { c.ReservationLease = Duration(faultLease) })
}

// waitFor polls cond under a deadline: for what gossip or a lease makes
// true eventually, with no event to wait on.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// localFree is how many GPUs of model a's own ledger has free.
func localFree(a *Agent, model string) int { return a.ledger.Free(a.clk.Now())[model] }

// noneOnVFIO reports whether no GPU of a outside a live claim is still on
// vfio-pci: a release or expiry has finished returning it.
func noneOnVFIO(t *testing.T, a *Agent) bool {
	s := snapshot(t, a)
	for _, g := range s.gpus {
		if g.ClaimID == "" && s.drivers[g.GPU.Address] == vfio.DriverVFIO {
			return false
		}
	}
	return true
}

// viewOf is how many GPUs of model coord believes node has free.
func viewOf(coord *Agent, node, model string) int {
	for _, t := range coord.targets() {
		if t.Name() == node {
			return t.Caps()[model].Free
		}
	}
	return -1
}

// fault is what the proxy does to one request.
type fault int

const (
	passThrough      fault = iota
	delayThenForward       // hold the request for delay, then deliver it even if the caller gave up
	blackhole              // never answer, never deliver
	dropReply              // deliver, then lose the answer
	latency                // hold the request for delay, then forward it and answer: a slower network
)

// faultProxy stands between one coordinator and one owner's peer API. It
// terminates mutual TLS with the owner's certificate and calls the owner with
// the coordinator's, so it sees each request and can delay, swallow or
// deliver it and lose the answer: the network faults a coordinator meets.
type faultProxy struct {
	t       testing.TB
	target  string
	backend *http.Client
	srv     *http.Server
	addr    string
	delay   time.Duration
	rule    func(r *http.Request) fault
	stop    chan struct{}
	late    sync.WaitGroup // delayed deliveries still on their way
	counts  sync.Map       // fault → *atomic.Int64
}

func newFaultProxy(t testing.TB, tc *testCluster, coord, owner *Agent, delay time.Duration, rule func(*http.Request) fault) *faultProxy {
	t.Helper()
	caFile := filepath.Join(tc.dir, "ca", "ca.crt")
	certs := filepath.Join(tc.dir, "certs")
	files := func(a *Agent) pki.Files {
		n := a.cfg.NodeName
		return pki.Files{CA: caFile, Cert: filepath.Join(certs, n+".crt"), Key: filepath.Join(certs, n+".key")}
	}
	srvTLS, err := pki.ServerConfig(files(owner))
	if err != nil {
		t.Fatal(err)
	}
	cliTLS, err := pki.ClientConfigFor(files(coord), owner.cfg.NodeName)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	backend := api.NewPeerTransport(cliTLS) // the peer wire, as between agents
	if tc.peers != nil {
		backend = tc.peers.Transport(coord.cfg.NodeName) // the owner is reached in memory
	}
	p := &faultProxy{t: t, target: "https://" + owner.cluster.peerAddr, delay: delay, rule: rule, stop: make(chan struct{}),
		backend: &http.Client{Transport: backend}, addr: ln.Addr().String()}
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve), TLSConfig: srvTLS, ReadHeaderTimeout: 5 * time.Second}
	// The coordinator reaches it over the peer wire, as it would the owner.
	peerwire.Install(p.srv, peerwire.Limits{MaxBodyBytes: api.MaxBodyBytes})
	go func() { _ = p.srv.ServeTLS(ln, "", "") }()
	t.Cleanup(p.close)

	// The coordinator's client for the owner now dials the proxy; it keeps
	// checking that the far end is the owner (the proxy has its certificate).
	// Its timeout, reserveTimeout (20 s) in production, is one second here:
	// coordinator.go's timeouts are constants a test cannot shorten.
	key := peerKey{owner.cfg.NodeName, owner.cluster.peerAddr}
	coord.cluster.mu.Lock()
	if old, ok := coord.cluster.clients[key]; ok {
		old.Close()
	}
	pcTLS, err := pki.ClientConfigFor(files(coord), owner.cfg.NodeName)
	if err != nil {
		t.Fatal(err)
	}
	coord.cluster.clients[key] = api.NewPeerClient(p.addr, pcTLS, time.Second)
	coord.cluster.mu.Unlock()
	return p
}

func (p *faultProxy) close() {
	select {
	case <-p.stop:
		return
	default:
	}
	close(p.stop)
	p.late.Wait()
	_ = p.srv.Close()
	p.backend.CloseIdleConnections()
}

func (p *faultProxy) count(f fault) int64 {
	v, _ := p.counts.LoadOrStore(f, new(atomic.Int64))
	return v.(*atomic.Int64).Load()
}

func (p *faultProxy) serve(w http.ResponseWriter, r *http.Request) {
	f := p.rule(r)
	v, _ := p.counts.LoadOrStore(f, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	switch f {
	case blackhole:
		select {
		case <-r.Context().Done():
		case <-p.stop:
		}
		panic(http.ErrAbortHandler)
	case delayThenForward:
		// The caller gives up meanwhile; the request still arrives, late,
		// as a delayed packet would.
		p.late.Add(1)
		go func() {
			defer p.late.Done()
			select {
			case <-time.After(p.delay):
			case <-p.stop:
				return
			}
			resp, err := p.forward(context.Background(), r, body)
			if err == nil {
				resp.Body.Close()
			}
		}()
		<-r.Context().Done()
		panic(http.ErrAbortHandler)
	case latency:
		select {
		case <-time.After(p.delay):
		case <-p.stop:
			panic(http.ErrAbortHandler)
		}
	}
	resp, err := p.forward(context.WithoutCancel(r.Context()), r, body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || f == dropReply {
		panic(http.ErrAbortHandler) // the owner acted; its answer is lost
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(data)
}

func (p *faultProxy) forward(ctx context.Context, r *http.Request, body []byte) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	req, err := http.NewRequestWithContext(ctx, r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil, err
	}
	req.Header = r.Header.Clone()
	resp, err := p.backend.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = cancelOnClose{resp.Body, cancel}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error { err := c.ReadCloser.Close(); c.cancel(); return err }

func isReserve(r *http.Request) bool {
	return r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/peer/reservations/") && !strings.HasSuffix(r.URL.Path, "/commit")
}

func isCommit(r *http.Request) bool {
	return r.Method == http.MethodPost && strings.Contains(r.URL.Path, "/peer/reservations/") && strings.HasSuffix(r.URL.Path, "/commit")
}

// (a) Many claimers through different coordinators race for the last GPUs:
// every GPU goes to at most one claim, and every client-observed history
// is linearizable on each server.
func TestFaultRacingClaimers(t *testing.T) {
	bothLookups(t, func(t *testing.T, tc *testCluster) {
		// The lease is long enough that a coordinator starved of CPU (the
		// race detector, a busy 2-core machine) still commits in time: this
		// test is about racing claimers, not expiry. With faultLease, one
		// run of six seeds under -race on a loaded machine failed: a
		// commit found its reservation gone ("not found on this server"),
		// as when a 2 s lease is swept before the commit arrives.
		racing := func(c *Config) { c.ReservationLease = Duration(10 * time.Second) }
		agents := []*Agent{tc.startWith("a", "l40s-4", racing), tc.startWith("b", "l40s-4", racing), tc.startWith("c", "rtx6000pro-2", racing)}
		tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 8 })
		const (
			clients = 6
			rounds  = 4
		)
		// One schedule per seed, one after the other on the same agents
		// (each ends with every GPU free); a failure names its seed.
		for seed := uint64(20240601); seed < 20240601+racingSeeds; seed++ {
			t.Logf("seed %d: %d clients × %d claims of 1-3 L40S (8 on the platform) through 3 coordinators", seed, clients, rounds)
			h := newHistory()
			ctx := context.Background()
			var wg sync.WaitGroup
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rnd := rand.New(rand.NewPCG(seed, uint64(c)))
					for k := range rounds {
						id := fmt.Sprintf("vm-%d-%d-%d", seed, c, k)
						via, n := agents[rnd.IntN(len(agents))], 1+rnd.IntN(3)
						err := retryUnavailable(func() error {
							_, err := h.claim(ctx, c, via, id, "NVIDIA L40S", n)
							return err
						})
						if err != nil && !api.IsCode(err, api.CodeNotAvailable) {
							t.Errorf("seed %d: claim %s: %v", seed, id, err)
						}
						if err == nil && rnd.IntN(3) != 0 {
							via := agents[rnd.IntN(len(agents))]
							if err := retryUnavailable(func() error { return h.release(ctx, c, via, id) }); err != nil {
								t.Errorf("seed %d: release %s: %v", seed, id, err)
							}
						}
					}
				}()
			}
			wg.Wait()
			checkInvariants(t, agents...)
			h.resolve(agents...)
			h.checkLinearizable(t)

			// Release what is left through yet other coordinators: all free again.
			all, _ := agents[0].Claims(ctx)
			for i, c := range all {
				if err := retryUnavailable(func() error { return h.release(ctx, 99, agents[(i+1)%3], c.ID) }); err != nil {
					t.Errorf("seed %d: release %s: %v", seed, c.ID, err)
				}
			}
			tc.converge("every L40S free", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 8 })
			checkInvariants(t, agents...)
			h.checkLinearizable(t)
		}
	})
}

// retryUnavailable calls op again while it answers a retryable 503, as
// the clients of this platform do, backing off 0.1, 0.2, 0.4, 0.8 s: with
// no fault injected, a loaded machine (two packages' tests under -race at
// once) still makes a peer call time out or a gossip probe miss its ack
// now and then (the prober then holds the member suspect until the next
// probe answers), and the agent says so. Each try goes into the history,
// an unanswered one as unknown.
func retryUnavailable(op func() error) error {
	pause := 100 * time.Millisecond
	for try := 1; ; try++ {
		err := op()
		if !api.IsCode(err, api.CodeUnavailable) || try == 5 {
			return err
		}
		time.Sleep(pause)
		pause *= 2
	}
}

// racingSeeds is how many schedules TestFaultRacingClaimers runs (it ran
// one when its agents talked over sockets).
const racingSeeds = 6

// (b) A coordinator dies between reserve and commit. A retry of the claim
// through another coordinator within the lease adopts and commits the
// reservation; a reservation nobody retries expires, its GPUs free again.
func TestFaultCoordinatorDiesBeforeCommit(t *testing.T) {
	bothLookups(t, func(t *testing.T, tc *testCluster) {
		tc.clock = &offsetClock{}
		a, b, c := tc.startShortLease("a", "a100-pcie-4"), tc.startShortLease("b", "l40s-4"), tc.startShortLease("c", "a100-pcie-4")
		tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 4 && freeOf(x, "NVIDIA A100 80GB") == 8 })
		ctx := context.Background()
		rr := api.ReserveRequest{Items: []api.Item{{Model: "NVIDIA L40S", Count: 2}}, Coordinator: "a"}

		// a reserves on b over the mutual-TLS peer API, then "dies".
		peer := a.cluster.client("b", b.cluster.peerAddr)
		res, err := peer.Reserve(ctx, "vm-adopt", rr)
		if err != nil || res.State != api.StateReserved || res.Node != "b" {
			t.Fatalf("reserve on b through the peer API: %+v, %v", res, err)
		}
		for _, g := range res.GPUs {
			if d := driverOf(t, b.sim.Kernel, g.PCIAddress); d != vfio.DriverVFIO {
				t.Errorf("reserved %s on %q, want vfio-pci", g.PCIAddress, d)
			}
		}
		// The client retries through c within the lease: c finds the
		// reservation and commits it, same GPUs.
		h := newHistory()
		got, err := h.claim(ctx, 1, c, "vm-adopt", "NVIDIA L40S", 2)
		if err != nil || got.Node != "b" || got.State != api.StateClaimed || !sameGPUs(got, res) {
			t.Fatalf("retry through c: %+v, %v; want the reservation %+v committed", got, err, res)
		}
		t.Logf("a reservation left by a dead coordinator was adopted and committed by c: %v on b", gpuList(got))

		// A second dead coordinator's reservation nobody retries: it expires.
		if _, err := b.Reserve(ctx, "vm-orphan", rr); err != nil {
			t.Fatal(err)
		}
		if n := localFree(b, "NVIDIA L40S"); n != 0 {
			t.Fatalf("b has %d L40S free with 2 claimed and 2 reserved", n)
		}
		// Nobody comes back for it: its lease runs out on b's clock, and
		// b's next sweep (every quarter lease, on a real timer) drops it.
		if _, err := b.Lookup(ctx, "vm-orphan"); err != nil {
			t.Fatalf("the orphan reservation before its lease ran out: %v", err)
		}
		// Waiting less than a lease: only the clock can have run it out.
		tc.clock.Advance(faultLease + time.Second)
		took := waitFor(t, "the orphan reservation expires and is swept", faultLease-500*time.Millisecond, func() bool {
			_, err := b.Lookup(ctx, "vm-orphan")
			return api.IsCode(err, api.CodeNotFound) && localFree(b, "NVIDIA L40S") == 2 && len(b.ledger.List()) == 1 && noneOnVFIO(t, b)
		})
		t.Logf("orphan reservation gone %v after its lease (%v) ran out on the agents' clock, its GPUs free on the idle driver", took.Round(time.Millisecond), faultLease)
		checkInvariants(t, a, b, c)

		// After the expiry a retry of the orphan's ID is a fresh claim.
		again, err := h.claim(ctx, 1, a, "vm-orphan", "NVIDIA L40S", 2)
		if err != nil || again.State != api.StateClaimed {
			t.Fatalf("claim vm-orphan after its reservation expired: %+v, %v", again, err)
		}
		// Committing the expired reservation now is refused (it is a new claim
		// that is already committed: idempotent), and the dead one is gone.
		if _, err := b.Commit(ctx, "vm-none"); !api.IsCode(err, api.CodeNotFound) {
			t.Errorf("commit of an unknown reservation: %v, want not_found", err)
		}
		checkInvariants(t, a, b, c)
		h.resolve(a, b, c)
		h.checkLinearizable(t)
	})
}

// (c) An owner that answers too slowly: the coordinator gives up on it,
// aborts best-effort and places the claim elsewhere; the reservation that
// reaches the slow owner late is never committed and expires.
func TestIntegrationFaultSlowOwner(t *testing.T) {
	tc := newSocketCluster(t)
	a, b, c := tc.startShortLease("a", "a100-pcie-4"), tc.startShortLease("b", "l40s-4"), tc.startShortLease("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 8 })
	tc.registryUp()
	ctx := context.Background()
	// a's reservations on b arrive 5 s late; a's client gives up after 1 s.
	// The delay must outlast the whole placement on c: a reservation that
	// lands while a is still settling is found and committed there (the
	// claim is still placed once, but not where this test looks). At 2.5 s
	// that happened on a loaded machine under -race.
	proxy := newFaultProxy(t, tc, a, b, 5*time.Second, func(r *http.Request) fault {
		if isReserve(r) {
			return delayThenForward
		}
		return passThrough
	})
	h := newHistory()
	start := time.Now()
	got, err := func() (api.Claim, error) {
		// The claim prefers b, so b is asked first.
		in := claimInput{ID: "vm-slow", Model: "NVIDIA L40S", N: 2}
		call := h.since()
		cl, err := a.Claim(ctx, in.ID, api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}, PreferNode: "b"})
		h.record(1, in, call, h.since(), cl, err)
		return cl, err
	}()
	if err != nil || got.Node != "c" {
		t.Fatalf("claim with b too slow: %+v, %v; want it placed on c", got, err)
	}
	t.Logf("b did not answer in time; the claim landed on c after %v (reserves delayed: %d)", time.Since(start).Round(time.Millisecond), proxy.count(delayThenForward))
	checkInvariants(t, a, b, c)

	// The late reservation reaches b after a gave up, and is never
	// committed: b's hold is refused (the ID is held on c) and b drops it,
	// or it lapses with its lease. close returns once the delayed delivery
	// was made and answered.
	proxy.close()
	if n := proxy.count(delayThenForward); n != 1 {
		t.Fatalf("%d reserves delayed; want 1", n)
	}
	checkInvariants(t, a, b, c)
	if cl, err := c.Get(ctx, "vm-slow"); err != nil || cl.Node != "c" || cl.State != api.StateClaimed {
		t.Errorf("get vm-slow after b's late reservation: %+v, %v; want the claim on c", cl, err)
	}
	if cl, err := b.ledger.Get("vm-slow"); err == nil && cl.State == ledger.StateCommitted {
		t.Fatalf("b committed the late reservation: %+v", cl)
	}
	took := waitFor(t, "b's late reservation is gone", faultLease+10*time.Second, func() bool {
		_, err := b.ledger.Get("vm-slow")
		return err != nil && localFree(b, "NVIDIA L40S") == 4 && noneOnVFIO(t, b)
	})
	t.Logf("b's late reservation gone %v after it was answered; b's 4 L40S free again", took.Round(time.Millisecond))
	checkInvariants(t, a, b, c)

	// An owner that never answers at all, and the only one that fits: the
	// claim fails cleanly, nothing is committed anywhere.
	proxy2 := newFaultProxy(t, tc, a, b, 0, func(r *http.Request) fault {
		if isReserve(r) {
			return blackhole
		}
		return passThrough
	})
	_, err = h.claim(ctx, 2, a, "vm-big", "NVIDIA L40S", 4) // c has 2 left: only b fits
	if err == nil {
		t.Fatalf("claim of 4 L40S with b blackholed succeeded")
	}
	t.Logf("with b blackholed (%d reserves swallowed) the claim fails: %v", proxy2.count(blackhole), err)
	proxy2.close()
	checkInvariants(t, a, b, c)
	h.resolve(a, b, c)
	h.checkLinearizable(t)
}

// (d) A stale view: b's GPUs are taken without gossip saying so. A
// coordinator that believes them free gets "no" from b and answers "not
// available", or moves on to the next candidate; never a double allocation.
func TestFaultStaleView(t *testing.T) {
	tc := newTestCluster(t)
	a, b, c := tc.startShortLease("a", "a100-pcie-4"), tc.startShortLease("b", "l40s-4"), tc.startShortLease("c", "l40s-4")
	tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 8 })
	ctx := context.Background()
	h := newHistory()
	// c keeps 2 L40S free, and everyone knows it.
	in := claimInput{ID: "vm-pre", Model: "NVIDIA L40S", N: 2}
	call := h.since()
	pre, err := c.Claim(ctx, in.ID, api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}, PreferNode: "c"})
	h.record(1, in, call, h.since(), pre, err)
	if err != nil || pre.Node != "c" {
		t.Fatalf("claim vm-pre on c: %+v, %v", pre, err)
	}
	tc.converge("c's 2 L40S taken", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 6 })

	// Reserving on the owner publishes nothing: a's view still shows b's
	// 4 L40S free.
	if _, err := b.Reserve(ctx, "ghost-b", api.ReserveRequest{Items: []api.Item{{Model: "NVIDIA L40S", Count: 4}}, Coordinator: "ghost"}); err != nil {
		t.Fatal(err)
	}
	if v := viewOf(a, "b", "NVIDIA L40S"); v != 4 {
		t.Fatalf("a's view of b: %d L40S free, want the stale 4", v)
	}
	// 3 L40S fit only on b by a's view: b says no, nothing else fits.
	_, err = h.claim(ctx, 1, a, "vm-3", "NVIDIA L40S", 3)
	if !api.IsCode(err, api.CodeNotAvailable) {
		t.Fatalf("claim of 3 L40S with b's taken unbeknown to a: %v, want not available", err)
	}
	t.Logf("a believed b had 4 L40S free; b said no; the claim is not available")
	checkInvariants(t, a, b, c)

	// Now c's two L40S are taken unbeknown to a, and b's are free again:
	// best fit asks c first (stale), c says no, a moves on to b.
	if _, err := b.Abort(ctx, "ghost-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, "ghost-c", api.ReserveRequest{Items: []api.Item{{Model: "NVIDIA L40S", Count: 2}}, Coordinator: "ghost"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a sees b's L40S free again", 5*time.Second, func() bool { return viewOf(a, "b", "NVIDIA L40S") == 4 })
	if v := viewOf(a, "c", "NVIDIA L40S"); v != 2 {
		t.Fatalf("a's view of c: %d L40S free, want the stale 2", v)
	}
	got, err := h.claim(ctx, 1, a, "vm-2", "NVIDIA L40S", 2)
	if err != nil || got.Node != "b" {
		t.Fatalf("claim of 2 L40S with c's taken unbeknown to a: %+v, %v; want it on b", got, err)
	}
	t.Logf("a's view of c was stale (2 free); the claim landed on b")
	checkInvariants(t, a, b, c)
	h.resolve(a, b, c)
	h.checkLinearizable(t)
}

// (e) The answer to a commit is lost: the owner committed, the coordinator
// cannot know. It must not place the claim on another server
// (docs/protocol.md: "never moves on after a commit it cannot confirm").
func TestFaultCommitAnswerLost(t *testing.T) {
	bothLookups(t, func(t *testing.T, tc *testCluster) {
		// The claim must go to b first. Under load a can pass b over
		// before any commit reaches it: a missed probe ack holds b
		// suspect, or b answers the reservation too late (1 run in 27,
		// then 1 in 53, of the race loop), and the claim lands on c with
		// no answer lost. The probes are slow here (this test needs no
		// quick failure detection), and a try in which the fault did not
		// happen is released and made again under another ID.
		tc.tune = loadedGossip
		a, b, c := tc.startShortLease("a", "a100-pcie-4"), tc.startShortLease("b", "l40s-4"), tc.startShortLease("c", "l40s-4")
		tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 8 })
		ctx := context.Background()
		h := newHistory()
		const tries = 3
		var (
			in  claimInput
			got api.Claim
			err error
			on  []string
		)
		for try := 1; ; try++ {
			proxy := newFaultProxy(t, tc, a, b, 0, func(r *http.Request) fault {
				if isCommit(r) {
					return dropReply
				}
				return passThrough
			})
			in = claimInput{ID: fmt.Sprintf("vm-lost-%d", try), Model: "NVIDIA L40S", N: 2}
			call := h.since()
			got, err = a.Claim(ctx, in.ID, api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}, PreferNode: "b"})
			h.record(1, in, call, h.since(), got, err)
			dropped := proxy.count(dropReply)
			proxy.close()
			on = nil
			for _, x := range []*Agent{a, b, c} {
				if cl, err := x.ledger.Get(in.ID); err == nil && cl.State == ledger.StateCommitted {
					on = append(on, x.cfg.NodeName)
				}
			}
			t.Logf("try %d: commit answers lost: %d; claim returned %+v, %v; committed on %v", try, dropped, got.Node, err, on)
			if dropped > 0 || slices.Contains(on, "b") {
				break
			}
			if try == tries {
				t.Fatalf("a never committed on b in %d tries (last: claim on %q, %v): the fault did not happen", tries, got.Node, err)
			}
			if err == nil {
				if rerr := h.release(ctx, 1, a, in.ID); rerr != nil {
					t.Fatalf("release of %s, whose try made no fault: %v", in.ID, rerr)
				}
			}
		}
		if len(on) != 1 || on[0] != "b" {
			t.Errorf("BUG: after a lost commit answer from b the claim is committed on %v, want only b: "+
				"coordinate moved on to the next server because attempt.commit's error is not errCommitUnknown", on)
		}
		if err == nil && got.Node != "b" {
			t.Errorf("claim answered ok on %s while it is committed on b", got.Node)
		}
		// A retry through another coordinator learns the claim's state.
		if cl, err := c.Claim(ctx, in.ID, api.ClaimRequest{GPUs: []api.Item{{Model: "L40S", Count: 2}}}); err != nil || cl.Node != "b" {
			t.Errorf("retry through c: %+v, %v; want the claim committed on b", cl, err)
		}
		checkInvariants(t, a, b, c)
		h.resolve(a, b, c)
		h.checkLinearizable(t)
	})
}

// (f) The same claim asked twice at once through two coordinators (a client
// that timed out and retried elsewhere): the claim must still end on one
// server.
func TestFaultConcurrentRetriesOfOneClaim(t *testing.T) {
	bothLookups(t, func(t *testing.T, tc *testCluster) {
		a, b, c := tc.startShortLease("a", "l40s-4"), tc.startShortLease("b", "l40s-4"), tc.startShortLease("c", "a100-pcie-4")
		agents := []*Agent{a, b, c}
		tc.converge("membership", func(x *Agent) bool { return freeOf(x, "NVIDIA L40S") == 8 })
		ctx := context.Background()
		const tries = 6
		h := newHistory()
		dups := 0
		for i := range tries {
			id := fmt.Sprintf("vm-dup-%d", i)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for k, coord := range []*Agent{a, c} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					if _, err := h.claim(ctx, k, coord, id, "NVIDIA L40S", 1); err != nil {
						t.Logf("claim %s through %s: %v", id, coord.cfg.NodeName, err)
					}
				}()
			}
			close(start)
			wg.Wait()
			var on []string
			for _, x := range agents {
				if cl, err := x.ledger.Get(id); err == nil && cl.State == ledger.StateCommitted {
					on = append(on, x.cfg.NodeName)
				}
			}
			if len(on) > 1 {
				dups++
				t.Errorf("BUG: claim %s asked at once through a and c is committed on %v", id, on)
			}
		}
		t.Logf("%d concurrent duplicate claims, %d committed on more than one server", tries, dups)
		checkInvariants(t, agents...)
		h.resolve(agents...)
		h.checkLinearizable(t)
	})
}

func sameGPUs(x, y api.Claim) bool {
	if len(x.GPUs) != len(y.GPUs) {
		return false
	}
	for i := range x.GPUs {
		if x.GPUs[i].PCIAddress != y.GPUs[i].PCIAddress {
			return false
		}
	}
	return true
}

func gpuList(c api.Claim) []string {
	var out []string
	for _, g := range c.GPUs {
		out = append(out, g.PCIAddress)
	}
	return out
}
