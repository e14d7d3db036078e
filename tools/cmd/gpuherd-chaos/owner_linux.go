package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Faults aimed at a claim's owner, while clients retry the claim through
// the other agents (issue 11, point 1: a retry through another agent while
// the owner is down placed a second copy).
const (
	ownerKill      = "owner kill-9 while clients retry"
	ownerFreeze    = "owner SIGSTOP past lease, clients retry"
	ownerIsolate   = "owner link down while clients retry"
	ownerPartition = "owner+authority minority, then restart"
	ownerRelease   = "release sent to a frozen owner"
)

var ownerFaultKinds = []string{ownerKill, ownerFreeze, ownerIsolate, ownerPartition, ownerRelease}

// ownerScenarios runs the owner-aimed scenarios. It shares the faulter's
// bookkeeping, so that its faults never overlap a random lane's fault of
// the same class on the same node.
type ownerScenarios struct {
	w     *workload
	f     *faulter
	lease time.Duration
}

// lane runs one scenario after the other until the deadline.
func (s *ownerScenarios) lane(ctx context.Context, l int, rng *rand.Rand, deadline time.Time) {
	for n := 1; ctx.Err() == nil && !s.w.stopped() && time.Until(deadline) > 8*time.Second; n++ {
		s.scenario(ctx, l, n, rng)
		sleep(ctx, between(rng, 200*time.Millisecond, time.Second))
	}
}

// scenario: a claim lands; its owner is killed, frozen past a lease, cut
// off, or put on the minority side of a partition with the name authority;
// meanwhile clients retry the claim with the same request and with another
// one through the other agents, read it, and read IDs that never existed.
// Then the fault heals and the claim is released, with retries, and read
// back: it must be gone. In the ownerRelease variant the release itself is
// sent while the owner is frozen, longer than a coordinator waits for it,
// and no claim is retried (a retry after the release would be a new claim).
func (s *ownerScenarios) scenario(ctx context.Context, l, n int, rng *rand.Rand) {
	w := s.w
	viaCLI := rng.Float64() < w.cliShare
	rec := w.newRec(fmt.Sprintf("vm-o%d-%d", l, n), w.request(rng))
	claimOwn := func(a *agent) outcome { return w.claim(a, rec, rec.items, viaCLI) }
	if w.retrying(rng, w.agents[rng.IntN(len(w.agents))], "", 10*time.Second, claimOwn) != outOK {
		return
	}
	owner := s.agentNamed(rec.node)
	if owner == nil {
		return
	}
	kind := ownerFaultKinds[rng.IntN(len(ownerFaultKinds))]
	heal, d, ok := s.inject(ctx, kind, owner, rec.id, rng)
	if !ok {
		w.releaseRetrying(rng, w.agents[rng.IntN(len(w.agents))], "", rec, viaCLI, retryBudget)
		return
	}
	faultEnd := time.Now().Add(d)
	healed := make(chan struct{})
	go func() {
		defer close(healed)
		sleep(context.WithoutCancel(ctx), time.Until(faultEnd))
		heal()
	}()

	var wg sync.WaitGroup
	client := func(body func(r *rand.Rand)) {
		r := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		wg.Add(1)
		go func() { defer wg.Done(); body(r) }()
	}
	// Readers: the claim, and IDs that never existed, through the others.
	unknown := 0
	client(func(r *rand.Rand) {
		for time.Now().Before(faultEnd) && !w.stopped() {
			w.get(w.another(r, owner.name, ""), rec, viaCLI)
			unknown++
			w.getUnknown(w.another(r, owner.name, ""), fmt.Sprintf("nx-o%d-%d-%d", l, n, unknown), viaCLI, "")
			sleep(ctx, between(r, 300*time.Millisecond, time.Second))
		}
	})
	if kind == ownerRelease {
		// The release goes out while the owner is frozen; the client
		// retries it through the others and, after the heal, anywhere.
		sleep(ctx, 500*time.Millisecond)
		done := w.releaseRetrying(rng, w.another(rng, owner.name, ""), "", rec, viaCLI, d+retryBudget)
		wg.Wait()
		<-healed
		if done {
			s.readBack(rng, rec, viaCLI)
		}
		return
	}
	// Claimers retrying the same ID through the other agents: with the
	// same request (a client whose answer was lost), and half of the time
	// also with another request (which must be a conflict).
	client(func(r *rand.Rand) {
		for time.Now().Before(faultEnd) && !w.stopped() {
			w.retrying(r, w.another(r, owner.name, ""), owner.name, time.Until(faultEnd), claimOwn)
			sleep(ctx, between(r, 300*time.Millisecond, 800*time.Millisecond))
		}
	})
	if rng.IntN(2) == 0 {
		other := w.otherRequest(rng, rec.items)
		client(func(r *rand.Rand) {
			for time.Now().Before(faultEnd) && !w.stopped() {
				w.retrying(r, w.another(r, owner.name, ""), owner.name, time.Until(faultEnd), func(a *agent) outcome { return w.claim(a, rec, other, viaCLI) })
				sleep(ctx, between(r, 300*time.Millisecond, 800*time.Millisecond))
			}
		})
	}
	wg.Wait()
	<-healed
	if w.releaseRetrying(rng, w.agents[rng.IntN(len(w.agents))], "", rec, viaCLI, retryBudget) {
		s.readBack(rng, rec, viaCLI)
	}
}

// readBack reads a released claim through two agents: an acknowledged
// release leaves nothing under its ID (judgeGetLocked).
func (s *ownerScenarios) readBack(rng *rand.Rand, rec *claimRec, viaCLI bool) {
	s.w.h.mu.Lock()
	released := rec.released
	s.w.h.mu.Unlock()
	if !released {
		return
	}
	for range 2 {
		s.w.get(s.w.agents[rng.IntN(len(s.w.agents))], rec, viaCLI)
	}
}

func (s *ownerScenarios) agentNamed(name string) *agent {
	for _, a := range s.w.agents {
		if a.name == name {
			return a
		}
	}
	return nil
}

// inject starts a fault of kind on owner and returns what heals it and
// how long it is to hold; false when the faults it needs are taken.
func (s *ownerScenarios) inject(ctx context.Context, kind string, owner *agent, id string, rng *rand.Rand) (heal func(), d time.Duration, ok bool) {
	f := s.f
	// Frozen for at least 6 s and past a lease.
	freeze := func() time.Duration {
		lo := max(6*time.Second, s.lease+time.Second)
		return between(rng, lo, max(lo+time.Second, s.lease+3*time.Second))
	}
	switch kind {
	case ownerKill:
		if !f.takeOne("proc", owner.i) {
			return nil, 0, false
		}
		d = between(rng, 3*time.Second, 8*time.Second)
		f.logf("fault %s: %s holds %s; kill -9, down %s", kind, owner.name, id, d.Round(time.Millisecond))
		if err := owner.kill9(); err != nil {
			f.harnessErr(err)
		}
		heal = func() { f.restart(ctx, owner); f.give("proc", []int{owner.i}) }
	case ownerFreeze, ownerRelease:
		if !f.takeOne("proc", owner.i) {
			return nil, 0, false
		}
		d = freeze()
		f.logf("fault %s: %s holds %s; SIGSTOP for %s (lease %s)", kind, owner.name, id, d.Round(time.Millisecond), s.lease)
		owner.signal(syscall.SIGSTOP)
		heal = func() {
			owner.signal(syscall.SIGCONT)
			f.logf("heal  %s %s: SIGCONT", kind, owner.name)
			f.give("proc", []int{owner.i})
		}
	case ownerIsolate:
		if !f.takeOne("link", owner.i) {
			return nil, 0, false
		}
		d = between(rng, 4*time.Second, 8*time.Second)
		f.logf("fault %s: %s holds %s; link down for %s", kind, owner.name, id, d.Round(time.Millisecond))
		if err := f.nw.setLink(context.Background(), owner.i, false); err != nil {
			f.harnessErr(err)
		}
		heal = func() {
			if err := f.nw.setLink(context.Background(), owner.i, true); err != nil {
				f.harnessErr(err)
			}
			f.logf("heal  %s %s", kind, owner.name)
			f.give("link", []int{owner.i})
		}
	case ownerPartition:
		if !f.takeSplit() {
			return nil, 0, false
		}
		if !f.takeOne("proc", owner.i) {
			f.giveSplit()
			return nil, 0, false
		}
		minority, why := s.minority(owner, id, rng)
		var majority []int
		for _, a := range s.w.agents {
			if !slices.Contains(minority, a.i) {
				majority = append(majority, a.i)
			}
		}
		d = between(rng, 5*time.Second, 9*time.Second)
		f.logf("fault %s: %s holds %s; %v (%s) | %v for %s, then kill -9 and restart of %s", kind, owner.name, id, minority, why, majority, d.Round(time.Millisecond), owner.name)
		table, err := f.nw.partition(context.Background(), minority, majority)
		if err != nil {
			f.harnessErr(err)
		}
		heal = func() {
			if err == nil {
				if err := f.nw.delTable(context.Background(), table); err != nil {
					f.harnessErr(err)
				}
			}
			f.giveSplit()
			f.logf("heal  %s %v | %v; restarting %s", kind, minority, majority, owner.name)
			if err := owner.kill9(); err != nil {
				f.harnessErr(err)
			}
			f.restart(ctx, owner)
			f.give("proc", []int{owner.i})
		}
	}
	f.counted(kind)
	return heal, d, true
}

// minority is the small side of an owner partition: the owner and the
// name authority's most important member that is not the owner — the
// registry's leader by its log, else (half of the time) the ID's old
// directory home, else a registry voter — as long as the side stays a
// minority. why says which was chosen.
func (s *ownerScenarios) minority(owner *agent, id string, rng *rand.Rand) ([]int, string) {
	agents := s.w.agents
	if (len(agents)-1)/2 < 2 {
		return []int{owner.i}, "owner alone: too few agents for two"
	}
	var alive []string
	for _, a := range agents {
		alive = append(alive, a.name)
	}
	pick, why := "", ""
	if l := registryLeader(agents); l != "" && l != owner.name {
		pick, why = l, "registry leader by its log"
	}
	if h := oldHome(id, alive); pick == "" && h != owner.name && rng.IntN(2) == 0 {
		pick, why = h, "the ID's directory home"
	}
	if pick == "" {
		var voters []string
		for _, v := range registryVoters(agents) {
			if v != owner.name {
				voters = append(voters, v)
			}
		}
		if len(voters) > 0 {
			pick, why = voters[rng.IntN(len(voters))], "a registry voter"
		}
	}
	out := []int{owner.i}
	if a := s.agentNamed(pick); a != nil {
		out = append(out, a.i)
		why = pick + ", " + why
	}
	slices.Sort(out)
	return out, why
}
