package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/internal/testport"
)

// Bounds of the waits. The whole demo takes a few seconds; these only
// matter when something is wrong, and then they keep it from hanging.
const (
	startTimeout    = 20 * time.Second // an agent's socket answering
	joinTimeout     = 20 * time.Second // every agent seeing every other alive
	convergeTimeout = 10 * time.Second // gossip carrying a change everywhere
	stopTimeout     = 10 * time.Second // SIGTERM to exit, before SIGKILL
	pollInterval    = 50 * time.Millisecond
	logTailLines    = 15
)

// maxSocketPath is the longest unix socket path Linux accepts (sun_path
// holds 108 bytes with the terminating NUL).
const maxSocketPath = 107

// server is one simulated GPU server of the demo and its agent.
type server struct {
	n       int    // 1-based, as the transcript names it ("agent 1")
	profile string // the simulated hardware
	name    string // node name, also the name in its certificate

	dataDir    string
	socket     string
	logPath    string
	gossipAddr string
	peerAddr   string

	cmd     *exec.Cmd
	logFile *os.File
	exited  chan struct{} // closed once the process was waited for
	waitErr error         // the process's exit, set before exited is closed
	stopped bool          // the demo stopped it on purpose
	client  *api.Client   // for the demo's own checks and waits
}

// alive reports whether the agent process still runs.
func (s *server) alive() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// platform is the demo's cluster: the directory, the shared secrets and the
// four servers.
type platform struct {
	t       *transcript
	dir     string // $D in the transcript
	pkiDir  string
	keyFile string
	servers []*server
}

// profiles are the servers the demo starts, in order; the first is the
// gossip seed of the others.
var profiles = []string{"dgx-h100", "l40s-4", "a100-pcie-4", "rtx6000pro-2"}

func newPlatform(t *transcript, dir string) *platform {
	p := &platform{t: t, dir: dir, pkiDir: filepath.Join(dir, "pki"), keyFile: filepath.Join(dir, "gossip.key")}
	for i, prof := range profiles {
		name := prof
		sd := filepath.Join(dir, name)
		p.servers = append(p.servers, &server{
			n:       i + 1,
			profile: prof,
			name:    name,
			dataDir: filepath.Join(sd, "data"),
			socket:  filepath.Join(sd, "api.sock"),
			logPath: filepath.Join(sd, "agent.log"),
		})
	}
	return p
}

// secrets makes the CA, a certificate per server and the gossip key, with
// the gpuherd commands an operator would run.
func (p *platform) secrets(ctx context.Context) error {
	r, err := p.t.run(ctx, "tls", "ca", "--dir", p.pkiDir)
	if err != nil {
		return err
	}
	if err := r.wantOK(); err != nil {
		return err
	}
	for _, s := range p.servers {
		r, err := p.t.run(ctx, "tls", "cert", s.name, "--ca-dir", p.pkiDir, "--out", p.pkiDir, "--host", "127.0.0.1")
		if err != nil {
			return err
		}
		if err := r.wantOK(); err != nil {
			return err
		}
	}
	key, err := p.t.runTo(ctx, p.keyFile, "gossip", "keygen")
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(key)) == 0 {
		return errors.New("gpuherd gossip keygen printed no key")
	}
	p.t.say("The key file is mode 0600: whoever reads it can join the gossip and read it.")
	return nil
}

// start picks free loopback ports and starts every agent: the seed first,
// then the others at once, which join it. It returns once every socket
// answers and every agent sees the four servers alive.
func (p *platform) start(ctx context.Context) error {
	for _, s := range p.servers {
		if len(s.socket) > maxSocketPath {
			return fmt.Errorf("socket path %s is %d bytes, longer than unix sockets allow (%d); set TMPDIR to a shorter directory", s.socket, len(s.socket), maxSocketPath)
		}
	}
	ports, err := testport.Free(2 * len(p.servers))
	if err != nil {
		return fmt.Errorf("finding free loopback ports: %w", err)
	}
	for i, s := range p.servers {
		s.gossipAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2*i]))
		s.peerAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2*i+1]))
	}
	seed := p.servers[0]
	if err := p.startAgent(seed); err != nil {
		return err
	}
	if err := p.waitSocket(ctx, seed); err != nil {
		return err
	}
	for _, s := range p.servers[1:] {
		if err := p.startAgent(s); err != nil {
			return err
		}
	}
	begin := time.Now()
	for _, s := range p.servers[1:] {
		if err := p.waitSocket(ctx, s); err != nil {
			return err
		}
	}
	if err := p.waitJoined(ctx); err != nil {
		return err
	}
	p.t.say(fmt.Sprintf("Every agent answers on its socket and sees the %d servers alive, %s after the last ones started.",
		len(p.servers), time.Since(begin).Round(time.Millisecond)))
	return nil
}

// agentArgs is the command line of s's agent.
func (p *platform) agentArgs(s *server) []string {
	return []string{"agent",
		"--simulate", s.profile,
		"--node-name", s.name,
		"--data-dir", s.dataDir,
		"--socket", s.socket,
		"--gossip-addr", s.gossipAddr,
		"--peer-addr", s.peerAddr,
		"--advertise-addr", "127.0.0.1",
		"--join", p.servers[0].gossipAddr,
		"--gossip-key-file", p.keyFile,
		"--tls-ca", filepath.Join(p.pkiDir, "ca.crt"),
		"--tls-cert", filepath.Join(p.pkiDir, s.name+".crt"),
		"--tls-key", filepath.Join(p.pkiDir, s.name+".key"),
		"--idle-driver", "nvidia",
		"--reservation-lease", "10s",
	}
}

// startAgent starts s's agent in the background, its output to its log.
func (p *platform) startAgent(s *server) error {
	if err := os.MkdirAll(s.dataDir, 0o700); err != nil {
		return err
	}
	logFile, err := os.Create(s.logPath)
	if err != nil {
		return err
	}
	args := p.agentArgs(s)
	p.t.command(args, fmt.Sprintf(" > %s 2>&1 &", p.t.path(s.logPath)))
	cmd := exec.Command(p.t.bin, args...)
	cmd.Env = p.t.env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting the agent of %s: %w", s.name, err)
	}
	s.cmd, s.logFile, s.exited = cmd, logFile, make(chan struct{})
	s.client = api.NewClient(s.socket)
	go func() {
		s.waitErr = cmd.Wait()
		logFile.Close()
		close(s.exited)
	}()
	return nil
}

// waitSocket waits until s's agent answers on its socket.
func (p *platform) waitSocket(ctx context.Context, s *server) error {
	err := p.poll(ctx, startTimeout, func(ctx context.Context) (bool, error) {
		_, err := s.client.Version(ctx)
		return err == nil, nil
	})
	if err != nil && !errors.Is(err, errAgentDied) {
		err = fmt.Errorf("the agent of %s did not answer on %s: %w", s.name, s.socket, err)
	}
	return err
}

// waitJoined waits until every agent lists every server as alive.
func (p *platform) waitJoined(ctx context.Context) error {
	var last string
	err := p.poll(ctx, joinTimeout, func(ctx context.Context) (bool, error) {
		for _, s := range p.servers {
			ms, err := s.client.Members(ctx)
			if err != nil {
				last = fmt.Sprintf("%s: %v", s.name, err)
				return false, nil
			}
			alive := 0
			for _, m := range ms {
				if m.State == "alive" {
					alive++
				}
			}
			if alive != len(p.servers) {
				last = fmt.Sprintf("%s sees %d of %d servers alive", s.name, alive, len(p.servers))
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil && !errors.Is(err, errAgentDied) {
		err = fmt.Errorf("the agents did not form one cluster (%s): %w", last, err)
	}
	return err
}

// converge waits until gossip carried every server's capacity and drain
// flag to every agent, so that the next step, through any agent, sees the
// platform as it is. It returns how long that took.
func (p *platform) converge(ctx context.Context) (time.Duration, error) {
	begin := time.Now()
	var last string
	err := p.poll(ctx, convergeTimeout, func(ctx context.Context) (bool, error) {
		views := make([][]api.Member, len(p.servers))
		for i, s := range p.servers {
			ms, err := s.client.Members(ctx)
			if err != nil {
				last = fmt.Sprintf("%s: %v", s.name, err)
				return false, nil
			}
			views[i] = ms
		}
		truth := map[string]string{} // each server as it describes itself
		for _, ms := range views {
			for _, m := range ms {
				if m.Self {
					truth[m.Name] = memberKey(m)
				}
			}
		}
		for i, ms := range views {
			for _, m := range ms {
				if m.State != "alive" || memberKey(m) != truth[m.Name] {
					last = fmt.Sprintf("%s sees %s as %s %s, it is %s", p.servers[i].name, m.Name, m.State, memberKey(m), truth[m.Name])
					return false, nil
				}
			}
		}
		return true, nil
	})
	if err != nil {
		if !errors.Is(err, errAgentDied) {
			err = fmt.Errorf("gossip did not converge (%s): %w", last, err)
		}
		return 0, err
	}
	return time.Since(begin), nil
}

// memberKey sums up what gossip says of a server: drained, and free/total
// per model.
func memberKey(m api.Member) string {
	var b strings.Builder
	fmt.Fprintf(&b, "drained=%v", m.Drained)
	for _, mc := range m.Models {
		fmt.Fprintf(&b, " %s=%d/%d", mc.Model, mc.Free, mc.Total)
	}
	return b.String()
}

// poll calls cond every pollInterval until it is true, it fails, timeout
// passes or an agent dies.
func (p *platform) poll(ctx context.Context, timeout time.Duration, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if err := p.deadAgent(); err != nil {
			return err
		}
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		ok, err := cond(cctx)
		ccancel()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("gave up after %s", timeout)
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// errAgentDied: an agent the demo started exited on its own.
var errAgentDied = errors.New("agent exited")

// deadAgent is an error naming the first agent that exited on its own.
func (p *platform) deadAgent() error {
	for _, s := range p.servers {
		if s.cmd != nil && !s.stopped && !s.alive() {
			return fmt.Errorf("%w: the agent of %s ended (%v); its log is %s", errAgentDied, s.name, s.waitErr, s.logPath)
		}
	}
	return nil
}

// tail is the end of s's log, under a line naming the file.
func (p *platform) tail(s *server) string {
	data, err := os.ReadFile(s.logPath)
	if err != nil || len(bytes.TrimSpace(data)) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	return fmt.Sprintf("--- last lines of %s ---\n%s", s.logPath, strings.Join(lines, "\n"))
}

// stop ends every agent the demo started, one at a time and the seed last:
// SIGTERM (the agent leaves the gossip cluster gracefully, which the others
// acknowledge while they still run), then SIGKILL if it is still running
// after stopTimeout. It returns once every process is gone.
func (p *platform) stop(w io.Writer) {
	for i := len(p.servers) - 1; i >= 0; i-- {
		s := p.servers[i]
		if s.cmd == nil {
			continue
		}
		s.stopped = true
		s.client.Close()
		if !s.alive() {
			continue
		}
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(stopTimeout):
			fmt.Fprintf(w, "The agent of %s did not stop within %s of SIGTERM; killing it.\n", s.name, stopTimeout)
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
}
