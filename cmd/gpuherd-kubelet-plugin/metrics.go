package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// draMetrics is the kubelet plugin's Prometheus side (dra.Recorder): what
// it prepared and published, on its own listener, for the plugin runs as
// a process of its own.
type draMetrics struct {
	reg        *prometheus.Registry
	prepares   *prometheus.CounterVec
	unprepares *prometheus.CounterVec
	publishes  prometheus.Counter
	devices    prometheus.Gauge
	republish  prometheus.Histogram
}

func newDRAMetrics() *draMetrics {
	m := &draMetrics{
		reg: prometheus.NewRegistry(),
		prepares: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuherd_dra_prepares_total",
			Help: "ResourceClaims the kubelet asked the plugin to prepare, by result (prepared, refused)."}, []string{"result"}),
		unprepares: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuherd_dra_unprepares_total",
			Help: "ResourceClaims the kubelet asked the plugin to unprepare, by result (unprepared, refused)."}, []string{"result"}),
		publishes: prometheus.NewCounter(prometheus.CounterOpts{Name: "gpuherd_dra_slice_publishes_total",
			Help: "Times this node's ResourceSlice was handed to the API server after a change of the agent."}),
		devices: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpuherd_dra_slice_devices",
			Help: "Devices in this node's ResourceSlice as last published."}),
		republish: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gpuherd_dra_republish_seconds",
			Help:    "From the agent's answer to a change to the slice handed to the API server.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 8)}),
	}
	for _, r := range []string{"prepared", "refused"} {
		m.prepares.WithLabelValues(r)
	}
	for _, r := range []string{"unprepared", "refused"} {
		m.unprepares.WithLabelValues(r)
	}
	m.reg.MustRegister(m.prepares, m.unprepares, m.publishes, m.devices, m.republish,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *draMetrics) Prepared(result string)   { m.prepares.WithLabelValues(result).Inc() }
func (m *draMetrics) Unprepared(result string) { m.unprepares.WithLabelValues(result).Inc() }
func (m *draMetrics) Published(devices int, d time.Duration) {
	m.publishes.Inc()
	m.devices.Set(float64(devices))
	m.republish.Observe(d.Seconds())
}

// serve answers /metrics and /healthz on addr until ctx ends.
func (m *draMetrics) serve(ctx context.Context, addr string, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("kubelet plugin metrics stopped", "addr", addr, "err", err)
		}
	}()
	log.Info("kubelet plugin metrics", "addr", ln.Addr().String())
	return nil
}
