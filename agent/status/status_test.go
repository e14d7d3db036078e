package status

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/agent/inventory"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/internal/clock"
	"github.com/gpuherd/gpuherd/vfio"
)

// fakeLedger holds one GPU, claimed; busy moves its revision on every
// read, as a ledger written to all the time.
type fakeLedger struct {
	rev  uint64
	busy bool
}

func (l *fakeLedger) Revision() uint64 {
	if l.busy {
		l.rev++
	}
	return l.rev
}

func (l *fakeLedger) GPUStates(time.Time) []ledger.GPUState {
	return []ledger.GPUState{{GPU: ledger.GPU{Address: "0000:3b:00.0", Model: "L40S"}, Status: ledger.GPUClaimed, ClaimID: "vm-1"}}
}

func (l *fakeLedger) Get(id string) (ledger.Claim, error) {
	if id != "vm-1" {
		return ledger.Claim{}, ledger.ErrNotFound
	}
	return ledger.Claim{ID: id, Labels: map[string]string{"vm": "one"}}, nil
}

// fakeHost has the GPU on vfio-pci and counts the times its locks were
// taken.
type fakeHost struct {
	locked [][]string
}

func (h *fakeHost) GPU(addr string) (inventory.GPU, bool) {
	return inventory.GPU{Address: addr, Model: "L40S"}, addr == "0000:3b:00.0"
}

func (h *fakeHost) Device(addr string) (vfio.Device, error) {
	if addr != "0000:3b:00.0" {
		return vfio.Device{}, errors.New("no device")
	}
	return vfio.Device{Address: addr, Driver: "vfio-pci"}, nil
}

func (h *fakeHost) LockGPUs(addrs ...string) func() {
	h.locked = append(h.locked, addrs)
	return func() {}
}

func (h *fakeHost) WhyNotOffered(string) string      { return "" }
func (h *fakeHost) Readiness(string) *api.Readiness  { return nil }
func (h *fakeHost) Fabric() host.Fabric              { return host.Fabric{Mode: "none"} }
func (h *fakeHost) AnnotateUse(gpus []api.GPU) error { return nil }

func newReader(l *fakeLedger, h *fakeHost) *Reader {
	return New(Deps{Node: "gpu-a", Version: "v-test", Ledger: l, Host: h, Clock: clock.WithNow(time.Now),
		Generation: func() uint64 { return 7 },
		Names:      func() *api.NamesStatus { return nil },
		Storage:    func() []api.StorageProblem { return nil }})
}

func TestStatusPairsTheLedgerWithTheLiveDriver(t *testing.T) {
	r := newReader(&fakeLedger{}, &fakeHost{})
	st, err := r.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Node != "gpu-a" || st.Version != "v-test" || st.Generation != 7 || st.Fabric != "none" || len(st.GPUs) != 1 {
		t.Fatalf("status %+v", st)
	}
	g := st.GPUs[0]
	if g.State != string(ledger.GPUClaimed) || g.Driver != "vfio-pci" || g.Claim != "vm-1" || g.ClaimLabels["vm"] != "one" {
		t.Fatalf("GPU %+v: want claimed by vm-1 on vfio-pci with its labels", g)
	}
}

func TestStatesTakeTheDeviceLocksWhenTheLedgerKeepsChanging(t *testing.T) {
	h := &fakeHost{}
	r := newReader(&fakeLedger{}, h)
	r.States()
	if len(h.locked) != 0 {
		t.Fatalf("a quiet ledger took the device locks: %v", h.locked)
	}
	r = newReader(&fakeLedger{busy: true}, h)
	if s := r.States(); len(s) != 1 || !s[0].Read || s[0].Driver != "vfio-pci" {
		t.Fatalf("states %+v", s)
	}
	if len(h.locked) != 1 || !slices.Equal(h.locked[0], []string{"0000:3b:00.0"}) {
		t.Fatalf("locks taken %v; want once, over the ledger's GPUs", h.locked)
	}
}

func TestKnownNamesTheWrongAddress(t *testing.T) {
	r := newReader(&fakeLedger{}, &fakeHost{})
	for addr, code := range map[string]string{"3b:00.0": api.CodeInvalid, "0000:3c:00.0": api.CodeNotFound, "0000:3b:00.0": ""} {
		err := r.Known(addr)
		var ae *api.Error
		switch {
		case code == "" && err != nil:
			t.Errorf("Known(%s) = %v; want nil", addr, err)
		case code != "" && (!errors.As(err, &ae) || ae.Code != code):
			t.Errorf("Known(%s) = %v; want %s", addr, err, code)
		}
	}
}
