package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/agent/telemetry"
)

// Run serves the local API on the unix socket and runs the background loops
// (lease expiry, health checks) until ctx is done. ready, when not nil, is
// called once the socket accepts connections.
func (a *Agent) Run(ctx context.Context, ready func()) error {
	// The socket and the metrics listener were bound, and answer, since
	// New (listeners.go); from here the API takes requests.
	srv, errc := a.lns.apiSrv, a.lns.apiErr
	a.lns.serving.Store(true)
	a.tele.Refresh()
	go a.tele.WatchXID(ctx)
	go a.host.WatchPCI(ctx, a.host.OpenPCIEvents(ctx)) // subscribed before ready: no event is missed
	a.log.Info("serving the local API", "socket", a.cfg.Socket, "node", a.cfg.NodeName)
	if c := a.cluster; c != nil {
		// Seeds may come up after us: keep trying in the background; this
		// server serves its own GPUs meanwhile.
		go func() {
			if err := c.g.Join(ctx); err != nil {
				if ctx.Err() == nil {
					a.log.Error("gossip join gave up", "err", err)
				}
				return
			}
			c.joined.Store(true)
		}()
		go a.RunNotices(ctx)
		go a.RunAntiEntropy(ctx)
		go a.watchMembers(ctx)
		c.publish()
	}
	a.setPhase(phaseServing)
	a.ready.Store(true)
	if ready != nil {
		ready()
	}
	tele := a.clk.NewTicker(telemetry.Interval)
	defer tele.Stop()

	sweep := a.clk.NewTicker(sweepInterval(time.Duration(a.cfg.ReservationLease)))
	defer sweep.Stop()
	health := a.clk.NewTicker(time.Duration(a.cfg.HealthInterval))
	defer health.Stop()
	drivers := a.clk.NewTicker(time.Duration(a.cfg.DriverCheckInterval))
	defer drivers.Stop()
	returns := a.clk.NewTicker(host.ReturnCheckInterval)
	defer returns.Stop()
	for {
		select {
		case <-ctx.Done():
			a.setPhase(phaseStopping)
			a.ready.Store(false)
			// A registry leader hands over first: the others elect no one
			// while it still answers.
			a.registry.Transfer()
			if c := a.cluster; c != nil {
				// A graceful leave: the others stop placing claims here at once.
				c.stop(context.Background())
			}
			shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := srv.Shutdown(shutCtx)
			a.registry.Close() // after the APIs: nothing asks it any more
			a.removeSocket()
			return err
		case err := <-errc:
			return fmt.Errorf("local API on %s: %w", a.cfg.Socket, err)
		case <-sweep.C():
			a.Sweep(ctx)
		case <-health.C():
			a.host.CheckHealth()
		case <-tele.C():
			a.tele.Refresh()
		case <-drivers.C():
			a.host.CheckDrivers(ctx, nil)
		case <-returns.C():
			a.host.CheckReturning(ctx)
		}
	}
}

// sweepInterval checks leases often enough that a reservation outlives its
// deadline by at most a quarter of the lease.
func sweepInterval(lease time.Duration) time.Duration {
	return max(lease/4, 250*time.Millisecond)
}

// listenUnix opens the API socket with mode 0660. A socket file left by a
// crashed agent is replaced; one that still answers belongs to a running
// agent and is an error.
func listenUnix(path, group string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("socket %s exists and is not a socket; remove it or choose another path", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s: another agent is already serving on it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
		}
	}
	// The socket is created with the process umask, then made 0660. Other
	// users cannot connect in between: the service runs with UMask=0077
	// (systemd/gpuherd.service) and `gpuherd agent` masks other users'
	// bits at start (cmd/gpuherd). The umask is not changed here: it is
	// the whole process's, and a file another goroutine created meanwhile
	// (a ledger, a log segment, a test's binary) lost its execute bit.
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if group != "" {
		gid, err := lookupGroup(group)
		if err != nil {
			ln.Close()
			return nil, err
		}
		if err := os.Chown(path, -1, gid); err != nil {
			ln.Close()
			return nil, fmt.Errorf("socket %s: chown to group %s: %w", path, group, err)
		}
	}
	return ln, nil
}

func lookupGroup(name string) (int, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		var unknown user.UnknownGroupError
		if errors.As(err, &unknown) {
			return 0, fmt.Errorf("config: socket_group: no group named %q", name)
		}
		return 0, fmt.Errorf("config: socket_group %q: %w", name, err)
	}
	return strconv.Atoi(g.Gid)
}
