package agent

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/vfio"
)

// The safety checks of the claim protocol, used by the fault tests: the
// invariants of docs/protocol.md read from every server's ledger and
// (simulated) kernel, and a porcupine model of one server's GPUs checked
// over the client-observed history of claims and releases.

// serverSnapshot is what the invariants need from one server: its ledger's
// claims and GPUs, and the driver each GPU is on in its kernel.
type serverSnapshot struct {
	node    string
	now     time.Time
	claims  []ledger.Claim
	gpus    []ledger.GPUState
	drivers map[string]string // PCI address → driver ("" unbound)
	// vfioIdle: free GPUs rest on vfio-pci (idle policy vfio-pci); otherwise
	// a free GPU must have left it.
	vfioIdle bool
}

func snapshot(t *testing.T, a *Agent) serverSnapshot {
	t.Helper()
	now := a.clk.Now()
	s := serverSnapshot{node: a.cfg.NodeName, now: now, claims: a.ledger.List(), gpus: a.ledger.GPUStates(now),
		drivers: map[string]string{}}
	s.vfioIdle = a.policy == vfio.IdleVFIO
	pci := vfio.New(a.sim.Kernel)
	for _, g := range s.gpus {
		d, err := pci.Device(g.GPU.Address)
		if err != nil {
			t.Errorf("%s: reading GPU %s from the kernel: %v", s.node, g.GPU.Address, err)
			continue
		}
		s.drivers[g.GPU.Address] = d.Driver
	}
	return s
}

// violations lists every broken invariant over the servers of a cluster,
// and how many claims and GPUs it looked at:
//   - a GPU is in at most one live claim;
//   - a claim ID is committed on at most one server (so all GPUs of a claim
//     are on one server: a ledger holds only its own server's GPUs), and
//     every GPU a claim names is in its server's inventory;
//   - every GPU of a committed claim is bound to vfio-pci;
//   - with swept set, no reservation outlives its lease, and (unless free
//     GPUs rest on vfio-pci) no free GPU is left on vfio-pci.
func violations(servers []serverSnapshot, swept bool) (claims, gpus int, out []string) {
	committedOn := map[string][]string{}
	for _, s := range servers {
		inventory := map[string]bool{}
		for _, g := range s.gpus {
			gpus++
			if !g.Missing {
				inventory[g.GPU.Address] = true
			}
		}
		holder := map[string]string{}
		for _, c := range s.claims {
			claims++
			if c.State == ledger.StateCommitted {
				committedOn[c.ID] = append(committedOn[c.ID], s.node)
				for _, addr := range c.GPUs {
					if d := s.drivers[addr]; d != vfio.DriverVFIO {
						out = append(out, fmt.Sprintf("%s: GPU %s of committed claim %s is on driver %q, not vfio-pci", s.node, addr, c.ID, d))
					}
				}
			}
			if swept && c.State == ledger.StateReserved && !c.Live(s.now) {
				out = append(out, fmt.Sprintf("%s: reservation %s outlived its lease (expired %s ago) after a sweep", s.node, c.ID, s.now.Sub(c.ExpiresAt)))
			}
			if !c.Live(s.now) {
				continue
			}
			for _, addr := range c.GPUs {
				if !inventory[addr] {
					out = append(out, fmt.Sprintf("%s: claim %s holds GPU %s that is not in the server's inventory", s.node, c.ID, addr))
				}
				if prev, dup := holder[addr]; dup {
					out = append(out, fmt.Sprintf("%s: GPU %s is in live claims %s and %s", s.node, addr, prev, c.ID))
				}
				holder[addr] = c.ID
			}
		}
		if swept && !s.vfioIdle {
			for _, g := range s.gpus {
				if g.Status == ledger.GPUFree && holder[g.GPU.Address] == "" && s.drivers[g.GPU.Address] == vfio.DriverVFIO {
					out = append(out, fmt.Sprintf("%s: free GPU %s is still on vfio-pci", s.node, g.GPU.Address))
				}
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(committedOn)) {
		if nodes := committedOn[id]; len(nodes) > 1 {
			out = append(out, fmt.Sprintf("claim %s is committed on %d servers: %v", id, len(nodes), nodes))
		}
	}
	return claims, gpus, out
}

// checkInvariants sweeps every agent's expired reservations, then fails the
// test on any broken invariant. Call it when no operation is in flight.
func checkInvariants(t *testing.T, agents ...*Agent) {
	t.Helper()
	var servers []serverSnapshot
	for _, a := range agents {
		a.Sweep(context.Background())
		servers = append(servers, snapshot(t, a))
	}
	claims, gpus, bad := violations(servers, true)
	for _, v := range bad {
		t.Errorf("invariant broken: %s", v)
	}
	t.Logf("invariants: %d servers, %d claims checked, %d GPUs checked, %d violations", len(servers), claims, gpus, len(bad))
}

// The porcupine model: one server's GPUs. The state is which GPUs each
// client-visible claim holds. A claim answered with GPUs is legal only when
// none of them is held by another claim (and a retry returns the same GPUs);
// "not available" is always legal, since a coordinator's view may be stale;
// an outcome the client never learned returns at infinity and may or may not
// have taken effect.

type claimInput struct {
	ID    string
	Model string
	N     int
}

type releaseInput struct{ ID string }

// Outcomes as the client saw them.
const (
	outOK           = "ok"
	outNotAvailable = "not_available"
	outNotFound     = "not_found"
	outUnknown      = "unknown" // error or timeout: may have taken effect
)

type opOutput struct {
	Kind string
	// For a claim: the GPUs, with their models, on Node. For an unknown
	// claim they are filled in afterwards when the claim turned out to be
	// committed (resolve); empty means it never held GPUs visibly.
	Node   string
	GPUs   []string
	Models []string
}

// modelState maps a claim ID to its GPUs, comma-joined and sorted. Step
// copies before it writes, so states can be shared.
type modelState map[string]string

func overlaps(held string, gpus []string) bool {
	for g := range strings.SplitSeq(held, ",") {
		if slices.Contains(gpus, g) {
			return true
		}
	}
	return false
}

func claimStep(s modelState, in claimInput, out opOutput) (bool, modelState) {
	gpus := slices.Sorted(slices.Values(out.GPUs))
	joined := strings.Join(gpus, ",")
	if len(gpus) != in.N || slices.ContainsFunc(out.Models, func(m string) bool { return m != in.Model }) {
		return false, s
	}
	if held, ok := s[in.ID]; ok {
		return held == joined, s // a retry returns the same claim
	}
	for id, held := range s {
		if id != in.ID && overlaps(held, gpus) {
			return false, s // a double allocation
		}
	}
	next := maps.Clone(s)
	next[in.ID] = joined
	return true, next
}

var gpuModel = porcupine.NondeterministicModel{
	Init: func() []any { return []any{modelState{}} },
	Step: func(state, input, output any) []any {
		s, out := state.(modelState), output.(opOutput)
		switch in := input.(type) {
		case claimInput:
			switch {
			case out.Kind == outNotAvailable:
				return []any{s}
			case out.Kind == outOK:
				if ok, next := claimStep(s, in, out); ok {
					return []any{next}
				}
				return nil
			case out.Kind == outUnknown && len(out.GPUs) == 0:
				return []any{s}
			case out.Kind == outUnknown:
				if ok, next := claimStep(s, in, out); ok {
					return []any{s, next}
				}
				return []any{s}
			}
		case releaseInput:
			_, held := s[in.ID]
			dropped := maps.Clone(s)
			delete(dropped, in.ID)
			switch out.Kind {
			case outOK:
				if held {
					return []any{dropped}
				}
				return nil
			case outNotFound:
				if held {
					return nil
				}
				return []any{s}
			case outUnknown:
				return []any{s, dropped}
			}
		}
		return nil
	},
	Equal: func(x, y any) bool { return maps.Equal(x.(modelState), y.(modelState)) },
	DescribeOperation: func(input, output any) string {
		out := output.(opOutput)
		switch in := input.(type) {
		case claimInput:
			return fmt.Sprintf("claim(%s, %dx %s) → %s %s %v", in.ID, in.N, in.Model, out.Kind, out.Node, out.GPUs)
		case releaseInput:
			return fmt.Sprintf("release(%s) → %s", in.ID, out.Kind)
		}
		return fmt.Sprint(input, output)
	},
}

// history records client-observed operations: call and return times, from
// one monotonic origin; an unknown outcome returns at infinity.
type history struct {
	mu     sync.Mutex
	origin time.Time
	ops    []porcupine.Operation
	// node of the granted claim, by ID: a release is filed under the server
	// that granted what it releases.
	grantedOn map[string]string
}

func newHistory() *history { return &history{origin: time.Now(), grantedOn: map[string]string{}} }

func (h *history) since() int64 { return int64(time.Since(h.origin)) }

// claim runs one claim through a coordinator and records it.
func (h *history) claim(ctx context.Context, client int, coord *Agent, id, model string, n int) (api.Claim, error) {
	in := claimInput{ID: id, Model: model, N: n}
	call := h.since()
	c, err := coord.Claim(ctx, id, api.ClaimRequest{GPUs: []api.Item{{Model: model, Count: n}}})
	h.record(client, in, call, h.since(), c, err)
	return c, err
}

// record files a claim that returned c or err at ret.
func (h *history) record(client int, in claimInput, call, ret int64, c api.Claim, err error) {
	out := opOutput{Kind: outOK}
	switch {
	case err == nil:
		out.Node = c.Node
		for _, g := range c.GPUs {
			out.GPUs = append(out.GPUs, g.PCIAddress)
			out.Models = append(out.Models, g.Model)
		}
	case api.IsCode(err, api.CodeNotAvailable):
		out.Kind = outNotAvailable
	default:
		out.Kind, ret = outUnknown, math.MaxInt64
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	if err == nil {
		h.grantedOn[in.ID] = c.Node
	}
}

// release releases one claim through a coordinator and records it.
func (h *history) release(ctx context.Context, client int, coord *Agent, id string) error {
	call := h.since()
	_, err := coord.Release(ctx, id)
	ret := h.since()
	out := opOutput{Kind: outOK}
	switch {
	case err == nil:
	case api.IsCode(err, api.CodeNotFound):
		out.Kind = outNotFound
	default:
		out.Kind, ret = outUnknown, math.MaxInt64
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	out.Node = h.grantedOn[id]
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: releaseInput{ID: id}, Call: call, Output: out, Return: ret})
	return err
}

// resolve fills in the claims whose outcome the client never learned: a
// claim committed in some server's ledger now took effect there, with
// those GPUs. Call it before anything releases them.
func (h *history) resolve(agents ...*Agent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, op := range h.ops {
		in, isClaim := op.Input.(claimInput)
		out := op.Output.(opOutput)
		if !isClaim || out.Kind != outUnknown {
			continue
		}
		for _, a := range agents {
			c, err := a.ledger.Get(in.ID)
			if err != nil || c.State != ledger.StateCommitted {
				continue
			}
			out.Node, out.GPUs, out.Models = a.cfg.NodeName, slices.Clone(c.GPUs), nil
			for _, addr := range c.GPUs {
				if g, ok := a.host.GPU(addr); ok {
					out.Models = append(out.Models, g.Model)
				}
			}
			h.ops[i].Output = out
			h.grantedOn[in.ID] = out.Node
			break
		}
	}
}

// partitions files each operation under the server that answered it: a
// granted claim (or one resolved afterwards) under its node, a release under
// the node that granted the claim. A claim answered "not available", or
// whose unknown outcome never showed up in any ledger, names no server and
// says nothing about any server's GPUs: such operations form a partition of
// their own (key ""), which is checked too (always legal by the model).
func (h *history) partitions() map[string][]porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string][]porcupine.Operation{}
	for _, op := range h.ops {
		node := op.Output.(opOutput).Node
		if r, ok := op.Input.(releaseInput); ok {
			node = h.grantedOn[r.ID]
		}
		out[node] = append(out[node], op)
	}
	return out
}

// checkLinearizable checks each server's history against the model and
// fails the test on a history no order of the operations explains.
func (h *history) checkLinearizable(t *testing.T) {
	t.Helper()
	model := gpuModel.ToModel()
	counts := map[string]int{}
	total := 0
	for _, node := range slices.Sorted(maps.Keys(h.partitions())) {
		ops := h.partitions()[node]
		for _, op := range ops {
			counts[op.Output.(opOutput).Kind]++
		}
		total += len(ops)
		res, info := porcupine.CheckOperationsVerbose(model, ops, 20*time.Second)
		name := node
		if name == "" {
			name = "(no server)"
		}
		switch res {
		case porcupine.Ok:
		case porcupine.Illegal:
			var lines []string
			for _, op := range ops {
				lines = append(lines, model.DescribeOperation(op.Input, op.Output))
			}
			_ = info
			t.Errorf("history of %s is not linearizable (a double allocation or a lost claim):\n  %s", name, strings.Join(lines, "\n  "))
		default:
			t.Errorf("checking the history of %s: porcupine gave up (%s)", name, res)
		}
	}
	t.Logf("porcupine: %d operations in %d partitions (%d ok, %d not_available, %d not_found, %d unknown), linearizable",
		total, len(h.partitions()), counts[outOK], counts[outNotAvailable], counts[outNotFound], counts[outUnknown])
}

// The checks must be able to fail: a model that accepts everything, or an
// invariant check that never fires, proves nothing.

func TestGPUModelRejectsDoubleAllocation(t *testing.T) {
	claim := func(id string, call, ret int64, kind string, gpus ...string) porcupine.Operation {
		models := make([]string, len(gpus))
		for i := range models {
			models[i] = "L40S"
		}
		return porcupine.Operation{Input: claimInput{ID: id, Model: "L40S", N: 1}, Call: call, Return: ret,
			Output: opOutput{Kind: kind, GPUs: gpus, Models: models}}
	}
	release := func(id string, call, ret int64, kind string) porcupine.Operation {
		return porcupine.Operation{Input: releaseInput{ID: id}, Call: call, Return: ret, Output: opOutput{Kind: kind}}
	}
	const inf = math.MaxInt64
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		want bool
	}{
		{"two claims, one GPU", []porcupine.Operation{claim("a", 0, 10, outOK, "g0"), claim("b", 20, 30, outOK, "g0")}, false},
		{"concurrent claims, one GPU", []porcupine.Operation{claim("a", 0, 10, outOK, "g0"), claim("b", 5, 15, outOK, "g0")}, false},
		{"release in between", []porcupine.Operation{claim("a", 0, 10, outOK, "g0"), release("a", 11, 12, outOK), claim("b", 20, 30, outOK, "g0")}, true},
		{"release after the second claim", []porcupine.Operation{claim("a", 0, 10, outOK, "g0"), claim("b", 20, 30, outOK, "g0"), release("a", 40, 50, outOK)}, false},
		{"concurrent release", []porcupine.Operation{claim("a", 0, 10, outOK, "g0"), release("a", 11, 40, outOK), claim("b", 20, 30, outOK, "g0")}, true},
		{"not available is always legal", []porcupine.Operation{claim("a", 0, 10, outNotAvailable), claim("b", 20, 30, outOK, "g0"), claim("c", 40, 50, outNotAvailable)}, true},
		{"retry returns the same GPU", []porcupine.Operation{claim("a", 0, 10, outOK, "g0"), claim("a", 20, 30, outOK, "g0")}, true},
		{"retry returns another GPU", []porcupine.Operation{claim("a", 0, 10, outOK, "g0"), claim("a", 20, 30, outOK, "g1")}, false},
		{"unknown outcome that took effect", []porcupine.Operation{claim("a", 0, inf, outUnknown, "g0"), claim("b", 20, 30, outOK, "g0")}, true},
		{"unknown outcome, then a release", []porcupine.Operation{claim("a", 0, 10, outOK, "g0"), release("a", 11, inf, outUnknown), claim("b", 20, 30, outOK, "g0")}, true},
		{"release of a claim never granted", []porcupine.Operation{release("a", 0, 10, outOK)}, false},
		{"not found while held", []porcupine.Operation{claim("a", 0, 10, outOK, "g0"), release("a", 20, 30, outNotFound)}, false},
	} {
		if got := porcupine.CheckOperations(gpuModel.ToModel(), tc.ops); got != tc.want {
			t.Errorf("%s: linearizable = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestViolationsFindsBrokenInvariants(t *testing.T) {
	now := time.Now()
	inv := func(addrs ...string) []ledger.GPUState {
		var out []ledger.GPUState
		for _, a := range addrs {
			out = append(out, ledger.GPUState{GPU: ledger.GPU{Address: a, Model: "L40S", Healthy: true}, Status: ledger.GPUClaimed})
		}
		return out
	}
	committed := func(id string, gpus ...string) ledger.Claim {
		return ledger.Claim{ID: id, State: ledger.StateCommitted, GPUs: gpus}
	}
	good := serverSnapshot{node: "a", now: now, claims: []ledger.Claim{committed("vm-1", "g0")}, gpus: inv("g0", "g1"),
		drivers: map[string]string{"g0": vfio.DriverVFIO, "g1": "nvidia"}}
	if _, _, v := violations([]serverSnapshot{good}, true); len(v) != 0 {
		t.Fatalf("a healthy server: %v", v)
	}
	for _, tc := range []struct {
		name string
		s    []serverSnapshot
		want string
	}{
		{"one GPU in two claims", []serverSnapshot{{node: "a", now: now, gpus: inv("g0"), drivers: map[string]string{"g0": vfio.DriverVFIO},
			claims: []ledger.Claim{committed("vm-1", "g0"), committed("vm-2", "g0")}}}, "in live claims vm-1 and vm-2"},
		{"a claim on two servers", []serverSnapshot{good, {node: "b", now: now, gpus: inv("g0"), drivers: map[string]string{"g0": vfio.DriverVFIO},
			claims: []ledger.Claim{committed("vm-1", "g0")}}}, "committed on 2 servers"},
		{"a committed GPU on nvidia", []serverSnapshot{{node: "a", now: now, gpus: inv("g0"), drivers: map[string]string{"g0": "nvidia"},
			claims: []ledger.Claim{committed("vm-1", "g0")}}}, "not vfio-pci"},
		{"a reservation past its lease", []serverSnapshot{{node: "a", now: now, gpus: inv("g0"), drivers: map[string]string{"g0": vfio.DriverVFIO},
			claims: []ledger.Claim{{ID: "vm-1", State: ledger.StateReserved, GPUs: []string{"g0"}, ExpiresAt: now.Add(-time.Second)}}}}, "outlived its lease"},
		{"a free GPU left on vfio-pci", []serverSnapshot{{node: "a", now: now, drivers: map[string]string{"g0": vfio.DriverVFIO},
			gpus: []ledger.GPUState{{GPU: ledger.GPU{Address: "g0"}, Status: ledger.GPUFree}}}}, "still on vfio-pci"},
	} {
		_, _, v := violations(tc.s, true)
		if !slices.ContainsFunc(v, func(s string) bool { return strings.Contains(s, tc.want) }) {
			t.Errorf("%s: violations %v, want one saying %q", tc.name, v, tc.want)
		}
	}
}
