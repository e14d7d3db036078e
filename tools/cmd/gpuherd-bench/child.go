package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
)

// childEnv carries an agent configuration (JSON) to a re-executed copy of
// this program, which then runs that one agent in its own process: its RSS
// and CPU are then one agent's, not a share of many.
const childEnv = "GPUHERD_BENCH_CHILD_AGENT"

// runChild is the child's main: one agent until SIGTERM.
func runChild(spec string) int {
	var cfg agent.Config
	if err := json.Unmarshal([]byte(spec), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	if path := os.Getenv(childStatsEnv); path != "" {
		serveChildStats(path)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	a, err := agent.New(ctx, cfg, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer a.Close()
	if err := a.Run(ctx, func() {}); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// childAgent is one agent in a process of its own, joined to the cluster.
type childAgent struct {
	cmd    *exec.Cmd
	socket string
	name   string
}

func startChild(c *cluster, name, profile string) (*childAgent, error) {
	files, err := c.issue(name)
	if err != nil {
		return nil, err
	}
	gport, err := freePort()
	if err != nil {
		return nil, err
	}
	pport, err := freePort()
	if err != nil {
		return nil, err
	}
	cfg := c.config(name, profile, files, gport, pport, c.nodes0().gossip)
	cmd, err := spawnAgent(cfg, "")
	if err != nil {
		return nil, err
	}
	ch := &childAgent{cmd: cmd, socket: cfg.Socket, name: name}
	// Ready when it sees the whole cluster through its own API.
	cli := api.NewClient(cfg.Socket)
	defer cli.Close()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ms, err := cli.Members(ctx)
		cancel()
		if err == nil {
			alive := 0
			for _, m := range ms {
				if m.State == "alive" {
					alive++
				}
			}
			if alive >= len(c.nodes)+1 {
				return ch, nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	ch.stop()
	return nil, fmt.Errorf("child agent %s did not see the cluster within 60s", name)
}

func (ch *childAgent) stop() {
	_ = ch.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = ch.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = ch.cmd.Process.Kill()
		<-done
	}
}
