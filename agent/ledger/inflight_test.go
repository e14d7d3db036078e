package ledger

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// ledgerOp is one drawn call on a ledger, with what it answered printed.
type ledgerOp struct {
	name string
	do   func(l *Ledger) string
}

var inflightIDs = []string{"vm-a", "vm-b", "vm-c"}

// smallServer is three H100 and an L40S: few enough that two calls often
// want the same GPU.
func smallServer() []GPU {
	all := server()
	return []GPU{all[0], all[1], all[4], all[8]}
}

// The calls that change a ledger: those that change only memory (reserve,
// abort, extend a reservation, expire, a new inventory) and those that
// write the file (commit, release, drain, undrain, adopt).
var (
	memoryCalls = []string{"reserve", "abort", "extend", "expire", "inventory"}
	fileCalls   = []string{"commit", "release", "drain", "undrain", "adopt"}
	anyCall     = append(slices.Clone(memoryCalls), fileCalls...)
)

// drawLedgerOp draws a call: mostly one of kinds, sometimes any. Its time
// is clock's, moved on by 0 to 90 s when advance is set: the agent's clock
// never goes back (clock.Monotonic), and a ledger told an earlier time
// than it was told before commits a reservation whose lease it saw pass,
// after a newer one took its GPU.
func drawLedgerOp(rt *rapid.T, label string, kinds []string, clock *time.Time, advance bool) ledgerOp {
	if rapid.IntRange(0, 4).Draw(rt, label+" any") == 0 {
		kinds = anyCall
	}
	id := rapid.SampledFrom(inflightIDs).Draw(rt, label+" id")
	if advance {
		*clock = clock.Add(time.Duration(rapid.IntRange(0, 3).Draw(rt, label+" at")) * 30 * time.Second)
	}
	now := *clock
	// Half the time the GPU a one-GPU reservation takes first.
	addr := smallServer()[0].Address
	if rapid.Bool().Draw(rt, label+" other gpu") {
		addr = rapid.SampledFrom(smallServer()).Draw(rt, label+" gpu").Address
	}
	answer := func(c Claim, err error) string { return fmt.Sprintf("%+v %v", c, err) }
	switch kind := rapid.SampledFrom(kinds).Draw(rt, label); kind {
	case "reserve":
		r := req(Item{Model: h100, Count: rapid.IntRange(1, 2).Draw(rt, label+" count")})
		if rapid.Bool().Draw(rt, label+" l40s") {
			r.Items = append(r.Items, Item{Model: l40s, Count: 1})
		}
		return ledgerOp{fmt.Sprintf("reserve %s %v at %s", id, r.Items, now.Format(time.TimeOnly)), func(l *Ledger) string {
			return answer(l.Reserve(id, r, "coord-1", now, lease))
		}}
	case "commit":
		return ledgerOp{"commit " + id, func(l *Ledger) string { return answer(l.Commit(id, now)) }}
	case "release":
		return ledgerOp{"release " + id, func(l *Ledger) string { return answer(l.Release(id, now)) }}
	case "abort":
		return ledgerOp{"abort " + id, func(l *Ledger) string { return answer(l.AbortReservation(id, now)) }}
	case "extend":
		return ledgerOp{"extend " + id, func(l *Ledger) string { return answer(l.Extend(id, now, lease)) }}
	case "expire":
		return ledgerOp{"expire at " + now.Format(time.TimeOnly), func(l *Ledger) string {
			c, err := l.Expire(now)
			return fmt.Sprintf("%+v %v", c, err)
		}}
	case "drain":
		return ledgerOp{"drain " + addr, func(l *Ledger) string { return fmt.Sprint(l.Drain(addr, "test", now)) }}
	case "undrain":
		return ledgerOp{"undrain " + addr, func(l *Ledger) string { return fmt.Sprint(l.Undrain(addr)) }}
	case "adopt":
		return ledgerOp{"adopt " + id + " " + addr, func(l *Ledger) string { return answer(l.Adopt(id, []string{addr}, nil, now)) }}
	default:
		inv := slices.DeleteFunc(smallServer(), func(g GPU) bool { return g.Address == addr })
		return ledgerOp{"inventory without " + addr, func(l *Ledger) string { return fmt.Sprint(l.SetInventory(inv)) }}
	}
}

// snapshot is what a ledger holds, printed: its claims, and its GPUs'
// states once every reservation has expired (the drains and the committed
// claims; expired reservations may overlap at any one time).
func snapshot(l *Ledger) string {
	return fmt.Sprintf("%+v\n%+v", l.List(), l.GPUStates(t0.Add(time.Hour)))
}

// A write that changes only memory, made while a file transaction is being
// written and synced, either goes on at once (it is carried into the state
// the transaction leaves) or waits for the transaction; either way both
// are answered, and leave the ledger, exactly as the same two calls made
// one after the other in that order, and the file holds what the ledger
// says is committed. This is what keeps a GPU from two claims when writers
// no longer wait for the fsync.
func TestWritesDuringAFileTransactionAreSerializable(t *testing.T) {
	defer func() { testInFlight, testWaitsForFile = nil, nil }()
	base := t.TempDir()
	run, overlapped := 0, 0
	// Five rounds of rapid's checks: a pair that breaks the rule (a
	// reservation meanwhile of the GPU the adoption in flight takes) is
	// about one draw in 150.
	for range 5 {
		rapid.Check(t, inflightProperty(base, &run, &overlapped))
	}
	// The property must have been exercised: some writes went on during a
	// transaction in flight.
	if overlapped == 0 {
		t.Errorf("in %d runs, no write went on while a transaction was in flight", run)
	}
}

// inflightProperty is one run of TestWritesDuringAFileTransactionAreSerializable.
func inflightProperty(base string, run, overlapped *int) func(*rapid.T) {
	return func(rt *rapid.T) {
		*run++
		clock := t0
		setup := rapid.SliceOfN(rapid.Custom(func(rt *rapid.T) ledgerOp { return drawLedgerOp(rt, "setup", anyCall, &clock, true) }), 0, 6).Draw(rt, "setup")
		// The two calls made together see one time: they run in either
		// order.
		file := drawLedgerOp(rt, "in flight", fileCalls, &clock, true)
		mem := drawLedgerOp(rt, "meanwhile", memoryCalls, &clock, false)
		open := func(name string) *Ledger {
			l, err := Open(filepath.Join(base, fmt.Sprintf("%d-%s.db", *run, name)))
			if err != nil {
				rt.Fatal(err)
			}
			if err := l.SetInventory(smallServer()); err != nil {
				rt.Fatal(err)
			}
			for _, op := range setup {
				op.do(l)
			}
			return l
		}
		l, seq := open("concurrent"), open("sequential")
		defer func() { _ = l.Close(); _ = seq.Close() }()

		// mem runs while file's transaction is in flight; it is done, or
		// waits for the file lock, before the transaction is written.
		var memAnswer string
		memFirst := false
		done, waits := make(chan struct{}), make(chan struct{}, 1)
		started := false
		testInFlight = func() {
			// Once: mem's own transaction, if it has one, runs as any.
			testInFlight = nil
			started = true
			testWaitsForFile = func() {
				select {
				case waits <- struct{}{}:
				default:
				}
			}
			go func() { defer close(done); memAnswer = mem.do(l) }()
			select {
			case <-done:
				memFirst = true
			case <-waits:
			}
		}
		fileAnswer := file.do(l)
		if !started {
			// file wrote nothing: mem comes after it.
			testInFlight = nil
			go func() { defer close(done); memAnswer = mem.do(l) }()
		}
		<-done
		testWaitsForFile = nil
		if memFirst {
			*overlapped++
		}

		order := []ledgerOp{file, mem}
		if memFirst {
			order = []ledgerOp{mem, file}
		}
		var seqFile, seqMem string
		if memFirst {
			seqMem, seqFile = mem.do(seq), file.do(seq)
		} else {
			seqFile, seqMem = file.do(seq), mem.do(seq)
		}
		if memAnswer != seqMem || fileAnswer != seqFile {
			rt.Fatalf("%s then %s: answered\n  %s\n  %s\none after the other:\n  %s\n  %s",
				order[0].name, order[1].name, fileAnswer, memAnswer, seqFile, seqMem)
		}
		if got, want := snapshot(l), snapshot(seq); got != want {
			rt.Fatalf("%s then %s: the ledger holds\n%s\none after the other:\n%s", order[0].name, order[1].name, got, want)
		}
		// What the file holds: committed claims and drains, as published.
		committed := func(l *Ledger) []Claim {
			return slices.DeleteFunc(l.List(), func(c Claim) bool { return c.State != StateCommitted })
		}
		want := fmt.Sprintf("%+v", committed(l))
		if err := l.Close(); err != nil {
			rt.Fatal(err)
		}
		again, err := Open(l.Path())
		if err != nil {
			rt.Fatal(err)
		}
		defer func() { _ = again.Close() }()
		if got := fmt.Sprintf("%+v", committed(again)); got != want {
			rt.Fatalf("%s then %s: the file holds\n%s\nthe ledger said\n%s", order[0].name, order[1].name, got, want)
		}
	}
}
