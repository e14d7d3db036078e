package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/names"
	"github.com/gpuherd/gpuherd/agent/pki"
	"github.com/gpuherd/gpuherd/agent/placement"
)

// errRefused: no server could hold the claim (not_available).
var errRefused = errors.New("not available")

// allocator is a way to place claims: the agents themselves, the bench's
// own coordinator with another ranking, or the central etcd allocator.
type allocator interface {
	name() string
	claim(ctx context.Context, rnd *rand.Rand, id, model string, count int) (server string, err error)
	release(ctx context.Context, id, server string) error
	retries() int64 // stale answers / conflicts so far
}

// agentAlloc places claims through a random agent's coordinator (Agent.Claim,
// the same code the API runs), and releases on the owner.
type agentAlloc struct{ c *cluster }

func (agentAlloc) name() string { return "gpuherd (best fit)" }

func (x agentAlloc) claim(ctx context.Context, rnd *rand.Rand, id, model string, count int) (string, error) {
	coord := x.c.nodes[rnd.IntN(len(x.c.nodes))]
	return placedOn(coord.a.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: model, Count: count}}}))
}

// placedOn is the server a claim's answer names, errRefused for a
// not_available, or the error.
func placedOn(cl api.Claim, err error) (string, error) {
	if err != nil {
		var e *api.Error
		if errors.As(err, &e) && e.Code == api.CodeNotAvailable {
			return "", errRefused
		}
		return "", err
	}
	return cl.Node, nil
}

func (x agentAlloc) release(ctx context.Context, id, server string) error {
	_, err := x.c.by[server].a.Release(ctx, id)
	return err
}

func (x agentAlloc) retries() int64 { return x.c.ctr.reserveFailed.Load() }

// viewAlloc is the bench's own coordinator: it takes a random agent's gossip
// view (Agent.Members), ranks it with its ranker, and asks the owners over
// the real mutual-TLS peer API (reserve, commit), at most eight of them, as
// the agent's coordinator does — minus the claim-ID lookup on every server,
// which a trace of fresh IDs does not need.
type viewAlloc struct {
	label string
	c     *cluster
	rank  ranker
	files pki.Files

	mu      sync.Mutex
	clients map[string]*api.PeerClient
	stale   atomic.Int64
}

func newViewAlloc(label string, c *cluster, rank ranker, files pki.Files) *viewAlloc {
	return &viewAlloc{label: label, c: c, rank: rank, files: files, clients: map[string]*api.PeerClient{}}
}

func (v *viewAlloc) name() string { return v.label }

func (v *viewAlloc) client(name string) (*api.PeerClient, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if pc, ok := v.clients[name]; ok {
		return pc, nil
	}
	cfg, err := pki.ClientConfigFor(v.files, name)
	if err != nil {
		return nil, err
	}
	pc := api.NewPeerClient(v.c.by[name].peerAddr, cfg, 20*time.Second)
	v.clients[name] = pc
	return pc, nil
}

func (v *viewAlloc) close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, pc := range v.clients {
		pc.Close()
	}
}

// view is the servers as one agent sees them.
func view(nd *node) []placement.Server {
	ms, _ := nd.a.Members(context.Background())
	out := make([]placement.Server, 0, len(ms))
	for _, m := range ms {
		if m.State != "alive" {
			continue
		}
		s := placement.Server{Name: m.Name, Drained: m.Drained, Free: map[string]int{}}
		for _, x := range m.Models {
			s.Free[x.Model] = x.Free
		}
		out = append(out, s)
	}
	return out
}

func (v *viewAlloc) claim(ctx context.Context, rnd *rand.Rand, id, model string, count int) (string, error) {
	coord := v.c.nodes[rnd.IntN(len(v.c.nodes))]
	ranked := v.rank(view(coord), []placement.Want{{Model: model, Count: count}}, rnd)
	if len(ranked) > 8 {
		ranked = ranked[:8]
	}
	rr := api.ReserveRequest{Items: []api.Item{{Model: model, Count: count}}, Coordinator: benchCoordinator}
	// The owners commit only a reservation that carries the claim ID's
	// name token: the bench's coordinator acquires it as an agent does.
	token, err := v.registry(ctx, coord.name, names.Request{Op: names.OpAcquire, Key: names.Claim(id),
		Request: fmt.Sprintf("bench %s %d", model, count)})
	if err != nil {
		return "", err
	}
	rr.Token = token
	placed := false
	defer func() {
		if !placed {
			_, _ = v.registry(context.WithoutCancel(ctx), coord.name, names.Request{Op: names.OpRelease, Key: names.Claim(id), Token: token})
		}
	}()
	for _, s := range ranked {
		pc, err := v.client(s)
		if err != nil {
			return "", err
		}
		if _, err := pc.Reserve(ctx, id, rr); err != nil {
			var e *api.Error
			if errors.As(err, &e) && e.Code == api.CodeNotAvailable {
				v.stale.Add(1)
				continue
			}
			_, _ = pc.AbortReservation(ctx, id)
			continue
		}
		if _, err := pc.Commit(ctx, id); err != nil {
			return "", err
		}
		placed = true
		return s, nil
	}
	return "", errRefused
}

// registry sends a name registry request through node's peer API as the
// bench's own coordinator and returns the record's token.
func (v *viewAlloc) registry(ctx context.Context, node string, req names.Request) (uint64, error) {
	pc, err := v.client(node)
	if err != nil {
		return 0, err
	}
	var resp names.Response
	if err := pc.Names(ctx, req, &resp); err != nil {
		return 0, err
	}
	if e := resp.Error; e != nil && e.Code == names.WireNotLeader {
		// Ask the leader it names, or else every agent in turn, as an
		// agent's forwarder does.
		if e.Leader != "" && e.Leader != node {
			return v.registry(ctx, e.Leader, req)
		}
		for _, nd := range v.c.nodes {
			if nd.name == node {
				continue
			}
			pc, err := v.client(nd.name)
			if err != nil {
				return 0, err
			}
			resp = names.Response{}
			if err := pc.Names(ctx, req, &resp); err != nil {
				return 0, err
			}
			if resp.Error == nil || resp.Error.Code != names.WireNotLeader {
				break
			}
		}
	}
	switch {
	case resp.Error != nil:
		return 0, fmt.Errorf("name registry: %s", resp.Error.Message)
	case resp.Result == nil || resp.Result.Record == nil:
		return 0, fmt.Errorf("name registry answered %s of %s without a record", req.Op, req.Key)
	case resp.Result.Code != names.CodeOK && resp.Result.Code != names.CodeSame:
		return 0, fmt.Errorf("name registry refused %s of %s: %s %s", req.Op, req.Key, resp.Result.Code, resp.Result.Detail)
	}
	return resp.Result.Record.Token, nil
}

func (v *viewAlloc) release(ctx context.Context, id, server string) error {
	_, err := v.c.by[server].a.Release(ctx, id)
	return err
}

func (v *viewAlloc) retries() int64 { return v.stale.Load() }

// replayResult is one replay of a trace on one allocator.
type replayResult struct {
	alloc            string
	load             float64
	offered          int // measured claims (warm-up excluded)
	accepted         int
	refused          int
	refusedWhileFit  int // refused while, by the owners' ledgers, some server could hold it
	errors           int
	retries          int64
	latency          durations // granted, measured claims
	wall             time.Duration
	firstErr         error
	truthChecked     bool
	offeredPerSecond float64
	diag             placementDiag
}

// placementDiag classifies, with the owners' ledgers read right after
// each refusal, the refusals of claims that the oracle (omniscient best
// fit on the same trace) granted; and, with the ledgers read right after
// each grant, the grants that did not go to the best-fitting server.
type placementDiag struct {
	oracleGranted int // refused here, granted by the oracle
	whileFit      int // …while some server had room (stale view, race)
	fragmented    int // …no server had room, but together they had enough
	late          int // …a server would have had room with the releases due by then
	full          int // …not even that: earlier claims placed or kept differently
	oracleRefused int // granted here, refused by the oracle
	grants        int // measured grants checked
	worseFit      int // …on a server leaving more free than the best fit would have
}

func (d placementDiag) String() string {
	return fmt.Sprintf("refused but granted by the oracle: %d (while fit %d, fragmented %d, late releases %d, full %d); granted but refused by the oracle: %d; grants not on the best fit: %d of %d",
		d.oracleGranted, d.whileFit, d.fragmented, d.late, d.full, d.oracleRefused, d.worseFit, d.grants)
}

// classifyRefusal says why a claim of count × model found no server, by
// free (the ledgers, read after the refusal) and late (the GPUs of claims
// whose holding time was over but whose release had not been applied).
func classifyRefusal(d *placementDiag, free, late capacity, model string, count int) {
	d.oracleGranted++
	total := 0
	for _, ms := range free {
		total += ms[model]
	}
	switch {
	case fitsSomewhere(free, model, count):
		d.whileFit++
	case total >= count:
		d.fragmented++
	default:
		for s, ms := range late {
			if free[s][model]+ms[model] >= count {
				d.late++
				return
			}
		}
		d.full++
	}
}

// worseThanBest reports whether a grant of count × model on server left it
// with more free GPUs of model than the best-fitting server would have been
// left with, by free read right after the grant.
func worseThanBest(free capacity, server, model string, count int) bool {
	left := free[server][model]
	for s, ms := range free {
		if s != server && ms[model] >= count && ms[model]-count < left {
			return true
		}
	}
	return false
}

// replay issues the trace's claims at their arrival times (open loop: each
// in its own goroutine), releases each granted claim when its holding time
// is over, and at the end releases whatever is still held. truth, when not
// nil, reads the owners' ledgers when a claim is refused.
func replay(ctx context.Context, t trace, al allocator, truth func() capacity, seed uint64) replayResult {
	res := replayResult{alloc: al.name(), load: t.Load, truthChecked: truth != nil}
	var oracle []bool
	if t.Capa != nil {
		oracle = simulateEach(t, t.Capa, bestFit, seed)
	}
	holding := map[string]request{} // granted, release not yet applied
	// Retries are counted from the first claim after the warm-up, like
	// everything else: the warm-up issues the claims alive at time 0 in one
	// burst from an empty platform, a transient no steady state has.
	r0 := al.retries()
	counting := false
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		held = map[string]string{}
		end  = make(chan struct{})
	)
	start := time.Now()
	for i, rq := range t.Requests {
		if d := time.Until(start.Add(rq.At)); d > 0 {
			time.Sleep(d)
		}
		if !rq.Warmup && !counting {
			r0, counting = al.retries(), true
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(seed, uint64(i)))
			t0 := time.Now()
			srv, err := al.claim(ctx, rnd, rq.ID, rq.Model, rq.Count)
			lat := time.Since(t0)
			var fitNow bool
			var free capacity
			if !rq.Warmup && truth != nil && (err == nil || errors.Is(err, errRefused)) {
				free = truth()
			}
			if errors.Is(err, errRefused) && free != nil {
				fitNow = fitsSomewhere(free, rq.Model, rq.Count)
			}
			mu.Lock()
			if free != nil && oracle != nil {
				switch {
				case err == nil:
					res.diag.grants++
					if worseThanBest(free, srv, rq.Model, rq.Count) {
						res.diag.worseFit++
					}
					if !oracle[i] {
						res.diag.oracleRefused++
					}
				case oracle[i]:
					late := capacity{}
					now := time.Since(start)
					for _, h := range holding {
						if h.At+h.Hold <= now {
							if late[held[h.ID]] == nil {
								late[held[h.ID]] = map[string]int{}
							}
							late[held[h.ID]][h.Model] += h.Count
						}
					}
					classifyRefusal(&res.diag, free, late, rq.Model, rq.Count)
				}
			}
			if !rq.Warmup {
				res.offered++
				switch {
				case err == nil:
					res.accepted++
					res.latency = append(res.latency, lat)
				case errors.Is(err, errRefused):
					res.refused++
					if fitNow {
						res.refusedWhileFit++
					}
				default:
					res.errors++
					if res.firstErr == nil {
						res.firstErr = err
					}
				}
			}
			if err == nil {
				held[rq.ID] = srv
				holding[rq.ID] = rq
			}
			mu.Unlock()
			if err != nil {
				return
			}
			select {
			case <-time.After(time.Until(start.Add(rq.At + rq.Hold))):
			case <-end:
			}
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_ = al.release(rctx, rq.ID, srv)
			cancel()
			mu.Lock()
			delete(held, rq.ID)
			delete(holding, rq.ID)
			mu.Unlock()
		}()
	}
	if d := time.Until(start.Add(t.Duration)); d > 0 {
		time.Sleep(d)
	}
	res.wall = time.Since(start)
	close(end)
	wg.Wait()
	res.retries = al.retries() - r0
	res.offeredPerSecond = float64(res.offered) / t.Duration.Seconds()
	if truth != nil && oracle != nil {
		progress("  accepted %d of %d; %s", res.accepted, res.offered, res.diag)
	}
	return res
}

// closedLoop runs workers that each claim one GPU and release it, again and
// again, for dur; it returns the claim latencies and claims per second.
func closedLoop(ctx context.Context, al allocator, models []string, workers int, dur time.Duration, seed uint64, prefix string) (durations, float64, int, error) {
	var (
		mu       sync.Mutex
		lat      durations
		errs     int
		firstErr error
		wg       sync.WaitGroup
	)
	deadline := time.Now().Add(dur)
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := 0; time.Now().Before(deadline); i++ {
				id := prefix + "-" + itoa(w) + "-" + itoa(i)
				model := models[rnd.IntN(len(models))]
				t0 := time.Now()
				srv, err := al.claim(ctx, rnd, id, model, 1)
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					errs++
					if firstErr == nil {
						firstErr = err
					}
				} else {
					lat = append(lat, d)
				}
				mu.Unlock()
				if err == nil {
					_ = al.release(ctx, id, srv)
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	return lat, float64(len(lat)) / el.Seconds(), errs, firstErr
}

func itoa(i int) string {
	const digits = "0123456789"
	if i == 0 {
		return "0"
	}
	var b [20]byte
	p := len(b)
	for i > 0 {
		p--
		b[p] = digits[i%10]
		i /= 10
	}
	return string(b[p:])
}

// benchCoordinator is the node name of the bench's own coordinator: its
// certificate's, which the owners check every reservation's coordinator
// against.
const benchCoordinator = "bench-coordinator"
