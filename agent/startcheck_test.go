package agent

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A start that cannot have one of its sockets fails before it writes
// anything to sysfs: the machine stays as it was. The same configuration
// without the fault does move drivers (the GPUs boot on nvidia and idle on
// vfio-pci), so a start that got as far as reconciling would show writes.
func TestStartFailsBeforeAnySysfsWrite(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tt := range []struct {
		name   string
		adjust func(c *Config, dir string)
		want   string
	}{
		{"missing socket_group", func(c *Config, _ string) { c.SocketGroup = "gpuherd-no-such-group" }, "socket_group"},
		{"busy metrics port", func(c *Config, _ string) { c.MetricsAddr = busy.Addr().String() }, "metrics_addr"},
		{"socket path under a file", func(c *Config, dir string) {
			f := filepath.Join(dir, "plain-file")
			if err := os.WriteFile(f, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			c.Socket = filepath.Join(f, "api.sock")
		}, "socket"},
		{"socket path taken by a file", func(c *Config, dir string) {
			if err := os.WriteFile(c.Socket, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "not a socket"},
		{"unknown offered model", func(c *Config, _ string) { c.OfferedModels = []string{"l40s", "Z9000"} }, "Z9000"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := testConfig(t, dir)
			cfg.IdleDriver = "vfio-pci"
			m := machine(t, "dgx-h100", dir)
			tt.adjust(&cfg, dir)
			a, err := New(context.Background(), cfg, quietLog(), WithSysfs(m.Kernel, m.NVML))
			if err == nil {
				a.Close()
				t.Fatal("the agent started")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not name %q", err, tt.want)
			}
			if w := m.Kernel.Writes(); len(w) != 0 {
				t.Errorf("%d sysfs writes before the start failed, want none; first %+v", len(w), w[0])
			}
		})
	}
	t.Run("control: the same start moves drivers", func(t *testing.T) {
		dir := t.TempDir()
		cfg := testConfig(t, dir)
		cfg.IdleDriver = "vfio-pci"
		m := machine(t, "dgx-h100", dir)
		a := startAgent(t, cfg, m, nil)
		defer a.Close()
		if len(m.Kernel.Writes()) == 0 {
			t.Fatal("no sysfs write: the cases above prove nothing")
		}
	})
}

// /healthz, /readyz and /metrics answer while the start is still binding
// GPUs: readiness is 503 naming the phase, and gpuherd_agent_phase says
// which. The start is held inside reconcile by an unbind that blocks.
func TestMetricsAnswerDuringStart(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.IdleDriver = "vfio-pci"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.MetricsAddr = ln.Addr().String()
	ln.Close()
	m := machine(t, "dgx-h100", dir)
	addr := "0000:18:00.0"
	if err := m.Kernel.Hold(addr); err != nil {
		t.Fatal(err)
	}
	type result struct {
		a   *Agent
		err error
	}
	done := make(chan result, 1)
	go func() {
		a, err := New(context.Background(), cfg, quietLog(), WithSysfs(m.Kernel, m.NVML))
		done <- result{a, err}
	}()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + cfg.MetricsAddr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitFor(t, "readyz says reconciling", 5*time.Second, func() bool {
		code, body := get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "starting: reconciling")
	})
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz %d during start, want 200", code)
	}
	if _, body := get("/metrics"); !strings.Contains(body, `gpuherd_agent_phase{phase="reconciling"} 1`) {
		t.Errorf("/metrics during start lacks the phase:\n%s", grepLines(body, "gpuherd_agent_phase"))
	}
	m.Kernel.Unhold(addr)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	ready := make(chan struct{})
	go func() { ran <- r.a.Run(ctx, func() { close(ready) }) }()
	<-ready
	if code, body := get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz %d %q once serving, want 200", code, body)
	}
	if _, body := get("/metrics"); !strings.Contains(body, `gpuherd_agent_phase{phase="serving"} 1`) {
		t.Errorf("/metrics once serving:\n%s", grepLines(body, "gpuherd_agent_phase"))
	}
	cancel()
	<-ran
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A GPU on deny_devices is neither offered nor touched: every other GPU
// moves to vfio-pci, it stays on its driver.
func TestDenyListKeepsAGPUUntouched(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.IdleDriver = "vfio-pci"
	const denied = "0000:18:00.0"
	cfg.DenyDevices = []string{denied}
	m := machine(t, "dgx-h100", dir)
	a := startAgent(t, cfg, m, nil)
	defer a.Close()
	st, err := a.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.GPUs) != 7 {
		t.Errorf("%d GPUs offered, want 7", len(st.GPUs))
	}
	for _, g := range st.GPUs {
		if g.PCIAddress == denied {
			t.Errorf("the denied GPU is offered: %+v", g)
		}
	}
	for _, w := range m.Kernel.Writes() {
		if strings.Contains(w.Name, denied) || strings.TrimSpace(w.Data) == denied {
			t.Errorf("a sysfs write touched the denied GPU: %+v", w)
		}
	}
	if d := driverOf(t, m.Kernel, denied); d != "nvidia" {
		t.Errorf("the denied GPU is on %q, want nvidia as it booted", d)
	}
}
