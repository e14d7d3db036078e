package metrics

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// namespace prefixes every metric of the agent.
const namespace = "gpuherd"

// Metrics is the agent's Prometheus exporter: gauges built from a Source at
// each scrape, plus the counters and histograms the agent feeds through
// Recorder. It is safe for concurrent use.
type Metrics struct {
	reg    *prometheus.Registry
	events *eventMetrics
	vm     *vmEvents
	names  *nameEvents
	log    *slog.Logger
}

// Option configures New.
type Option func(*config)

type config struct {
	log     *slog.Logger
	runtime bool
}

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.log = l
		}
	}
}

// WithoutRuntimeMetrics leaves out the Go runtime (go_*) and process
// (process_*) collectors, which are on by default.
func WithoutRuntimeMetrics() Option {
	return func(c *config) { c.runtime = false }
}

// New returns an exporter over src with its collectors registered on a
// registry of its own, so that nothing else in the process (a library
// registering on the global default registry) leaks into /metrics.
func New(src Source, opts ...Option) *Metrics {
	cfg := config{log: slog.New(slog.DiscardHandler), runtime: true}
	for _, o := range opts {
		o(&cfg)
	}
	m := &Metrics{
		reg:    prometheus.NewRegistry(),
		events: newEvents(),
		vm:     newVMEvents(),
		names:  newNameEvents(),
		log:    cfg.log.With("component", "metrics"),
	}
	// MustRegister: the collectors are fixed at compile time, so a clash is
	// a bug in this package that every test run would hit, not a runtime
	// condition.
	m.reg.MustRegister(newSnapshotCollector(src))
	m.reg.MustRegister(m.events.collectors()...)
	m.reg.MustRegister(m.vm.collectors()...)
	m.reg.MustRegister(m.names.collectors()...)
	if cfg.runtime {
		m.reg.MustRegister(
			collectors.NewGoCollector(),
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		)
	}
	return m
}

// Registry returns the registry every metric of m is registered on.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }
