package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const (
	// shutdownTimeout bounds how long a scrape in progress may finish once
	// the agent stops; the agent's own shutdown should not wait on it longer.
	shutdownTimeout = 5 * time.Second
	// maxScrapesInFlight answers further concurrent scrapes with 503 rather
	// than letting a misconfigured scraper pile up Snapshot calls.
	maxScrapesInFlight = 8
)

// Server serves /metrics, /healthz and /readyz over plain HTTP. The
// endpoints are read-only and hold nothing secret, which is why they are
// not behind the agent's mutual TLS.
type Server struct {
	ln        net.Listener
	srv       *http.Server
	log       *slog.Logger
	webConfig string // exporter-toolkit web config file; "" plain HTTP
}

// Listen binds addr (HOST:PORT; port 0 picks a free one, see Addr) and
// returns a Server ready to Serve. ready reports whether the agent can take
// claims; nil means ready whenever the process serves. log may be nil.
func Listen(addr string, m *Metrics, ready func() error, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "metrics")
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("metrics listen address %q: want HOST:PORT: %w", addr, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	return &Server{
		ln:  ln,
		log: log,
		srv: &http.Server{
			Handler:           Handler(m, ready, log),
			ReadHeaderTimeout: 5 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
	}, nil
}

// Addr returns the address the server listens on, with the port it got.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve answers requests until ctx ends, then lets requests in progress
// finish (for up to five seconds) and returns nil. It returns an error only
// when serving itself fails.
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.serve() }()
	s.log.Info("serving metrics", "address", s.ln.Addr().String())

	select {
	case err := <-errc:
		return fmt.Errorf("metrics: serve on %s: %w", s.ln.Addr(), err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := s.srv.Shutdown(shutdownCtx)
	if err != nil {
		// Scrapes still running after the grace period are cut off: the
		// agent is stopping and they would read a state about to vanish.
		s.log.Warn("metrics server did not stop in time; closing connections", "error", err)
		_ = s.srv.Close()
	}
	if serveErr := <-errc; !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("metrics: serve on %s: %w", s.ln.Addr(), serveErr)
	}
	return nil
}

// Close stops a Server that will not Serve, releasing its listener.
func (s *Server) Close() error { return s.srv.Close() }

// Serve listens on addr and serves m until ctx ends; see Listen and
// Server.Serve.
func Serve(ctx context.Context, addr string, m *Metrics, ready func() error, log *slog.Logger) error {
	s, err := Listen(addr, m, ready, log)
	if err != nil {
		return err
	}
	return s.Serve(ctx)
}

// Handler returns the HTTP handler behind Serve: GET /metrics (the
// exposition of m's registry), /healthz (200 while the process serves) and
// /readyz (200 when ready returns nil, else 503 with the reason).
func Handler(m *Metrics, ready func() error, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := m.Registry()
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.InstrumentMetricHandler(reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: scrapeErrorLog{log},
		// One series that cannot be built must not blank the whole scrape,
		// and with it every alert on this server.
		ErrorHandling:       promhttp.ContinueOnError,
		Registry:            reg,
		MaxRequestsInFlight: maxScrapesInFlight,
	})))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				writeText(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
				return
			}
		}
		writeText(w, http.StatusOK, "ready")
	})
	return mux
}

func writeText(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, msg)
}

// scrapeErrorLog adapts slog to promhttp's Println logger.
type scrapeErrorLog struct{ log *slog.Logger }

func (l scrapeErrorLog) Println(v ...any) {
	l.log.Error("metrics scrape error", "error", fmt.Sprint(v...))
}
