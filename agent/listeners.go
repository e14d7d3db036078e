package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/metrics"
)

// Start-up phases, as gpuherd_agent_start_phase and /readyz name them.
const (
	phaseChecking    = "checking"
	phaseDiscovering = "discovering"
	phaseReconciling = "reconciling"
	phaseJoining     = "joining"
	phaseNaming      = "naming"
	phaseServing     = "serving"
	phaseStopping    = "stopping"
)

var phases = []string{phaseChecking, phaseDiscovering, phaseReconciling, phaseJoining, phaseNaming, phaseServing, phaseStopping}

// listeners are every socket the agent serves on, bound before it moves
// any driver: a socket it cannot have (a missing socket_group, a port in
// use, a bad path) then fails the start with the machine untouched. The
// local API and the metrics answer from then on: the API with 503
// "starting" until Run, the metrics with the start-up phase.
type listeners struct {
	api     net.Listener
	apiSrv  *http.Server
	apiErr  chan error
	metrics *metrics.Server
	metCtx  context.Context
	metStop context.CancelFunc
	peer    net.Listener // nil when this server runs alone
	names   net.Listener // the registry's raft; nil when this agent runs none
	// serving turns true in Run: the API handler takes requests.
	serving atomic.Bool
}

// bindListeners binds the local API socket (with its group), the metrics
// listener and the peer listener, and starts answering on the first two.
func (a *Agent) bindListeners() (err error) {
	l := &listeners{apiErr: make(chan error, 1)}
	a.lns = l
	defer func() {
		if err != nil {
			l.close()
			a.lns = nil
		}
	}()
	if l.api, err = listenUnix(a.cfg.Socket, a.cfg.SocketGroup); err != nil {
		return err
	}
	if a.cfg.MetricsAddr != "" {
		ms, err := metrics.Listen(a.cfg.MetricsAddr, a.metrics, a.readiness, a.log)
		if err != nil {
			return fmt.Errorf("metrics_addr: %w", err)
		}
		l.metrics = ms
		if a.cfg.MetricsWebConfig != "" {
			if err := ms.UseWebConfig(a.cfg.MetricsWebConfig); err != nil {
				return fmt.Errorf("metrics_web_config: %w", err)
			}
		}
	}
	if a.cfg.GossipAddr != "" && a.peerNet == nil { // a PeerNetwork needs no socket
		if l.peer, err = net.Listen("tcp", a.cfg.PeerAddr); err != nil {
			return fmt.Errorf("peer_addr %s: %w", a.cfg.PeerAddr, err)
		}
		if a.names == nil && a.cfg.runsRaft() {
			if l.names, err = net.Listen("tcp", a.cfg.namesAddr()); err != nil {
				return fmt.Errorf("names_addr %s: %w", a.cfg.namesAddr(), err)
			}
		}
	}
	handler := api.NewHandler(a, a.log)
	l.apiSrv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !l.serving.Load() {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Retry-After", "2")
				w.WriteHeader(http.StatusServiceUnavailable)
				_ = json.NewEncoder(w).Encode(api.ErrorBody{Error: &api.Error{Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable,
					Message: fmt.Sprintf("the agent on %s is starting (%s); try again shortly", a.cfg.NodeName, a.phase())}})
				return
			}
			handler.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       a.requestReadTimeout(),
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
	}
	go func() { l.apiErr <- l.apiSrv.Serve(l.api) }()
	if l.metrics != nil {
		l.metCtx, l.metStop = context.WithCancel(context.Background())
		go func() {
			if err := l.metrics.Serve(l.metCtx); err != nil {
				a.log.Error("metrics listener stopped", "addr", a.cfg.MetricsAddr, "err", err)
			}
		}()
		a.log.Info("serving metrics", "addr", l.metrics.Addr().String())
	}
	return nil
}

// close stops everything bindListeners started; safe on a partial set.
func (l *listeners) close() {
	if l == nil {
		return
	}
	if l.apiSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = l.apiSrv.Shutdown(ctx)
		cancel()
	}
	if l.api != nil {
		// Also when Serve's goroutine has not started yet: Shutdown
		// closes only the listeners Serve tracks, and the socket would
		// answer after Close returned (a restart in the same process
		// then finds "another agent already serving").
		l.api.Close()
	}
	if l.metStop != nil {
		l.metStop()
	} else if l.metrics != nil {
		_ = l.metrics.Close()
	}
	if l.peer != nil {
		l.peer.Close()
	}
	if l.names != nil {
		l.names.Close()
	}
}

// setPhase records what start-up (or shutdown) is doing.
func (a *Agent) setPhase(p string) {
	a.startPhase.Store(p)
	a.log.Debug("agent phase", "phase", p)
}

func (a *Agent) phase() string {
	if p, ok := a.startPhase.Load().(string); ok {
		return p
	}
	return phaseChecking
}

// startedSnapshot is the metrics' view of the agent: while New is still
// filling the agent in, only the build (and gpuherd_agent_phase, collected
// apart) is exported; the rest is not there to read yet.
func (a *Agent) startedSnapshot() metrics.Snapshot {
	if !a.started.Load() {
		v := VersionInfo()
		return metrics.Snapshot{Build: metrics.BuildInfo{Version: v.Version, Revision: v.Commit, GoVersion: v.Go}}
	}
	return a.metricsSnapshot()
}

// phaseCollector exports gpuherd_agent_phase: 1 for the phase the agent is
// in, 0 for the others, so a long bind at start is visible as such rather
// than as a dead agent.
type phaseCollector struct {
	a    *Agent
	desc *prometheus.Desc
}

func newPhaseCollector(a *Agent) *phaseCollector {
	return &phaseCollector{a: a, desc: prometheus.NewDesc("gpuherd_agent_phase",
		"What the agent is doing: checking, discovering, reconciling, joining, naming, serving or stopping (1 for the current phase).",
		[]string{"phase"}, nil)}
}

func (c *phaseCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *phaseCollector) Collect(ch chan<- prometheus.Metric) {
	cur := c.a.phase()
	for _, p := range phases {
		v := 0.0
		if p == cur {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, p)
	}
}

// readiness is what /readyz reports: 503 with the reason while the agent
// starts, and again whenever it cannot serve claims (its ledger refuses
// writes, or gossip has not joined the cluster) or one of its stores
// fails to write (storage.go).
func (a *Agent) readiness() error {
	if !a.ready.Load() {
		if p := a.phase(); p == phaseStopping {
			return errors.New("stopping: leaving the cluster, finishing requests in progress")
		}
		return fmt.Errorf("starting: %s", a.phase())
	}
	if a.ledger != nil {
		if err := a.ledger.WriteError(); err != nil {
			return fmt.Errorf("ledger unwritable: %w", err)
		}
	}
	if err := a.storage.err(); err != nil {
		return err
	}
	if c := a.cluster; c != nil && !c.joined.Load() {
		return errors.New("gossip not joined: no seed has answered yet")
	}
	return nil
}

// removeSocket removes the API socket at shutdown.
func (a *Agent) removeSocket() { _ = os.Remove(a.cfg.Socket) }
