package drain

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/internal/clock"
)

// fakeLedger records the drains it was asked for.
type fakeLedger struct{ drained map[string]string }

func (l *fakeLedger) Drain(addr, reason string, _ time.Time) error {
	l.drained[addr] = reason
	return nil
}

func (l *fakeLedger) Undrain(addr string) error {
	delete(l.drained, addr)
	return nil
}

// oneGPU is a server with one GPU.
type oneGPU struct{}

func (oneGPU) Known(addr string) error {
	if addr != "0000:3b:00.0" {
		return &api.Error{Code: api.CodeNotFound, Message: "no GPU at " + addr}
	}
	return nil
}

func (oneGPU) GPU(addr string) (api.GPU, error) { return api.GPU{PCIAddress: addr}, nil }

func open(t *testing.T, dir string, l *fakeLedger, changes *int) (*Drains, error) {
	t.Helper()
	return Open(Deps{Dir: dir, Ledger: l, GPUs: oneGPU{},
		Self:     func() api.Member { return api.Member{Name: "gpu-a"} },
		APIError: func(err error) error { return err },
		Changed:  func() { *changes++ },
		Clock:    clock.WithNow(time.Now),
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil))})
}

func TestServerDrainOutlivesARestart(t *testing.T) {
	dir, changes := t.TempDir(), 0
	d, err := open(t, dir, &fakeLedger{}, &changes)
	if err != nil {
		t.Fatal(err)
	}
	if d.ServerDrained() {
		t.Fatal("a new server is drained")
	}
	if m, err := d.DrainServer(context.Background(), "maintenance"); err != nil || m.Name != "gpu-a" || !d.ServerDrained() || changes != 1 {
		t.Fatalf("DrainServer = %+v, %v; drained %v, %d changes", m, err, d.ServerDrained(), changes)
	}
	again, err := open(t, dir, &fakeLedger{}, &changes)
	if err != nil || !again.ServerDrained() {
		t.Fatalf("after a restart: drained %v, %v; want drained", again.ServerDrained(), err)
	}
	if _, err := again.UndrainServer(context.Background()); err != nil || again.ServerDrained() {
		t.Fatalf("UndrainServer: %v, drained %v", err, again.ServerDrained())
	}
	if d, err := open(t, dir, &fakeLedger{}, &changes); err != nil || d.ServerDrained() {
		t.Fatalf("after undrain and a restart: drained %v, %v", d.ServerDrained(), err)
	}
}

func TestACorruptCordonStopsTheStart(t *testing.T) {
	dir, changes := t.TempDir(), 0
	if err := os.WriteFile(filepath.Join(dir, serverDrainFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := open(t, dir, &fakeLedger{}, &changes); err == nil || !strings.Contains(err.Error(), "removing it undrains the server") {
		t.Fatalf("Open = %v; want the file named as corrupt", err)
	}
}

func TestDrainAGPU(t *testing.T) {
	l, changes := &fakeLedger{drained: map[string]string{}}, 0
	d, err := open(t, t.TempDir(), l, &changes)
	if err != nil {
		t.Fatal(err)
	}
	var ae *api.Error
	if _, err := d.Drain(context.Background(), "0000:3c:00.0", "x"); !errors.As(err, &ae) || ae.Code != api.CodeNotFound || len(l.drained) != 0 {
		t.Fatalf("draining an unknown GPU: %v, ledger %v", err, l.drained)
	}
	if _, err := d.Drain(context.Background(), "0000:3b:00.0", strings.Repeat("r", 257)); !errors.As(err, &ae) || ae.Code != api.CodeInvalid || len(l.drained) != 0 {
		t.Fatalf("a long reason: %v, ledger %v", err, l.drained)
	}
	if g, err := d.Drain(context.Background(), "0000:3b:00.0", "fan"); err != nil || g.PCIAddress != "0000:3b:00.0" || l.drained["0000:3b:00.0"] != "fan" || changes != 1 {
		t.Fatalf("Drain = %+v, %v; ledger %v, %d changes", g, err, l.drained, changes)
	}
	if _, err := d.Undrain(context.Background(), "0000:3b:00.0"); err != nil || len(l.drained) != 0 || changes != 2 {
		t.Fatalf("Undrain: %v; ledger %v, %d changes", err, l.drained, changes)
	}
}
