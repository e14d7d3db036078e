package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// TestInventoryAndStatusAgree: `gpuherd inventory` and the agent's status
// give the same verdict for the same machine and configuration, whatever
// the idle driver: a GPU sharing its group with a host NIC is unusable in
// both with the same problems, the others ready in both.
func TestInventoryAndStatusAgree(t *testing.T) {
	for _, idle := range []string{"vfio-pci", "nvidia", "none"} {
		t.Run(idle, func(t *testing.T) {
			k, err := fakekernel.New(fakekernel.Config{Drivers: []string{"nvidia", "igb"}, Devices: []fakekernel.Function{
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

// TestReloadAppliesAllowList: `systemctl reload` (SIGHUP) with an edited
// allow_devices reads every IOMMU group again in the running agent: the
// L40S of the mixed profile, blocked by the NVMe drive in its group, is
// offered once the drive is allow-listed, and unusable again when the
// entry goes.
func TestReloadAppliesAllowList(t *testing.T) {
	dir := t.TempDir()
	notifyPath := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msgs := make(chan string, 64)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(buf[:n])
		}
	}()
	socket := filepath.Join(dir, "api.sock")
	cfgPath := filepath.Join(dir, "gpuherd.yaml")
	writeCfg := func(allow string) {
		t.Helper()
		y := fmt.Sprintf("node_name: reload\nsimulate: mixed\nidle_driver: nvidia\ndata_dir: %s\nsocket: %s\nallow_devices: [%s]\n",
			filepath.Join(dir, "data"), socket, allow)
		if err := os.WriteFile(cfgPath, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg(`"10de:*"`)
	c := startChildEnv(t, "agent.log", []string{"NOTIFY_SOCKET=" + notifyPath}, "agent", "--config", cfgPath)
	await := func(prefix string) {
		t.Helper()
		timeout := time.After(startTimeout)
		for {
			select {
			case m, ok := <-msgs:
				if !ok {
					t.Fatalf("notify socket closed before %q", prefix)
				}
				if strings.HasPrefix(m, prefix) {
					return
				}
			case <-c.exited:
				t.Fatalf("agent exited before sending %q:\n%s", prefix, c.output())
			case <-timeout:
				t.Fatalf("no %q from the agent within %s:\n%s", prefix, startTimeout, c.output())
			}
		}
	}
	await("READY=1")
	client := api.NewClient(socket)
	defer client.Close()
	state := func() string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := client.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range st.GPUs {
			if g.PCIAddress == "0000:e1:00.0" {
				return g.State
			}
		}
		t.Fatalf("no L40S at 0000:e1:00.0: %+v", st.GPUs)
		return ""
	}
	if s := state(); s != "unusable" {
		t.Fatalf("at start the L40S sharing its group with the NVMe is %q", s)
	}
	reload := func() {
		t.Helper()
		if err := c.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		await("RELOADING=1")
		await("READY=1")
	}
	writeCfg(`"10de:*", "144d:a808"`)
	reload()
	if s := state(); s != "free" {
		t.Errorf("after allow-listing the NVMe and reloading: %q, want free\n%s", s, c.output())
	}
	writeCfg(`"10de:*"`)
	reload()
	if s := state(); s != "unusable" {
		t.Errorf("after removing the entry and reloading: %q, want unusable", s)
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	<-c.exited
}
