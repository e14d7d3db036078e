package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"log/syslog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/handoff"
	"github.com/gpuherd/gpuherd/agent/sim"
	"github.com/gpuherd/gpuherd/cmd/internal/cli"
	"github.com/gpuherd/gpuherd/vfio"
	"github.com/gpuherd/gpuherd/vfio/fakekernel"
)

// Output formats that hand a claim to a hypervisor (claim and get only).
const (
	outLibvirt       = "libvirt"
	outLibvirtDomain = "libvirt-domain"
	outQEMU          = "qemu"
)

// annHandoff marks a command that takes the hand-off output formats.
const annHandoff = "gpuherd/handoff"

// checkOutput refuses an output format the command cannot write.
func checkOutput(cmd *cobra.Command, out string) error {
	switch out {
	case outTable, outWide, outJSON, outYAML:
		return nil
	case outLibvirt, outLibvirtDomain, outQEMU, outKubeVirt:
		if cmd.Annotations[annHandoff] != "" {
			return nil
		}
		return cli.Usagef("--output %q: only claim and get write it; use %s", out, strings.Join(outputFormats, ", "))
	}
	if cmd.Annotations[annHandoff] != "" {
		return cli.Usagef("--output %q: use %s, libvirt, libvirt-domain, qemu or kubevirt", out, strings.Join(outputFormats, ", "))
	}
	return cli.Usagef("--output %q: use %s", out, strings.Join(outputFormats, ", "))
}

// handoffFlags are claim's and get's options for the hand-off formats.
type handoffFlags struct {
	releaseOnStop bool
	guestBus      uint
	kubevirt      kubevirtFlags
}

func (h *handoffFlags) flags(cmd *cobra.Command) {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[annHandoff] = "yes"
	cmd.Flags().BoolVar(&h.releaseOnStop, "release-on-stop", false,
		"-o libvirt, libvirt-domain: the domain's stop releases the claim (gpuherd's libvirt hook)")
	cmd.Flags().UintVar(&h.guestBus, "guest-bus", handoff.DefaultGuestBus,
		"-o libvirt, libvirt-domain: guest PCI bus of the first GPU (one bus per GPU)")
	h.kubevirt.flags(cmd)
	long := strings.TrimSpace(cmd.Long)
	if long == "" {
		long = cmd.Short + "."
	}
	cmd.Long = long + `

-o libvirt prints gpuherd's <metadata> element and one <hostdev
managed='no'> per PCI function (each GPU with its audio function on one guest
slot), -o libvirt-domain a minimal domain holding them, -o qemu QEMU's
-device arguments. See docs/libvirt.md. -o kubevirt prints the ResourceClaim
pinned to the claim's GPUs and what goes into a KubeVirt VM for them, for a
claim made with --kubernetes. See docs/kubevirt.md.`
}

func (h handoffFlags) options() handoff.Options {
	return handoff.Options{ReleaseOnStop: h.releaseOnStop, GuestBus: h.guestBus}
}

// callClaim runs a request that answers one claim and prints it in the
// format asked for.
func callClaim(g *globals, cmd *cobra.Command, ho handoffFlags, req func(context.Context, *api.Client) (api.Claim, error)) error {
	switch g.output {
	case outLibvirt, outLibvirtDomain, outQEMU, outKubeVirt:
	default:
		return call(g, cmd, req, func(w *tabwriter.Writer, cl api.Claim) { printClaim(w, cl, g.wide()); g.warn(cl.Warnings) })
	}
	if ho.guestBus < 1 || ho.guestBus > 0xff {
		return cli.Usagef("--guest-bus %d: use 1 to 255", ho.guestBus)
	}
	ctx, cancel := withTimeout(cmd)
	defer cancel()
	c := g.client()
	defer c.Close()
	cl, err := req(ctx, c)
	if err != nil {
		return g.fail(err)
	}
	g.warn(cl.Warnings)
	var out []byte
	switch g.output {
	case outLibvirt:
		out, err = handoff.Libvirt(cl, ho.options())
	case outLibvirtDomain:
		out, err = handoff.DomainXML(cl, ho.options())
	case outQEMU:
		out, err = handoff.QEMU(cl)
	case outKubeVirt:
		out, err = ho.kubevirt.render(cl)
	}
	if err != nil {
		return err
	}
	_, err = g.stdout.Write(out)
	return err
}

// hookTimeout bounds one hook call: libvirt waits for it with the domain's
// lock held.
const hookTimeout = 30 * time.Second

func newLibvirtHookCmd(g *globals) *cobra.Command {
	var configPath string
	cmd := &cobra.Command{
		Use:   "libvirt-hook [--config FILE] -- NAME OP SUBOP EXTRA",
		Short: "libvirt's QEMU hook: start a domain only on GPUs claimed for it",
		Long: `libvirt's QEMU hook (installed as /etc/libvirt/hooks/qemu.d/50-gpuherd):
libvirt runs it with the domain's name, the operation, the sub-operation and
an extra argument, and the domain's XML on stdin.

prepare begin: a domain with no gpuherd metadata and no hostdev that is one
of this server's GPUs (read from sysfs) passes at once, agent running or not.
Otherwise every such hostdev must belong to the claim the metadata names (or
the claim named like the domain), committed on this server, each GPU on
vfio-pci, and the claim is marked in use by the domain's UUID; else the start
is refused with one line, e.g. "The following GPUs are not claimed by vm-b:
0000:41:00.0", which says what to do; a domain that passes this server's GPUs
without gpuherd's metadata (found by its namespace URI, whatever the prefix)
is told the virsh metadata command that adds it. started/reconnect begin
mark the running domain (never fail).
release end: when the metadata says release-on-stop, the claim is released,
only if this domain marked it and started. migrate/restore begin refuse a
domain whose GPUs are not claimed here. It never calls libvirt.

The agent's socket and sysfs root come from --config (missing file: the
defaults); --socket or GPUHERD_SOCKET override the socket.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) < 3 || len(args) > 4 {
				return cli.Usagef("expected NAME OP SUBOP [EXTRA] from libvirt, got %d argument(s)", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runHook(cmd, g, configPath, args)
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().StringVar(&configPath, "config", "/etc/gpuherd/gpuherd.yaml", "the agent's YAML configuration (for its socket and sysfs root)")
	return cmd
}

func runHook(cmd *cobra.Command, g *globals, configPath string, args []string) error {
	logOut := g.stderr
	if g.stderr == os.Stderr {
		// libvirt shows a hook's stderr only when it fails the call: the
		// problems of calls that must not fail (started, reconnect,
		// release) go to the system log too.
		if w, err := syslog.New(syslog.LOG_WARNING|syslog.LOG_DAEMON, "gpuherd-libvirt-hook"); err == nil {
			defer w.Close()
			logOut = io.MultiWriter(g.stderr, w)
		}
	}
	log := slog.New(slog.NewTextHandler(logOut, nil))
	cfg := agent.DefaultConfig()
	if err := agent.LoadConfigFile(configPath, &cfg); err != nil && !errors.Is(err, fs.ErrNotExist) {
		log.Warn("libvirt hook: using the default settings", "err", err)
		cfg = agent.DefaultConfig()
	}
	socket := cfg.Socket
	if cli.SocketGiven(cmd) {
		socket = g.socket
	}
	extra, err := vfio.ParseAllowList(cfg.GPUDevices)
	if err != nil {
		log.Warn("libvirt hook: ignoring gpu_devices", "err", err)
		extra = nil
	}
	client := api.NewClient(socket)
	defer client.Close()
	h := &handoff.Hook{
		Agent:   client,
		Devices: handoff.SysfsDevices{PCI: vfio.New(hookSysfs(cfg, log)), Extra: extra},
		Log:     log,
		Socket:  socket,
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), hookTimeout)
	defer cancel()
	if err := h.Run(ctx, args, cmd.InOrStdin()); err != nil {
		// One line, as it is: libvirt prefixes it with its own context.
		fmt.Fprintln(g.stderr, strings.ReplaceAll(err.Error(), "\n", " "))
		return &printedError{err: err}
	}
	return nil
}

// hookSysfs is the sysfs the hook reads: the host's, or, for an agent on
// simulated hardware, the simulated machine's state file, which outlives
// the agent as a real machine does (read only: the hook never writes it).
func hookSysfs(cfg agent.Config, log *slog.Logger) vfio.FS {
	if cfg.Simulate == "" {
		return vfio.NewOSFS(cfg.SysfsRoot, cfg.DevRoot)
	}
	path := filepath.Join(cfg.DataDir, sim.KernelStateFile)
	if _, err := os.Stat(path); err == nil {
		k, err := fakekernel.Open(path, fakekernel.Config{})
		if err == nil {
			return k
		}
		log.Warn("libvirt hook: cannot read the simulated machine", "err", err)
	}
	// No machine yet: an empty tree, where nothing is a GPU.
	return vfio.NewOSFS(filepath.Join(cfg.DataDir, "no-simulated-sysfs"), filepath.Join(cfg.DataDir, "no-simulated-dev"))
}
