package main

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/vfio"
)

// TestInventoryAndStatusAgree: `gpuherd inventory` and the agent's status
// give the same verdict for the same machine and configuration, whatever
// the idle driver: a GPU sharing its group with a host NIC is unusable in
// both with the same problems, the others ready in both.
func TestInventoryAndStatusAgree(t *testing.T) {
	for _, idle := range []string{"vfio-pci", "nvidia", "none"} {
		t.Run(idle, func(t *testing.T) {
			k, err := vfio.NewKernel(vfio.KernelConfig{Drivers: []string{"nvidia", "igb"}, Devices: []vfio.FakeDevice{
				{Address: "0000:41:00.0", Vendor: vfio.VendorNVIDIA, Device: 0x26b9, Class: vfio.Class3D, IOMMUGroup: 14, Driver: "nvidia"},
				{Address: "0000:42:00.0", Vendor: 0x8086, Device: 0x1521, Class: 0x020000, IOMMUGroup: 14, Driver: "igb"},
				{Address: "0000:51:00.0", Vendor: vfio.VendorNVIDIA, Device: 0x26b9, Class: vfio.Class3D, IOMMUGroup: 15, Driver: "nvidia", NoReset: true},
			}})
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			cfg := agent.DefaultConfig()
			cfg.NodeName, cfg.DataDir, cfg.Socket, cfg.IdleDriver = "n1", filepath.Join(dir, "data"), filepath.Join(dir, "s.sock"), idle
			a, err := agent.New(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), agent.WithSysfs(k, nil))
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			st, err := a.Status(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			// inventory runs after the agent moved the free GPU to the idle
			// driver: the verdict must not depend on it.
			al, _ := vfio.ParseAllowList(cfg.AllowDevices)
			rep, err := scan(k, vfio.ReadinessConfig{Allow: al})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.GPUs) != len(st.GPUs) {
				t.Fatalf("inventory %d GPUs, status %d", len(rep.GPUs), len(st.GPUs))
			}
			for i, g := range st.GPUs {
				inv := rep.GPUs[i]
				if inv.Address != g.PCIAddress || !reflect.DeepEqual(inv.Readiness, g.Readiness) {
					t.Errorf("%s: inventory says %+v, status %+v", g.PCIAddress, inv.Readiness, g.Readiness)
				}
			}
			if g := st.GPUs[0]; g.State != "unusable" || g.Readiness.Blocking[0].BlockingDevice.PCIAddress != "0000:42:00.0" {
				t.Errorf("GPU a: %s %+v", g.State, g.Readiness)
			}
			if g := st.GPUs[1]; g.State != "free" || len(g.Readiness.Warnings) != 1 || g.Readiness.Warnings[0].Code != vfio.ProblemNoReset {
				t.Errorf("GPU b: %s %+v, want free with the no-reset warning", g.State, g.Readiness)
			}
		})
	}
}
