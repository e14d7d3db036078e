package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
)

// The models of the simulated servers, as the catalog names them.
const (
	h100  = "NVIDIA H100 80GB"
	l40s  = "NVIDIA L40S"
	a100  = "NVIDIA A100 80GB"
	rtx   = "NVIDIA RTX 6000 Pro"
	notAv = "The following GPUs are not available: "
)

// exitNotAvailable is the CLI's exit code when no server can hold a request.
const exitNotAvailable = 3

// scenario is the scripted walk through the platform. Every step runs the
// gpuherd CLI, as a user would, and checks the facts that matter through
// the agents' API.
type scenario struct {
	p *platform
	t *transcript
	// The servers by what they hold; agent N in the transcript is the
	// N-th of profiles.
	dgx, l40s, a100, rtx *server
	step                 int
}

func newScenario(p *platform) *scenario {
	return &scenario{p: p, t: p.t, dgx: p.servers[0], l40s: p.servers[1], a100: p.servers[2], rtx: p.servers[3]}
}

// play runs every step in order and stops at the first that misbehaves.
func (sc *scenario) play(ctx context.Context) error {
	steps := []struct {
		title string
		run   func(context.Context) error
	}{
		{"Certificates for mutual TLS and the gossip key", sc.p.secrets},
		{"Four agents on simulated servers, one gossip cluster", sc.startAgents},
		{"The platform as any agent sees it", sc.overview},
		{"Claims land on the server that holds the GPUs", sc.spread},
		{"A model runs out: Unavailable everywhere", sc.runOut},
		{"Requests no single server can hold", sc.notAvailable},
		{"A VM stops and restarts on its old server", sc.restart},
		{"Resize in place", sc.resizeInPlace},
		{"Kubernetes node groups", sc.groups},
		{"Resize that moves the VM", sc.resizeMove},
		{"Draining a whole server", sc.drain},
		{"Every claim of the platform, from one agent", sc.allClaims},
	}
	for _, st := range steps {
		sc.step++
		sc.t.heading(sc.step, st.title)
		if err := st.run(ctx); err != nil {
			// A command that failed because its agent died says less than
			// the death itself.
			if dead := sc.p.deadAgent(); dead != nil && !errors.Is(err, errAgentDied) {
				err = fmt.Errorf("%w; %w", err, dead)
			}
			return fmt.Errorf("step %d (%s): %w", sc.step, st.title, err)
		}
	}
	return nil
}

// cli runs `gpuherd --socket S args...` against s's agent.
func (sc *scenario) cli(ctx context.Context, s *server, args ...string) (result, error) {
	return sc.t.run(ctx, append([]string{"--socket", s.socket}, args...)...)
}

// ok runs a command that must succeed.
func (sc *scenario) ok(ctx context.Context, s *server, args ...string) error {
	r, err := sc.cli(ctx, s, args...)
	if err != nil {
		return err
	}
	return r.wantOK()
}

// fails runs a command that must exit with code and say every one of texts.
func (sc *scenario) fails(ctx context.Context, s *server, code int, texts []string, args ...string) error {
	r, err := sc.cli(ctx, s, args...)
	if err != nil {
		return err
	}
	return r.wantFail(code, texts...)
}

// settle waits, silently, until gossip has carried the last change to every
// agent: the next step may go through any of them.
func (sc *scenario) settle(ctx context.Context) error {
	_, err := sc.p.converge(ctx)
	return err
}

// claimOn checks that claim id is held on server node with n GPUs of model.
func (sc *scenario) claimOn(ctx context.Context, id, node, model string, n int) error {
	c, err := sc.dgx.client.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("claim %s: %w", id, err)
	}
	if c.Node != node {
		return fmt.Errorf("claim %s is on %s, want %s", id, c.Node, node)
	}
	if c.State != api.StateClaimed {
		return fmt.Errorf("claim %s is %s, want %s", id, c.State, api.StateClaimed)
	}
	got := 0
	for _, g := range c.GPUs {
		if g.Model != model {
			return fmt.Errorf("claim %s holds a %s, want only %s", id, g.Model, model)
		}
		got++
	}
	if got != n {
		return fmt.Errorf("claim %s holds %d GPU(s), want %d", id, got, n)
	}
	return nil
}

// available returns whether each model shows as Available through s.
func (sc *scenario) available(ctx context.Context, s *server) (map[string]bool, error) {
	av, err := s.client.Availability(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, m := range av.Models {
		out[m.Model] = m.Available
	}
	return out, nil
}

// wantAvailable checks what s shows for each model of want.
func (sc *scenario) wantAvailable(ctx context.Context, s *server, want map[string]bool) error {
	got, err := sc.available(ctx, s)
	if err != nil {
		return err
	}
	for m, w := range want {
		if got[m] != w {
			return fmt.Errorf("%s shows %s as %s, want %s", s.name, m, availWord(got[m]), availWord(w))
		}
	}
	return nil
}

func availWord(b bool) string {
	if b {
		return "Available"
	}
	return "Unavailable"
}

func (sc *scenario) startAgents(ctx context.Context) error {
	sc.t.say("Each agent runs on simulated hardware (the fake kernel and NVML mocks): agent 1 on a DGX H100")
	sc.t.say("(8x H100 80GB), agent 2 on 4x L40S, agent 3 on 4x A100 80GB PCIe, agent 4 on 2x RTX 6000 Pro.")
	sc.t.say("Gossip is encrypted with the shared key; claims go between agents over mutual TLS.")
	return sc.p.start(ctx)
}

func (sc *scenario) overview(ctx context.Context) error {
	if err := sc.settle(ctx); err != nil {
		return err
	}
	if err := sc.ok(ctx, sc.dgx, "members"); err != nil {
		return err
	}
	sc.t.say("Availability lists every model of the platform, from any agent (here agent 3):")
	if err := sc.ok(ctx, sc.a100, "availability"); err != nil {
		return err
	}
	av, err := sc.a100.client.Availability(ctx)
	if err != nil {
		return err
	}
	want := map[string]int{h100: 8, l40s: 4, a100: 4, rtx: 2}
	for _, m := range av.Models {
		if n, ok := want[m.Model]; ok {
			if !m.Available || m.Total != n || m.Free != n {
				return fmt.Errorf("%s: available=%v free=%d total=%d, want Available with %d of %d free", m.Model, m.Available, m.Free, m.Total, n, n)
			}
			delete(want, m.Model)
		}
	}
	if len(want) > 0 {
		return fmt.Errorf("availability lacks %v", want)
	}
	return nil
}

func (sc *scenario) spread(ctx context.Context) error {
	sc.t.say("Any agent can take a claim: it picks a server that holds all of the VM's GPUs and asks that")
	sc.t.say("server, which alone decides. vm-1 asks agent 1, whose own server has H100s:")
	if err := sc.ok(ctx, sc.dgx, "claim", "vm-1", "--gpu", "H100 80GB:4"); err != nil {
		return err
	}
	if err := sc.claimOn(ctx, "vm-1", sc.dgx.name, h100, 4); err != nil {
		return err
	}
	sc.t.say("vm-2 asks agent 4 (RTX 6000 Pro only) for L40S: the claim lands on " + sc.l40s.name + ":")
	if err := sc.ok(ctx, sc.rtx, "claim", "vm-2", "--gpu", "L40S:2", "--label", "tenant=acme"); err != nil {
		return err
	}
	if err := sc.claimOn(ctx, "vm-2", sc.l40s.name, l40s, 2); err != nil {
		return err
	}
	if err := sc.settle(ctx); err != nil {
		return err
	}
	sc.t.say("vm-3 takes every A100 of the platform, through agent 2:")
	if err := sc.ok(ctx, sc.l40s, "claim", "vm-3", "--gpu", "A100 80GB:4"); err != nil {
		return err
	}
	return sc.claimOn(ctx, "vm-3", sc.a100.name, a100, 4)
}

func (sc *scenario) runOut(ctx context.Context) error {
	sc.t.say(fmt.Sprintf("Agent 4 learns through gossip that %s has no free A100 left. The demo polls", sc.a100.name))
	poll := []string{"--socket", sc.rtx.socket, "-o", "json", "availability"}
	sc.t.say("`" + sc.t.format(poll) + "` until A100 80GB shows as unavailable:")
	begin := time.Now()
	err := sc.p.poll(ctx, convergeTimeout, func(ctx context.Context) (bool, error) {
		r, err := sc.t.quiet(ctx, poll...)
		if err != nil {
			return false, err
		}
		if err := r.wantOK(); err != nil {
			return false, err
		}
		var av api.Availability
		if err := json.Unmarshal([]byte(r.out), &av); err != nil {
			return false, fmt.Errorf("decoding `%s`: %w", r.line, err)
		}
		for _, m := range av.Models {
			if m.Model == a100 {
				return !m.Available, nil
			}
		}
		return false, fmt.Errorf("`%s` does not list %s", r.line, a100)
	})
	if err != nil {
		return fmt.Errorf("agent 4 never showed %s as unavailable: %w", a100, err)
	}
	sc.t.say(fmt.Sprintf("Visible on agent 4 %s after the claim was granted.", time.Since(begin).Round(time.Millisecond)))
	if err := sc.ok(ctx, sc.rtx, "availability"); err != nil {
		return err
	}
	if err := sc.wantAvailable(ctx, sc.rtx, map[string]bool{a100: false, h100: true, l40s: true, rtx: true}); err != nil {
		return err
	}
	sc.t.say("vm-4 takes both RTX 6000 Pro, through agent 3:")
	if err := sc.ok(ctx, sc.a100, "claim", "vm-4", "--gpu", "RTX 6000 Pro:2"); err != nil {
		return err
	}
	if err := sc.claimOn(ctx, "vm-4", sc.rtx.name, rtx, 2); err != nil {
		return err
	}
	return sc.settle(ctx)
}

func (sc *scenario) notAvailable(ctx context.Context) error {
	sc.t.say("Two L40S are free, on one server. Asking for four fails with exit code 3, and the answer")
	sc.t.say("says what would fit instead:")
	if err := sc.fails(ctx, sc.dgx, exitNotAvailable, []string{notAv + "4x " + l40s, "Select an alternative GPU"},
		"claim", "vm-5", "--gpu", "L40S:4"); err != nil {
		return err
	}
	sc.t.say("H100 and L40S are both Available, but no server has both: a VM's GPUs are all on one server.")
	if err := sc.wantAvailable(ctx, sc.l40s, map[string]bool{h100: true, l40s: true}); err != nil {
		return err
	}
	if err := sc.fails(ctx, sc.l40s, exitNotAvailable, []string{notAv},
		"claim", "vm-5", "--gpu", "H100 80GB:1", "--gpu", "L40S:1"); err != nil {
		return err
	}
	if _, err := sc.dgx.client.Get(ctx, "vm-5"); err == nil {
		return fmt.Errorf("vm-5 exists after two refused claims")
	}
	return nil
}

func (sc *scenario) restart(ctx context.Context) error {
	old := sc.l40s.name
	sc.t.say("vm-2 stops: its GPUs are released (through any agent).")
	if err := sc.ok(ctx, sc.dgx, "release", "vm-2"); err != nil {
		return err
	}
	if err := sc.settle(ctx); err != nil {
		return err
	}
	sc.t.say("Meanwhile vm-6 takes three of the four L40S...")
	if err := sc.ok(ctx, sc.dgx, "claim", "vm-6", "--gpu", "L40S:3"); err != nil {
		return err
	}
	if err := sc.settle(ctx); err != nil {
		return err
	}
	sc.t.say("...so vm-2 cannot restart with its two L40S; the answer offers alternatives:")
	if err := sc.fails(ctx, sc.rtx, exitNotAvailable, []string{notAv + "2x " + l40s, "Select an alternative GPU"},
		"claim", "vm-2", "--gpu", "L40S:2", "--prefer-node", old); err != nil {
		return err
	}
	sc.t.say("vm-6 goes away; vm-2 restarts on its old server:")
	if err := sc.ok(ctx, sc.dgx, "release", "vm-6"); err != nil {
		return err
	}
	if err := sc.settle(ctx); err != nil {
		return err
	}
	if err := sc.ok(ctx, sc.rtx, "claim", "vm-2", "--gpu", "L40S:2", "--prefer-node", old); err != nil {
		return err
	}
	if err := sc.claimOn(ctx, "vm-2", old, l40s, 2); err != nil {
		return err
	}
	return sc.settle(ctx)
}

func (sc *scenario) resizeInPlace(ctx context.Context) error {
	before, err := sc.dgx.client.Get(ctx, "vm-1")
	if err != nil {
		return err
	}
	sc.t.say(fmt.Sprintf("vm-1 grows from 4 to 6 H100; %s has room, so the claim changes in place:", before.Node))
	if err := sc.ok(ctx, sc.l40s, "resize", "vm-1", "--gpu", "H100 80GB:6"); err != nil {
		return err
	}
	if err := sc.claimOn(ctx, "vm-1", before.Node, h100, 6); err != nil {
		return err
	}
	return sc.settle(ctx)
}

func (sc *scenario) groups(ctx context.Context) error {
	sc.t.say("A node group of two Kubernetes workers, one L40S each; each node's GPUs on one server:")
	if err := sc.ok(ctx, sc.a100, "group", "create", "pool", "--nodes", "2", "--gpu", "L40S:1"); err != nil {
		return err
	}
	g, err := sc.a100.client.GetGroup(ctx, "pool")
	if err != nil {
		return err
	}
	if len(g.Claims) != 2 {
		return fmt.Errorf("group pool has %d node claims, want 2", len(g.Claims))
	}
	for _, c := range g.Claims {
		if err := sc.claimOn(ctx, c.ID, sc.l40s.name, l40s, 1); err != nil {
			return err
		}
	}
	if err := sc.settle(ctx); err != nil {
		return err
	}
	if err := sc.ok(ctx, sc.dgx, "group", "get", "pool"); err != nil {
		return err
	}
	sc.t.say("Every node of the group switches to one H100 (they move to " + sc.dgx.name + "):")
	if err := sc.ok(ctx, sc.rtx, "group", "resize", "pool", "--gpu", "H100 80GB:1"); err != nil {
		return err
	}
	for _, c := range g.Claims {
		if err := sc.claimOn(ctx, c.ID, sc.dgx.name, h100, 1); err != nil {
			return err
		}
	}
	if err := sc.settle(ctx); err != nil {
		return err
	}
	sc.t.say("A group created without GPUs can never get one:")
	if err := sc.ok(ctx, sc.l40s, "group", "create", "cpu-only", "--nodes", "2"); err != nil {
		return err
	}
	r, err := sc.cli(ctx, sc.l40s, "group", "resize", "cpu-only", "--gpu", "L40S:1")
	if err != nil {
		return err
	}
	if r.code == 0 || !strings.Contains(r.out, "without GPUs") {
		return fmt.Errorf("`%s` exited %d, want a refusal naming a group without GPUs: %s", r.line, r.code, strings.TrimSpace(r.out))
	}
	return sc.ok(ctx, sc.l40s, "group", "delete", "cpu-only")
}

func (sc *scenario) resizeMove(ctx context.Context) error {
	sc.t.say(fmt.Sprintf("vm-1 changes model, to two L40S: %s has none, so the claim moves to %s", sc.dgx.name, sc.l40s.name))
	sc.t.say("(the VM restarts anyway). The new GPUs are reserved before the old ones are released.")
	if err := sc.ok(ctx, sc.a100, "resize", "vm-1", "--gpu", "L40S:2"); err != nil {
		return err
	}
	if err := sc.claimOn(ctx, "vm-1", sc.l40s.name, l40s, 2); err != nil {
		return err
	}
	return sc.settle(ctx)
}

func (sc *scenario) drain(ctx context.Context) error {
	sc.t.say(fmt.Sprintf("%s goes into maintenance: no new claims there; the group's two nodes stay.", sc.dgx.name))
	if err := sc.ok(ctx, sc.dgx, "drain", "--server", "--reason", "firmware upgrade"); err != nil {
		return err
	}
	if err := sc.settle(ctx); err != nil {
		return err
	}
	if err := sc.ok(ctx, sc.l40s, "members"); err != nil {
		return err
	}
	sc.t.say("The only H100 server is drained, so H100 is Unavailable on every agent:")
	if err := sc.ok(ctx, sc.l40s, "availability"); err != nil {
		return err
	}
	if err := sc.wantAvailable(ctx, sc.l40s, map[string]bool{h100: false}); err != nil {
		return err
	}
	if err := sc.fails(ctx, sc.l40s, exitNotAvailable, []string{notAv + "1x " + h100},
		"claim", "vm-7", "--gpu", "H100 80GB:1"); err != nil {
		return err
	}
	for _, id := range []string{"pool.node-0", "pool.node-1"} {
		if err := sc.claimOn(ctx, id, sc.dgx.name, h100, 1); err != nil {
			return fmt.Errorf("after the drain: %w", err)
		}
	}
	sc.t.say("Maintenance done:")
	if err := sc.ok(ctx, sc.dgx, "undrain", "--server"); err != nil {
		return err
	}
	if err := sc.settle(ctx); err != nil {
		return err
	}
	if err := sc.ok(ctx, sc.l40s, "availability"); err != nil {
		return err
	}
	return sc.wantAvailable(ctx, sc.l40s, map[string]bool{h100: true})
}

func (sc *scenario) allClaims(ctx context.Context) error {
	sc.t.say("`claims` asks every server of the platform and lists what each holds:")
	if err := sc.ok(ctx, sc.rtx, "claims"); err != nil {
		return err
	}
	cls, err := sc.rtx.client.Claims(ctx)
	if err != nil {
		return err
	}
	want := map[string]string{
		"vm-1":        sc.l40s.name,
		"vm-2":        sc.l40s.name,
		"vm-3":        sc.a100.name,
		"vm-4":        sc.rtx.name,
		"pool.node-0": sc.dgx.name,
		"pool.node-1": sc.dgx.name,
	}
	if cls.Partial {
		return fmt.Errorf("claims: partial list, no answer from %+v", cls.Unanswered)
	}
	var got []string
	for _, c := range cls.Claims {
		got = append(got, c.ID+"@"+c.Node)
	}
	var exp []string
	for id, node := range want {
		exp = append(exp, id+"@"+node)
	}
	slices.Sort(got)
	slices.Sort(exp)
	if !slices.Equal(got, exp) {
		return fmt.Errorf("the platform's claims are %v, want %v", got, exp)
	}
	return nil
}
