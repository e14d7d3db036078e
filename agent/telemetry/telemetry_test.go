package telemetry

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/gpuherd/gpuherd/agent/events"
	"github.com/gpuherd/gpuherd/agent/inventory"
)

// fakeNVML reports the XIDs it holds, then says it cannot deliver more.
type fakeNVML struct {
	xids []uint64
	tele map[string]inventory.Telemetry
}

func (n *fakeNVML) Telemetry() (map[string]inventory.Telemetry, error) { return n.tele, nil }

func (n *fakeNVML) WatchXID(_ context.Context, report func(addr string, xid uint64)) error {
	for _, x := range n.xids {
		report("0000:3b:00.0", x)
	}
	return errors.New("no more events")
}

type fakeHost struct{ fenced []string }

func (h *fakeHost) GPU(addr string) (inventory.GPU, bool) {
	return inventory.GPU{Address: addr, Model: "H100"}, true
}

func (h *fakeHost) Fence(addr, reason string) { h.fenced = append(h.fenced, addr+": "+reason) }

// xidCounter counts XIDs; any other event would panic (nil Recorder).
type xidCounter struct {
	events.Recorder
	seen []string
}

func (r *xidCounter) XID(addr, model string, xid uint64) { r.seen = append(r.seen, model) }

func TestAnXIDOfTheCardFencesIt(t *testing.T) {
	h, rec := &fakeHost{}, &xidCounter{}
	w := New(Deps{NVML: &fakeNVML{xids: []uint64{43, 79}}, Host: h, Recorder: rec, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	w.WatchXID(context.Background())
	if len(rec.seen) != 2 || rec.seen[0] != "H100" {
		t.Fatalf("XIDs counted %v; want both, with the GPU's model", rec.seen)
	}
	if !slices.Equal(h.fenced, []string{"0000:3b:00.0: XID 79 reported by the driver"}) {
		t.Fatalf("fenced %v; want only the card's XID 79, not the application's 43", h.fenced)
	}
}

func TestWithoutNVMLNothingIsRead(t *testing.T) {
	w := New(Deps{Host: &fakeHost{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	w.Refresh()
	w.WatchXID(context.Background())
	if w.Last() != nil {
		t.Fatalf("telemetry %v without NVML", w.Last())
	}
	n := &fakeNVML{tele: map[string]inventory.Telemetry{"0000:3b:00.0": {}}}
	w = New(Deps{NVML: n, Host: &fakeHost{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	w.Refresh()
	if len(w.Last()) != 1 {
		t.Fatalf("telemetry %v; want NVML's reading", w.Last())
	}
}
