// Package cli is what gpuherd's two binaries share: gpuherd (the agent and
// its client) and gpuherd-kubelet-plugin (the DRA driver, a binary of its
// own so that the agent does not link Kubernetes' client). Their logger,
// how they read the agent's configuration and find its socket, their usage
// errors (exit 2) and their man pages.
package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpuherd/gpuherd/agent"
)

// LoadConfig is the agent's configuration: the defaults, then the file at
// path when one is named.
func LoadConfig(path string) (agent.Config, error) {
	cfg := agent.DefaultConfig()
	if path != "" {
		if err := agent.LoadConfigFile(path, &cfg); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// SocketEnv names the agent's socket for every command, as --socket does.
const SocketEnv = "GPUHERD_SOCKET"

// SocketFlag adds --socket to fs: the agent's unix socket, by default
// $GPUHERD_SOCKET or agent.DefaultSocket.
func SocketFlag(fs *pflag.FlagSet, dst *string) {
	socket := os.Getenv(SocketEnv)
	if socket == "" {
		socket = agent.DefaultSocket
	}
	fs.StringVar(dst, "socket", socket, "the agent's unix socket (env "+SocketEnv+")")
}

// SocketGiven says whether the command line or the environment named the
// socket, which then wins over a configuration file's.
func SocketGiven(cmd *cobra.Command) bool {
	f := cmd.Flag("socket")
	return f != nil && f.Changed || os.Getenv(SocketEnv) != ""
}

// UsageError is bad input from the command line: exit 2.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// Usagef is a UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// ExactArgs wants n arguments, what describing them, or is a UsageError.
func ExactArgs(n int, what string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return Usagef("expected %s, got %d argument(s)", what, len(args))
		}
		return nil
	}
}

// Main runs a binary's command line, os.Args, under a context that SIGINT
// and SIGTERM cancel, and exits with run's exit code.
func Main(run func(ctx context.Context, args []string, stdout, stderr io.Writer) int) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
