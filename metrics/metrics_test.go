package metrics

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/gpuherd/gpuherd/agent/events"
)

var update = flag.Bool("update", false, "rewrite testdata/*.prom from the current output")

func ptr[T any](v T) *T { return &v }

// fixture is a server with one GPU of each kind the exporter must handle:
// on the host driver with full telemetry, on vfio-pci without telemetry, and
// an uncatalogued, unbound, unhealthy card that NVML answers only partly.
func fixture() Snapshot {
	return Snapshot{
		Build: BuildInfo{Version: "1.2.3", Revision: "abc1234", GoVersion: "go1.26.8"},
		GPUs: []GPU{
			{
				PCIAddress: "0000:18:00.0", Model: "NVIDIA H100 80GB", DeviceID: "2330",
				UUID: "GPU-7f3a0c2e-0000-4000-8000-000000000018", IOMMUGroup: 16, NUMANode: 0,
				Driver: "nvidia", State: StateFree, Healthy: true,
				Telemetry: &Telemetry{
					TemperatureCelsius: 34, PowerWatts: 72.5, EnergyJoules: 123456.789,
					MemoryUsedBytes: 1 << 20, MemoryTotalBytes: 81559 << 20, Utilization: 0.25,
					HasTemperature: true, HasPower: true, HasEnergy: true, HasMemory: true, HasUtilization: true,
				},
			},
			{
				PCIAddress: "0000:2a:00.0", Model: "NVIDIA H100 80GB", DeviceID: "2330",
				UUID: "GPU-7f3a0c2e-0000-4000-8000-00000000002a", IOMMUGroup: 17, NUMANode: 0,
				Driver: "vfio-pci", State: StateClaimed, Healthy: true,
			},
			{
				PCIAddress: "0000:3b:00.0", Model: "10de:26ff", DeviceID: "26ff",
				IOMMUGroup: -1, NUMANode: -1, State: StateUnhealthy, Healthy: false,
				Telemetry: &Telemetry{TemperatureCelsius: 41, HasTemperature: true},
			},
			{
				PCIAddress: "0000:41:00.0", Model: "NVIDIA L40S", DeviceID: "26b9", IOMMUGroup: 14, NUMANode: 1,
				Driver: "nvidia", State: StateUnusable, Healthy: true,
				UnusableReason: "group_not_viable", BlockingDevice: "0000:42:00.0",
			},
		},
		Models: []ModelCapacity{
			{Model: "10de:26ff", Total: 1, Free: 0, Healthy: 0},
			{Model: "NVIDIA H100 80GB", Total: 2, Free: 1, Healthy: 2},
			{Model: "NVIDIA L40S", Total: 1, Free: 0, Healthy: 0, Unusable: 1},
		},
		Cluster: []ClusterModelCapacity{
			{ModelCapacity: ModelCapacity{Model: "NVIDIA H100 80GB", Total: 16, Free: 5, Healthy: 16}, MaxFreeOnOneServer: 3},
			{ModelCapacity: ModelCapacity{Model: "NVIDIA L40S", Total: 8, Free: 0, Healthy: 6, Unusable: 1}, MaxFreeOnOneServer: 0},
		},
		Members:           map[string]int{"alive": 3, "suspect": 1},
		GossipHealthScore: ptr(0),
		Ledger:            LedgerStats{Reserved: 1, Committed: 2, FileBytes: 32768},
	}
}

// recordFixtureEvents feeds one of each event.
func recordFixtureEvents(m *Metrics) {
	m.ClaimDone(events.ClaimGranted, 120*time.Millisecond)
	m.ClaimDone(events.ClaimNotAvailable, 3*time.Millisecond)
	m.Reservation(events.ReservationReserved)
	m.Reservation(events.ReservationCommitted)
	m.VFIOOperation(events.VFIOBind, 40*time.Millisecond, nil)
	m.VFIOOperation(events.VFIORelease, 2*time.Second, errors.New("unbind timed out"))
	m.XID("0000:18:00.0", "NVIDIA H100 80GB", 79)
	m.XID("0000:18:00.0", "NVIDIA H100 80GB", 79)
	m.XID("0000:18:00.0", "NVIDIA H100 80GB", 48)
}

// gpuherdOnly gathers only the gpuherd_ families: the runtime collectors'
// values change from run to run.
func gpuherdOnly(g prometheus.Gatherer) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := g.Gather()
		var out []*dto.MetricFamily
		for _, mf := range mfs {
			if strings.HasPrefix(mf.GetName(), namespace+"_") {
				out = append(out, mf)
			}
		}
		return out, err
	})
}

// compareGolden compares g's exposition with testdata/name, or rewrites
// that file under -update.
func compareGolden(t *testing.T, g prometheus.Gatherer, name string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		mfs, err := g.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	defer f.Close()
	if err := testutil.GatherAndCompare(g, f); err != nil {
		t.Error(err)
	}
}

func TestGolden(t *testing.T) {
	m := New(SourceFunc(fixture))
	recordFixtureEvents(m)
	compareGolden(t, gpuherdOnly(m.Registry()), "full.prom")
}

func TestGoldenWithoutCluster(t *testing.T) {
	// A fresh single-server agent: no cluster, no NVML, no events yet. The
	// event counters exist at 0; nothing cluster- or NVML-related exists.
	s := Snapshot{
		Build: BuildInfo{Version: "1.2.3", Revision: "abc1234", GoVersion: "go1.26.8"},
		GPUs: []GPU{{
			PCIAddress: "0000:3b:00.0", Model: "NVIDIA L40S", DeviceID: "26b9",
			IOMMUGroup: 30, NUMANode: 1, Driver: "vfio-pci", State: StateFree, Healthy: true,
		}},
		Models: []ModelCapacity{{Model: "NVIDIA L40S", Total: 1, Free: 1, Healthy: 1}},
	}
	m := New(SourceFunc(func() Snapshot { return s }))
	compareGolden(t, gpuherdOnly(m.Registry()), "single.prom")
}

func TestAbsentTelemetryHasNoSamples(t *testing.T) {
	m := New(SourceFunc(fixture), WithoutRuntimeMetrics())
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	telemetry := map[string]bool{
		"gpuherd_gpu_temperature_celsius": true, "gpuherd_gpu_power_watts": true,
		"gpuherd_gpu_energy_joules_total": true, "gpuherd_gpu_memory_used_bytes": true,
		"gpuherd_gpu_memory_total_bytes": true, "gpuherd_gpu_utilization_ratio": true,
	}
	// Which GPUs each telemetry family has samples for.
	got := map[string][]string{}
	for _, mf := range mfs {
		if !telemetry[mf.GetName()] {
			continue
		}
		for _, s := range mf.GetMetric() {
			got[mf.GetName()] = append(got[mf.GetName()], label(s, "pci_address"))
		}
	}
	for name := range telemetry {
		want := []string{"0000:18:00.0"} // the only GPU with full telemetry
		if name == "gpuherd_gpu_temperature_celsius" {
			want = append(want, "0000:3b:00.0") // answered temperature only
		}
		slices.Sort(got[name])
		if !slices.Equal(got[name], want) {
			t.Errorf("%s has samples for %v, want %v", name, got[name], want)
		}
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func TestPromlint(t *testing.T) {
	m := New(SourceFunc(fixture))
	recordFixtureEvents(m)
	Handler(m, nil, nil) // registers the promhttp handler metrics, as Serve does
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	if len(mfs) < 30 {
		t.Errorf("linted only %d families; the runtime collectors are missing", len(mfs))
	}
}

func TestOneSnapshotPerScrape(t *testing.T) {
	var calls atomic.Int64
	m := New(SourceFunc(func() Snapshot { calls.Add(1); return fixture() }))
	for i := 1; i <= 3; i++ {
		if _, err := m.Registry().Gather(); err != nil {
			t.Fatal(err)
		}
		if n := calls.Load(); n != int64(i) {
			t.Fatalf("after %d scrapes Snapshot was called %d times", i, n)
		}
	}
}

func TestGPUStateSeries(t *testing.T) {
	s := fixture()
	s.GPUs = s.GPUs[:1]
	s.GPUs[0].State = "quarantined" // a state added to the agent after this package
	m := New(SourceFunc(func() Snapshot { return s }))
	want := `
# HELP gpuherd_gpu_state 1 for the GPU's current state, 0 for the others.
# TYPE gpuherd_gpu_state gauge
gpuherd_gpu_state{model="NVIDIA H100 80GB",pci_address="0000:18:00.0",state="claimed"} 0
gpuherd_gpu_state{model="NVIDIA H100 80GB",pci_address="0000:18:00.0",state="drained"} 0
gpuherd_gpu_state{model="NVIDIA H100 80GB",pci_address="0000:18:00.0",state="free"} 0
gpuherd_gpu_state{model="NVIDIA H100 80GB",pci_address="0000:18:00.0",state="quarantined"} 1
gpuherd_gpu_state{model="NVIDIA H100 80GB",pci_address="0000:18:00.0",state="reserved"} 0
gpuherd_gpu_state{model="NVIDIA H100 80GB",pci_address="0000:18:00.0",state="returning"} 0
gpuherd_gpu_state{model="NVIDIA H100 80GB",pci_address="0000:18:00.0",state="unhealthy"} 0
gpuherd_gpu_state{model="NVIDIA H100 80GB",pci_address="0000:18:00.0",state="unusable"} 0
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "gpuherd_gpu_state"); err != nil {
		t.Error(err)
	}
}

func TestBadLabelValueKeepsScrape(t *testing.T) {
	s := fixture()
	s.GPUs[2].Model = "bad\xffmodel" // not UTF-8: cannot be exposed
	m := New(SourceFunc(func() Snapshot { return s }), WithoutRuntimeMetrics())
	rec := httptest.NewRecorder()
	Handler(m, nil, nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d, want 200 with the series that could be built", rec.Code)
	}
	body := rec.Body.String()
	for _, want := range []string{"gpuherd_build_info{", `pci_address="0000:18:00.0"`, "gpuherd_model_gpus{"} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if strings.Contains(body, "0000:3b:00.0") {
		t.Error("the GPU with the bad model still has series")
	}
}

func TestXIDBadLabelDropped(t *testing.T) {
	m := New(SourceFunc(fixture), WithoutRuntimeMetrics())
	m.XID("0000:18:00.0", "bad\xff", 79) // must neither panic nor count
	m.XID("0000:18:00.0", "NVIDIA H100 80GB", 79)
	if n := testutil.CollectAndCount(m.events.xids); n != 1 {
		t.Errorf("%d XID series, want 1", n)
	}
}

// BenchmarkScrape measures one full /metrics answer for an 8-GPU server
// with every telemetry reading: "all" as served, "gpuherd" without the Go
// runtime and process collectors, to see this package's own share.
func BenchmarkScrape(b *testing.B) {
	s := fixture()
	s.GPUs = nil
	for i := range 8 {
		g := fixture().GPUs[0]
		g.PCIAddress = fmt.Sprintf("0000:%02x:00.0", 0x18+i)
		s.GPUs = append(s.GPUs, g)
	}
	for _, bb := range []struct {
		name string
		opts []Option
	}{{"all", nil}, {"gpuherd", []Option{WithoutRuntimeMetrics()}}} {
		b.Run(bb.name, func(b *testing.B) {
			m := New(SourceFunc(func() Snapshot { return s }), bb.opts...)
			for _, g := range s.GPUs {
				m.XID(g.PCIAddress, g.Model, 79)
			}
			h := Handler(m, nil, nil)
			req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("status %d", rec.Code)
				}
			}
		})
	}
}
