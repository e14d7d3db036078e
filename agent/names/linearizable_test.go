package names

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// The porcupine model of one name's register. The registry picks tokens,
// so the model checks them instead of predicting them: a grant's token is
// above every token known before it, and every later answer about the
// grant carries the same one. A grant whose answer was lost has an
// unknown token (0) until some answer shows it.
type nameModelState struct {
	Held      bool
	Req       string
	Token     uint64
	Confirmed bool
	Owner     string
	Last      uint64
}

type nameIn struct {
	Op    Op
	Name  string
	Req   string
	Token uint64
	Owner string
}

type nameOut struct {
	Unknown bool // unavailable: the operation may or may not have happened
	Code    Code
	Token   uint64
	Req     string
	Owner   string
	State   State
}

// learn checks a token an answer shows for the current grant and fixes it
// if the model did not know it yet.
func learn(s nameModelState, t uint64) (nameModelState, bool) {
	if s.Token == 0 {
		if t <= s.Last {
			return s, false
		}
		s.Token, s.Last = t, t
		return s, true
	}
	return s, t == s.Token
}

func (s nameModelState) describes(out nameOut) bool {
	want := StatePending
	if s.Confirmed {
		want = StateHeld
		if out.Owner != s.Owner {
			return false
		}
	}
	return out.State == want && out.Req == s.Req
}

// stepName returns the state after in with answer out, and whether that
// answer is possible from s. For an unknown answer it is the state had the
// operation happened.
func stepName(s nameModelState, in nameIn, out nameOut) (nameModelState, bool) {
	code := func(c Code) bool { return out.Unknown || out.Code == c }
	switch in.Op {
	case OpAcquire:
		switch {
		case !s.Held:
			if !code(CodeOK) {
				return s, false
			}
			n := nameModelState{Held: true, Req: in.Req, Last: s.Last}
			if out.Unknown {
				return n, true
			}
			if out.Req != in.Req || out.State != StatePending {
				return s, false
			}
			return learn(n, out.Token)
		case s.Req == in.Req:
			if !code(CodeSame) {
				return s, false
			}
			if out.Unknown {
				return s, true
			}
			if !s.describes(out) {
				return s, false
			}
			return learn(s, out.Token)
		default:
			return s, code(CodeConflict) && (out.Unknown || out.Req == s.Req)
		}
	case OpConfirm:
		switch {
		case !s.Held:
			return s, code(CodeNotFound)
		case s.Token != in.Token:
			return s, code(CodeStale)
		case !s.Confirmed:
			if !code(CodeOK) {
				return s, false
			}
			s.Confirmed, s.Owner = true, in.Owner
			return s, out.Unknown || s.describes(out)
		case s.Owner == in.Owner:
			// Confirm answers a repeat as it answered the first: the
			// record, no error.
			return s, code(CodeOK) && (out.Unknown || s.describes(out))
		default:
			return s, code(CodeConflict)
		}
	case OpRelease:
		switch {
		case !s.Held:
			return s, code(CodeNotFound)
		case s.Token != in.Token:
			return s, code(CodeStale)
		}
		return nameModelState{Last: s.Last}, code(CodeOK)
	case OpLookup:
		if out.Unknown {
			return s, true
		}
		if !s.Held {
			return s, out.Code == CodeNotFound
		}
		if out.Code != CodeOK || !s.describes(out) {
			return s, false
		}
		return learn(s, out.Token)
	}
	return s, false
}

var nameModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range h {
			n := op.Input.(nameIn).Name
			if _, ok := by[n]; !ok {
				order = append(order, n)
			}
			by[n] = append(by[n], op)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, n := range order {
			out = append(out, by[n])
		}
		return out
	},
	Init: func() []any { return []any{nameModelState{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(nameModelState), input.(nameIn), output.(nameOut)
		next, ok := stepName(s, in, out)
		switch {
		case out.Unknown && ok && next != s:
			return []any{s, next}
		case out.Unknown:
			return []any{s}
		case ok:
			return []any{next}
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		return fmt.Sprintf("%+v -> %+v", input, output)
	},
}

// The model itself must refuse what a broken registry would answer.
func TestNameModelRefusesTwoGrants(t *testing.T) {
	m := nameModel.ToModel()
	op := func(call, ret int64, in nameIn, out nameOut) porcupine.Operation {
		return porcupine.Operation{Input: in, Output: out, Call: call, Return: ret}
	}
	ok := []porcupine.Operation{
		op(0, 10, nameIn{Op: OpAcquire, Name: "vm", Req: "r1"}, nameOut{Code: CodeOK, Token: 5, Req: "r1", State: StatePending}),
		op(20, 30, nameIn{Op: OpAcquire, Name: "vm", Req: "r2"}, nameOut{Code: CodeConflict, Req: "r1"}),
		op(40, 50, nameIn{Op: OpRelease, Name: "vm", Token: 5}, nameOut{Code: CodeOK}),
		op(60, 70, nameIn{Op: OpAcquire, Name: "vm", Req: "r2"}, nameOut{Code: CodeOK, Token: 9, Req: "r2", State: StatePending}),
	}
	if !porcupine.CheckOperations(m, ok) {
		t.Fatal("a correct history was refused")
	}
	bad := map[string][]porcupine.Operation{
		"two grants": {
			op(0, 10, nameIn{Op: OpAcquire, Name: "vm", Req: "r1"}, nameOut{Code: CodeOK, Token: 5, Req: "r1", State: StatePending}),
			op(20, 30, nameIn{Op: OpAcquire, Name: "vm", Req: "r2"}, nameOut{Code: CodeOK, Token: 6, Req: "r2", State: StatePending}),
		},
		"token going back": {
			op(0, 10, nameIn{Op: OpAcquire, Name: "vm", Req: "r1"}, nameOut{Code: CodeOK, Token: 5, Req: "r1", State: StatePending}),
			op(20, 30, nameIn{Op: OpRelease, Name: "vm", Token: 5}, nameOut{Code: CodeOK}),
			op(40, 50, nameIn{Op: OpAcquire, Name: "vm", Req: "r2"}, nameOut{Code: CodeOK, Token: 4, Req: "r2", State: StatePending}),
		},
		"retry with another token": {
			op(0, 10, nameIn{Op: OpAcquire, Name: "vm", Req: "r1"}, nameOut{Code: CodeOK, Token: 5, Req: "r1", State: StatePending}),
			op(20, 30, nameIn{Op: OpAcquire, Name: "vm", Req: "r1"}, nameOut{Code: CodeSame, Token: 7, Req: "r1", State: StatePending}),
		},
		"stale read": {
			op(0, 10, nameIn{Op: OpAcquire, Name: "vm", Req: "r1"}, nameOut{Code: CodeOK, Token: 5, Req: "r1", State: StatePending}),
			op(20, 30, nameIn{Op: OpLookup, Name: "vm"}, nameOut{Code: CodeNotFound}),
		},
		"old token confirmed": {
			op(0, 10, nameIn{Op: OpAcquire, Name: "vm", Req: "r1"}, nameOut{Code: CodeOK, Token: 5, Req: "r1", State: StatePending}),
			op(20, 30, nameIn{Op: OpRelease, Name: "vm", Token: 5}, nameOut{Code: CodeOK}),
			op(40, 50, nameIn{Op: OpAcquire, Name: "vm", Req: "r2"}, nameOut{Unknown: true}),
			op(60, 70, nameIn{Op: OpConfirm, Name: "vm", Token: 5, Owner: "node-b"}, nameOut{Code: CodeOK, Req: "r1", Owner: "node-b", State: StateHeld}),
		},
	}
	for name, h := range bad {
		if porcupine.CheckOperations(m, h) {
			t.Errorf("%s: accepted", name)
		}
	}
}

func seedCount(t *testing.T) int {
	if s := os.Getenv("NAMES_SEEDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("NAMES_SEEDS=%q: %v", s, err)
		}
		return n
	}
	if testing.Short() {
		return 2
	}
	return 6
}

// Histories of acquire, confirm, release and lookup through random agents
// of a 3-voter cluster while voters are killed, restarted and partitioned
// (leader or not) are linearizable for the name register. NAMES_SEEDS
// sets how many seeds run; NAMES_SEED runs one.
func TestClusterLinearizableUnderFaults(t *testing.T) {
	seeds := make([]uint64, 0)
	if s := os.Getenv("NAMES_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, n)
	} else {
		for i := range seedCount(t) {
			seeds = append(seeds, uint64(i+1))
		}
	}
	// Each schedule mostly waits (elections, holds, heals): they run side
	// by side (newCluster), -parallel at a time.
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runFaultSchedule(t, seed) })
	}
}

func runFaultSchedule(t *testing.T, seed uint64) {
	c := newCluster(t, 3, []string{"node-x"}, withHold(400*time.Millisecond))
	c.leader()
	rng := rand.New(rand.NewPCG(seed, 0x6e616d6573))
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }

	var (
		mu            sync.Mutex
		history       []porcupine.Operation
		faults        []string
		answeredSoFar int
	)
	names := []string{"vm-0", "vm-1", "vm-2"}
	const workers = 4
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wrng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			tokens := map[string]uint64{}
			for {
				select {
				case <-stop:
					return
				default:
				}
				in := pickOp(wrng, w, names, tokens)
				op := callOp(t, c, wrng, in, now)
				if out := op.Output.(nameOut); !out.Unknown && (out.Code == CodeOK || out.Code == CodeSame) && in.Op == OpAcquire {
					tokens[in.Name] = out.Token
				}
				mu.Lock()
				history = append(history, op)
				if !op.Output.(nameOut).Unknown {
					answeredSoFar++
				}
				mu.Unlock()
			}
		}()
	}

	// The fault schedule, drawn from the seed.
	voters := []string{"node-a", "node-b", "node-c"}
	for range 8 {
		time.Sleep(time.Duration(100+rng.IntN(200)) * time.Millisecond)
		var dead []string
		for _, v := range voters {
			if c.reg(v) == nil {
				dead = append(dead, v)
			}
		}
		switch f := rng.IntN(5); {
		case len(dead) > 0 && f < 2:
			v := dead[rng.IntN(len(dead))]
			c.start(v)
			faults = append(faults, "restart "+v)
		case f == 0:
			v := voters[rng.IntN(len(voters))]
			c.kill(v)
			faults = append(faults, "kill "+v)
		case f == 1:
			l := leaderNow(c, voters)
			if l != "" && len(dead) == 0 {
				c.kill(l)
				faults = append(faults, "kill leader "+l)
			}
		case f == 2:
			l := leaderNow(c, voters)
			if l == "" {
				l = voters[rng.IntN(len(voters))]
			}
			c.partition([]string{l})
			faults = append(faults, "partition "+l)
		case f == 3:
			v := voters[rng.IntN(len(voters))]
			c.partition([]string{v, "node-x"})
			faults = append(faults, "partition "+v+"+node-x")
		default:
			c.heal()
			faults = append(faults, "heal")
		}
	}
	// Heal, restart, and read every name once more through the leader.
	c.heal()
	for _, v := range voters {
		if c.reg(v) == nil {
			c.start(v)
		}
	}
	// The workers go on in the healed cluster until it has answered
	// enough for the history to say something, however slow the machine
	// made the faulty part.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		n := answeredSoFar
		mu.Unlock()
		if n >= minAnswered {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("seed %d: the healed cluster answered only %d operations in 20 s", seed, n)
		}
	}
	close(stop)
	wg.Wait()
	c.leader()
	for _, n := range names {
		// The healed cluster may still be settling its leadership: an
		// unanswered read is kept (it is part of the history) and retried.
		for deadline := time.Now().Add(10 * time.Second); ; {
			op := callOp(t, c, rng, nameIn{Op: OpLookup, Name: n}, now)
			history = append(history, op)
			if !op.Output.(nameOut).Unknown {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("seed %d: the healed cluster did not answer a lookup of %s", seed, n)
			}
		}
	}

	var answered, unknown int
	for _, op := range history {
		if op.Output.(nameOut).Unknown {
			unknown++
		} else {
			answered++
		}
	}
	res, info := porcupine.CheckOperationsVerbose(nameModel.ToModel(), history, 30*time.Second)
	switch res {
	case porcupine.Ok:
		t.Logf("seed %d: %d operations answered, %d unavailable; faults: %v", seed, answered, unknown, faults)
	case porcupine.Illegal:
		path := fmt.Sprintf("%s/names-seed-%d.html", os.TempDir(), seed)
		if err := porcupine.VisualizePath(nameModel.ToModel(), info, path); err == nil {
			t.Logf("history drawn in %s", path)
		}
		dumpIllegal(t, history)
		t.Fatalf("seed %d: history of %d operations is not linearizable; faults: %v (rerun with NAMES_SEED=%d)", seed, len(history), faults, seed)
	default:
		t.Fatalf("seed %d: porcupine gave up (%s)", seed, res)
	}
}

// minAnswered is how many answered operations a schedule's history has
// at least.
const minAnswered = 100

func leaderNow(c *tcluster, voters []string) string {
	for _, v := range voters {
		if r := c.reg(v); r != nil && r.IsLeader() {
			return v
		}
	}
	return ""
}

func pickOp(rng *rand.Rand, w int, names []string, tokens map[string]uint64) nameIn {
	name := names[rng.IntN(len(names))]
	// Two workers share a request, so retries through other agents happen.
	req := fmt.Sprintf("req-%d", w%3)
	switch p := rng.IntN(10); {
	case p < 4:
		return nameIn{Op: OpAcquire, Name: name, Req: req}
	case p < 6 && tokens[name] != 0:
		return nameIn{Op: OpConfirm, Name: name, Token: tokens[name], Owner: fmt.Sprintf("node-%c", 'a'+rng.IntN(3))}
	case p < 8 && tokens[name] != 0:
		t := tokens[name]
		delete(tokens, name)
		return nameIn{Op: OpRelease, Name: name, Token: t}
	}
	return nameIn{Op: OpLookup, Name: name}
}

// callOp runs in through a random live agent and records it.
func callOp(t *testing.T, c *tcluster, rng *rand.Rand, in nameIn, now func() int64) porcupine.Operation {
	var reg *Registry
	for reg == nil {
		alive := c.alive()
		reg = c.reg(alive[rng.IntN(len(alive))])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	call := now()
	k := Claim(in.Name)
	var (
		rec Record
		err error
	)
	switch in.Op {
	case OpAcquire:
		var g Grant
		g, err = reg.Acquire(ctx, k, reg.Node(), "", in.Req, nil)
		rec = g.Record
		if err == nil && g.Retry {
			err = errSame
		}
	case OpConfirm:
		rec, err = reg.Confirm(ctx, k, in.Token, in.Owner, nil)
	case OpRelease:
		rec, err = reg.Release(ctx, k, in.Token, "")
	case OpLookup:
		rec, err = reg.Lookup(ctx, k, Linearizable)
	}
	ret := now()
	out := nameOut{Code: CodeOK, Token: rec.Token, Req: rec.Request, Owner: rec.Owner, State: rec.State}
	var re *RefusedError
	switch {
	case err == nil:
	case errors.Is(err, errSame):
		out.Code = CodeSame
	case IsUnavailable(err):
		out = nameOut{Unknown: true}
		ret = math.MaxInt64
	case errors.As(err, &re):
		out = nameOut{Code: re.Code}
		if re.Record != nil {
			out.Token, out.Req, out.Owner, out.State = re.Record.Token, re.Record.Request, re.Record.Owner, re.Record.State
		}
	default:
		t.Errorf("%+v: unexpected error %v", in, err)
		out = nameOut{Unknown: true}
		ret = math.MaxInt64
	}
	// A confirm, release or same-request acquire answered by a record of
	// the grant shows its token; a refusal shows the current one, which
	// the model does not need.
	if in.Op == OpConfirm && (out.Code == CodeOK || out.Code == CodeSame) {
		out.Token = in.Token
	}
	return porcupine.Operation{ClientId: 0, Input: in, Output: out, Call: call, Return: ret}
}

var errSame = errors.New("same")

// dumpIllegal logs the operations of the first name whose history is not
// linearizable, in call order.
func dumpIllegal(t *testing.T, history []porcupine.Operation) {
	m := nameModel.ToModel()
	for _, part := range m.Partition(history) {
		if porcupine.CheckOperations(m, part) {
			continue
		}
		ops := slices.Clone(part)
		slices.SortFunc(ops, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		for _, op := range ops {
			ret := "inf"
			if op.Return != math.MaxInt64 {
				ret = strconv.FormatInt(op.Return/1000, 10)
			}
			t.Logf("%8d..%8s µs  %+v -> %+v", op.Call/1000, ret, op.Input, op.Output)
		}
		return
	}
}
