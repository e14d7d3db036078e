// Command gpuherd is the gpuherd agent and its client.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/gpuherd/gpuherd/agent/api"
)

// Exit codes, as documented in the README.
const (
	exitOK           = 0
	exitError        = 1
	exitUsage        = 2
	exitNotAvailable = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError is bad input from the command line: exit 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// run executes one command line and returns its exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runInput(ctx, args, nil, stdout, stderr)
}

// runInput is run with stdin (nil: the process's own).
func runInput(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	if stdin != nil {
		root.SetIn(stdin)
	}
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	code := exitCode(err)
	if _, printed := err.(*printedError); !printed {
		fmt.Fprintln(stderr, "gpuherd: "+err.Error())
	}
	return code
}

// printedError is an error whose text was already written (as JSON).
type printedError struct{ err error }

func (p *printedError) Error() string { return p.err.Error() }
func (p *printedError) Unwrap() error { return p.err }

func exitCode(err error) int {
	var (
		ue *usageError
		ae *api.Error
	)
	switch {
	case errors.As(err, &ue):
		return exitUsage
	case errors.As(err, &ae):
		switch ae.Code {
		case api.CodeNotAvailable:
			return exitNotAvailable
		case api.CodeInvalid, api.CodeUnknownModel:
			return exitUsage
		case api.CodeInUse:
			return exitInUse
		}
		return exitError
	case isCobraUsage(err):
		return exitUsage
	}
	return exitError
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "gpuherd",
		Short: "Hand a server's NVIDIA GPUs to VMs by PCI passthrough",
		Long: `gpuherd runs on every GPU server: it finds the server's NVIDIA cards, binds
them with their whole IOMMU group to vfio-pci, and lets VMs claim all of their
GPUs on one server. "gpuherd agent" is the daemon; the other commands talk to
it through its unix socket.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{msg: err.Error()} })
	socket := os.Getenv("GPUHERD_SOCKET")
	if socket == "" {
		socket = defaultSocket
	}
	root.PersistentFlags().StringVar(&g.socket, "socket", socket, "the agent's unix socket (env GPUHERD_SOCKET)")
	root.PersistentFlags().StringVarP(&g.output, "output", "o", "table", "output format: table or json (claim and get: also libvirt, libvirt-domain, qemu)")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		return checkOutput(cmd, g.output)
	}
	root.AddCommand(
		newAgentCmd(g),
		newStatusCmd(g),
		newClaimCmd(g),
		newReleaseCmd(g),
		newGetCmd(g),
		newClaimsCmd(g),
		newAvailabilityCmd(g),
		newDrainCmd(g, true),
		newDrainCmd(g, false),
		newInventoryCmd(g),
		newVersionCmd(g),
		newMembersCmd(g),
		newResizeCmd(g),
		newGroupCmd(g),
		newGossipCmd(g),
		newTLSCmd(g),
		newLedgerCmd(g),
		newLibvirtHookCmd(g),
		newConfigCmd(g),
	)
	return root
}

// isCobraUsage recognises cobra's own argument errors, which it returns as
// plain errors.
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "accepts ", "requires at least", "unknown flag", "unknown shorthand flag", "flag needs an argument", "invalid argument"} {
		if len(msg) >= len(p) && (msg[:len(p)] == p) {
			return true
		}
	}
	return false
}
