// Command gpuherd is the gpuherd agent and its client.
package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuherd/gpuherd/cmd/internal/cli"
)

func main() { cli.Main(run) }

// run executes one command line and returns its exit code. A failure is
// one line on stderr for people, or with -o json|yaml the API's error shape
// ({"error": {"code", "message", ...}}) on stderr, whatever failed: the
// command line, the connection, or the agent.
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
	if _, printed := err.(*printedError); printed {
		return code
	}
	if out := outputOf(root, args); structured(out) {
		writeError(stderr, out, err)
		return code
	}
	ew := &escapingWriter{w: stderr}
	fmt.Fprintln(ew, "gpuherd: "+err.Error())
	_ = ew.Flush()
	return code
}

// outputOf is the -o the command line asked for: the parsed flag, or, when
// parsing stopped before it, the arguments as written.
func outputOf(root *cobra.Command, args []string) string {
	if f := root.PersistentFlags().Lookup("output"); f != nil && f.Changed {
		return f.Value.String()
	}
	for i, a := range args {
		switch {
		case a == "--":
			return outTable
		case (a == "-o" || a == "--output") && i+1 < len(args):
			return args[i+1]
		case strings.HasPrefix(a, "--output="):
			return strings.TrimPrefix(a, "--output=")
		case strings.HasPrefix(a, "-o") && len(a) > 2:
			return strings.TrimPrefix(strings.TrimPrefix(a, "-o"), "=")
		}
	}
	return outTable
}

// printedError is an error whose text was already written.
type printedError struct{ err error }

func (p *printedError) Error() string { return p.err.Error() }
func (p *printedError) Unwrap() error { return p.err }

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "gpuherd",
		Short: "Hand a server's NVIDIA GPUs to VMs by PCI passthrough",
		Long: `gpuherd runs on every GPU server: it finds the server's NVIDIA cards, binds
them with their whole IOMMU group to vfio-pci, and lets VMs claim all of their
GPUs on one server of the cluster. "gpuherd agent" is the daemon; the other
commands talk to it through its unix socket.

Output: -o table (default) or wide for people; -o json or yaml for programs,
with the same field names everywhere (pci_address; PCI IDs as hex strings
such as "10de"). With json or yaml a failure is written on stderr as
{"error": {"code": "...", "message": "..."}}.

` + exitCodesHelp(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &cli.UsageError{Msg: err.Error()} })
	cli.SocketFlag(root.PersistentFlags(), &g.socket)
	root.PersistentFlags().StringVarP(&g.output, "output", "o", outTable, "output format: "+strings.Join(outputFormats, ", ")+" (claim and get: also libvirt, libvirt-domain, qemu, kubevirt)")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(append(slices.Clone(outputFormats), outLibvirt, outLibvirtDomain, outQEMU, outKubeVirt), cobra.ShellCompDirectiveNoFileComp))
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkOutput(cmd, g.output); err != nil {
			return err
		}
		// Text for people: nothing from the network reaches the terminal
		// as a control sequence. The daemon's log is not for a terminal:
		// its handler quotes what it writes itself.
		if (g.output == outTable || g.output == outWide) && cmd.Name() != "agent" {
			g.stdout = &escapingWriter{w: stdout}
			g.stderr = &escapingWriter{w: stderr}
		}
		return nil
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
		newKubeletPluginCmd(),
		newKubernetesCmd(g),
		newConfigCmd(g),
		cli.NewManCmd(),
	)
	return root
}
