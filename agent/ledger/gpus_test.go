package ledger

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// stateOf returns the GPUState of addr at t0.
func stateOf(t *testing.T, l *Ledger, addr string) GPUState {
	t.Helper()
	for _, s := range l.GPUStates(t0) {
		if s.GPU.Address == addr {
			return s
		}
	}
	t.Fatalf("GPU %s not in GPUStates", addr)
	return GPUState{}
}

func TestGPUStatusPrecedence(t *testing.T) {
	// One GPU per combination of held / healthy / drained.
	tests := []struct {
		name    string
		claim   State // "" none
		healthy bool
		drained bool
		want    GPUStatus
	}{
		{"free", "", true, false, GPUFree},
		{"drained", "", true, true, GPUDrained},
		{"unhealthy", "", false, false, GPUUnhealthy},
		{"unhealthy beats drained", "", false, true, GPUUnhealthy},
		{"reserved", StateReserved, true, false, GPUReserved},
		{"reserved beats unhealthy and drained", StateReserved, false, true, GPUReserved},
		{"claimed", StateCommitted, true, false, GPUClaimed},
		{"claimed beats unhealthy and drained", StateCommitted, false, true, GPUClaimed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLedger(t)
			const addr = "0000:61:00.0" // the first L40S placement picks
			if tt.claim != "" {
				mustReserve(t, l, "vm-1", req(Item{Model: l40s, Count: 1}), t0)
				if tt.claim == StateCommitted {
					mustCommit(t, l, "vm-1", t0)
				}
			}
			if tt.drained {
				if err := l.Drain(addr, "test", t0); err != nil {
					t.Fatal(err)
				}
			}
			if !tt.healthy {
				inv := server()
				inv[8].Healthy = false
				if err := l.SetInventory(inv); err != nil {
					t.Fatal(err)
				}
			}
			s := stateOf(t, l, addr)
			if s.Status != tt.want {
				t.Fatalf("status %s, want %s (%+v)", s.Status, tt.want, s)
			}
			if s.Drained != tt.drained || (tt.claim != "") != (s.ClaimID == "vm-1") || s.Missing {
				t.Fatalf("details wrong: %+v", s)
			}
		})
	}
}

func TestGPUStatesAfterLeaseExpiry(t *testing.T) {
	l := newLedger(t)
	mustReserve(t, l, "vm-1", req(Item{Model: l40s, Count: 1}), t0)
	if s := stateOf(t, l, "0000:61:00.0"); s.Status != GPUReserved {
		t.Fatalf("before deadline: %+v", s)
	}
	for _, s := range l.GPUStates(t0.Add(lease)) {
		if s.GPU.Address == "0000:61:00.0" && (s.Status != GPUFree || s.ClaimID != "") {
			t.Fatalf("at the deadline the reservation still shows: %+v", s)
		}
	}
}

func TestTotalsAndFree(t *testing.T) {
	l := newLedger(t)
	inv := server()
	inv[7].Healthy = false // 0000:db:00.0
	inv[6].Unusable = true // 0000:ba:00.0: healthy, its group cannot be passed through
	if err := l.SetInventory(inv); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, l, "vm-1", req(Item{Model: h100, Count: 2}), t0)
	mustReserve(t, l, "vm-2", req(Item{Model: l40s, Count: 2}), t0)
	mustCommit(t, l, "vm-2", t0)
	if err := l.Drain("0000:18:00.0", "maintenance", t0); err != nil {
		t.Fatal(err)
	}

	want := map[string]ModelTotals{
		h100: {Total: 8, Healthy: 6, Free: 3, Unusable: 1}, // 2 reserved, 1 sick, 1 unusable, 1 drained
		l40s: {Total: 2, Healthy: 2, Free: 0},
	}
	if got := l.Totals(t0); !reflect.DeepEqual(got, want) {
		t.Fatalf("Totals = %+v, want %+v", got, want)
	}
	if got, want := l.Totals(t0), totalsOf(l.GPUStates(t0)); !reflect.DeepEqual(got, want) {
		t.Fatalf("Totals = %+v, the GPUs' states count %+v", got, want)
	}
	if got := l.Free(t0); !reflect.DeepEqual(got, map[string]int{h100: 3, l40s: 0}) {
		t.Fatalf("Free = %v", got)
	}
	// Once the reservation lapses its GPUs count as free again.
	if got := l.Free(t0.Add(lease))[h100]; got != 5 {
		t.Fatalf("Free after the lease = %d, want 5", got)
	}
}

func TestDrain(t *testing.T) {
	l := newLedger(t)
	const addr = "0000:61:00.0"
	c := mustReserve(t, l, "vm-1", req(Item{Model: l40s, Count: 1}), t0)
	if c.GPUs[0] != addr {
		t.Fatalf("placement changed: %v", c.GPUs)
	}
	mustCommit(t, l, "vm-1", t0)

	// Draining a held GPU leaves the claim alone.
	if err := l.Drain(addr, "replace fan", t0); err != nil {
		t.Fatal(err)
	}
	if got, err := l.Get("vm-1"); err != nil || got.GPUs[0] != addr {
		t.Fatalf("claim after drain: %+v, %v", got, err)
	}
	// Once released, a drained GPU is not offered.
	if _, err := l.Release("vm-1", t0); err != nil {
		t.Fatal(err)
	}
	if s := stateOf(t, l, addr); s.Status != GPUDrained || s.DrainReason != "replace fan" {
		t.Fatalf("state %+v", s)
	}
	c = mustReserve(t, l, "vm-2", req(Item{Model: l40s, Count: 1}), t0)
	if c.GPUs[0] == addr {
		t.Fatal("drained GPU handed out")
	}

	// Draining again updates the reason, keeps the start.
	later := t0.Add(time.Hour)
	if err := l.Drain(addr, "replace fan and PSU", later); err != nil {
		t.Fatal(err)
	}
	if s := stateOf(t, l, addr); s.DrainReason != "replace fan and PSU" || !s.DrainedAt.Equal(t0) {
		t.Fatalf("redrain: %+v", s)
	}
	rev := l.Revision()
	if err := l.Drain(addr, "replace fan and PSU", later); err != nil || l.Revision() != rev {
		t.Fatalf("identical redrain: %v, revision %d->%d", err, rev, l.Revision())
	}

	if err := l.Undrain(addr); err != nil {
		t.Fatal(err)
	}
	if s := stateOf(t, l, addr); s.Status != GPUFree || s.Drained {
		t.Fatalf("after undrain: %+v", s)
	}
	rev = l.Revision()
	if err := l.Undrain(addr); err != nil || l.Revision() != rev {
		t.Fatalf("undrain of a GPU in service: %v, revision %d->%d", err, rev, l.Revision())
	}
}

func TestDrainErrors(t *testing.T) {
	l := newLedger(t)
	err := l.Drain("0000:ff:00.0", "x", t0)
	if !errors.Is(err, ErrUnknownGPU) || !strings.Contains(err.Error(), "0000:ff:00.0") {
		t.Fatalf("Drain(unknown) = %v, want ErrUnknownGPU naming the GPU", err)
	}
	if err := l.Undrain("0000:ff:00.0"); !errors.Is(err, ErrUnknownGPU) {
		t.Fatalf("Undrain(unknown) = %v, want ErrUnknownGPU", err)
	}
	if err := l.Drain("0000:18:00.0/../../x", "x", t0); err == nil {
		t.Fatal("Drain accepted a malformed address")
	}
	if err := l.Drain("0000:18:00.0", strings.Repeat("r", MaxDrainReasonLen+1), t0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Drain with a huge reason = %v, want ErrInvalid", err)
	}
}

func TestVanishedGPUs(t *testing.T) {
	l := newLedger(t)
	mustReserve(t, l, "vm-1", req(Item{Model: l40s, Count: 1}), t0) // 0000:61:00.0
	mustCommit(t, l, "vm-1", t0)
	if err := l.Drain("0000:62:00.0", "flaky", t0); err != nil {
		t.Fatal(err)
	}
	// Both L40S fall off the bus.
	if err := l.SetInventory(server()[:8]); err != nil {
		t.Fatal(err)
	}

	// The claim keeps its GPU; the GPU shows as missing, with its model.
	if c, err := l.Get("vm-1"); err != nil || c.GPUs[0] != "0000:61:00.0" {
		t.Fatalf("claim after the GPU vanished: %+v, %v", c, err)
	}
	orphans := l.Orphans(t0)
	if len(orphans) != 1 || orphans[0].GPU.Address != "0000:61:00.0" || orphans[0].GPU.Model != l40s ||
		orphans[0].ClaimID != "vm-1" || !orphans[0].Missing || orphans[0].Status != GPUClaimed {
		t.Fatalf("Orphans = %+v", orphans)
	}
	// The drained one is still listed so that an operator can undrain it.
	if s := stateOf(t, l, "0000:62:00.0"); !s.Missing || s.Status != GPUUnhealthy || s.GPU.Model != l40s || !s.Drained {
		t.Fatalf("vanished drained GPU: %+v", s)
	}
	if err := l.Undrain("0000:62:00.0"); err != nil {
		t.Fatalf("Undrain of a vanished GPU: %v", err)
	}
	// Missing GPUs are not capacity.
	if _, ok := l.Totals(t0)[l40s]; ok {
		t.Fatalf("Totals counts vanished GPUs: %+v", l.Totals(t0))
	}
	// A vanished GPU cannot be drained: the address may be a typo.
	if err := l.Drain("0000:62:00.0", "x", t0); !errors.Is(err, ErrUnknownGPU) {
		t.Fatalf("Drain(vanished) = %v, want ErrUnknownGPU", err)
	}
}

func TestSetInventory(t *testing.T) {
	l := newLedger(t)
	rev := l.Revision()
	if err := l.SetInventory(server()); err != nil || l.Revision() != rev {
		t.Fatalf("same inventory: %v, revision %d->%d", err, rev, l.Revision())
	}
	inv := server()
	inv[0].Distance = map[string]int{"0000:2a:00.0": 10}
	if err := l.SetInventory(inv); err != nil || l.Revision() != rev+1 {
		t.Fatalf("changed inventory: %v, revision %d->%d", err, rev, l.Revision())
	}
	// The ledger keeps its own copy.
	inv[0].Distance["0000:2a:00.0"] = 99
	if d := stateOf(t, l, "0000:18:00.0").GPU.Distance["0000:2a:00.0"]; d != 10 {
		t.Fatalf("caller's map leaked into the ledger: %d", d)
	}

	bad := map[string][]GPU{
		"duplicate": {server()[0], server()[0]},
		"address":   {{Address: "3b:00.0", Model: h100, Healthy: true}},
		"model":     {{Address: "0000:3b:00.0", Healthy: true}},
	}
	for name, gpus := range bad {
		if err := l.SetInventory(gpus); err == nil {
			t.Errorf("%s: SetInventory accepted %+v", name, gpus)
		}
	}
	if len(l.GPUStates(t0)) != len(server()) {
		t.Fatal("a refused inventory replaced the good one")
	}
}
