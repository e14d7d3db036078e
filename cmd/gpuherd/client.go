package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/cmd/internal/cli"
)

// requestTimeout bounds one command: binding eight cards with their
// functions takes seconds, a stuck one is cut off by the agent's deadline.
const requestTimeout = 2 * time.Minute

type globals struct {
	socket string
	output string
	stdout io.Writer
	stderr io.Writer
}

func (g *globals) client() *api.Client { return api.NewClient(g.socket) }

// show prints v for programs (JSON or YAML), or calls table for people.
func (g *globals) show(v any, table func(w *tabwriter.Writer)) error {
	if structured(g.output) {
		return encode(g.stdout, g.output, v)
	}
	tw := newTable(g.stdout)
	table(tw)
	return tw.Flush()
}

// wide reports whether people asked for the extra columns (-o wide).
func (g *globals) wide() bool { return g.output == outWide }

// fail reports an agent error. For programs it goes back to run, which
// writes it on stderr in the -o format; for people it is one line on
// stderr, followed by the alternatives when the GPUs were not available.
func (g *globals) fail(err error) error {
	ae := asAPIError(err)
	if ae == nil || structured(g.output) || len(ae.Alternatives) == 0 && len(ae.Refusals) == 0 {
		return err
	}
	fmt.Fprintln(g.stderr, "gpuherd: "+ae.Message)
	for _, r := range ae.Refusals {
		fmt.Fprintln(g.stderr, "  refused: "+r)
	}
	if len(ae.Alternatives) == 0 {
		return &printedError{err: err}
	}
	fmt.Fprintln(g.stderr, "Select an alternative GPU:")
	for _, alt := range ae.Alternatives {
		fmt.Fprintf(g.stderr, "  %s   (fits on %d server(s))\n", gpuFlags(alt.GPUs), alt.Servers)
	}
	return &printedError{err: err}
}

// gpuFlags writes items as the claim flags that ask for them:
// --gpu "NVIDIA A100 80GB:1" --gpu "NVIDIA L40S:1".
func gpuFlags(items []api.Item) string {
	var parts []string
	for _, it := range items {
		parts = append(parts, fmt.Sprintf("--gpu %q", fmt.Sprintf("%s:%d", it.Model, it.Count)))
	}
	return strings.Join(parts, " ")
}

func withTimeout(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), requestTimeout)
}

// call runs one request against the agent and shows the answer: JSON for
// programs, table for people; an error from the agent goes through fail.
func call[T any](g *globals, cmd *cobra.Command, req func(context.Context, *api.Client) (T, error), table func(*tabwriter.Writer, T)) error {
	ctx, cancel := withTimeout(cmd)
	defer cancel()
	c := g.client()
	defer c.Close()
	v, err := req(ctx, c)
	if err != nil {
		return g.fail(err)
	}
	return g.show(v, func(w *tabwriter.Writer) { table(w, v) })
}

// callPartial is call for a listing that may lack servers: after the
// answer is shown, check says whether it is complete.
func callPartial[T any](g *globals, cmd *cobra.Command, req func(context.Context, *api.Client) (T, error), check func(T) error, table func(*tabwriter.Writer, T)) error {
	ctx, cancel := withTimeout(cmd)
	defer cancel()
	c := g.client()
	defer c.Close()
	v, err := req(ctx, c)
	if err != nil {
		return g.fail(err)
	}
	if err := g.show(v, func(w *tabwriter.Writer) { table(w, v) }); err != nil {
		return err
	}
	return check(v)
}

func newStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "This server's GPUs and their state",
		Args:  cli.ExactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, cmd, func(ctx context.Context, c *api.Client) (api.Status, error) { return c.Status(ctx) },
				func(w *tabwriter.Writer, st api.Status) {
					fabric := ""
					if st.Fabric != "" && st.Fabric != "none" {
						fabric = "; NVSwitch fabric: " + esc(st.Fabric)
					}
					fmt.Fprintf(w, "NODE %s: %d GPUs%s\n", esc(st.Node), len(st.GPUs), fabric)
					if st.FabricWarning != "" {
						fmt.Fprintf(w, "warning: %s\n", esc(st.FabricWarning))
					}
					for _, p := range st.Storage {
						fmt.Fprintf(w, "warning: storage %s failing since %s (%s: %s): %s\n", esc(p.Store), p.Since.Format(time.RFC3339), esc(p.Op), esc(p.Cause), esc(p.Action))
					}
					head := "PCI ADDRESS\tMODEL\tMEMORY\tNUMA\tGROUP\tDRIVER\tSTATE\tCLAIM"
					if g.wide() {
						head += "\tUUID\tCOMPANIONS"
					}
					fmt.Fprintln(w, head)
					for _, gp := range st.GPUs {
						state := gp.State
						switch {
						case gp.State == api.StateUnhealthy && gp.Health != "":
							state += " (" + gp.Health + ")"
						case gp.Readiness != nil && !gp.Readiness.Ready:
							// the lines below the table say why and what to do
						case gp.Health != "":
							state += " (" + gp.Health + ")"
						case gp.DrainReason != "":
							state += " (" + gp.DrainReason + ")"
						}
						state += inUseNote(gp.InUseBy)
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", esc(gp.PCIAddress), esc(gp.Model), bytesGiB(gp.MemoryBytes),
							intOrDash(gp.NUMANode), intOrDash(gp.IOMMUGroup), dash(esc(gp.Driver)), esc(state), dash(esc(gp.Claim)))
						if g.wide() {
							fmt.Fprintf(w, "\t%s\t%s", dash(esc(gp.UUID)), dash(esc(strings.Join(gp.Companions, ","))))
						}
						fmt.Fprintln(w)
					}
					w.Flush()
					printReadiness(w, st.GPUs)
					printStatusErrors(w, st)
				})
		},
	}
}

func newClaimCmd(g *globals) *cobra.Command {
	var (
		gpus, labels []string
		prefer       string
		ho           handoffFlags
		vcpus        int
		sameNode     bool
		anyNode      bool
		devices      []string
		forKube      bool
	)
	cmd := &cobra.Command{
		Use:   "claim ID --gpu MODEL[:COUNT] [--gpu ...] [--label k=v]",
		Short: "Claim GPUs for a VM, all on one server of the cluster (all of them, or none)",
		Long: `Claim GPUs for the VM or node ID. Every GPU is taken on one server of the
cluster (any agent coordinates: it picks the server that can hold the whole
request, or --prefer-node when that one can) and bound there, with its IOMMU
group, to vfio-pci. MODEL is matched case-insensitively, with or without
"NVIDIA ", spaces and dashes alike, or by a unique abbreviation ("H100 80GB",
"h100-80gb", "L40S"). Claiming again with the same ID and request returns
the same claim. An ID released within remember_released goes back to the
server it last ran on; when that server cannot hold the request the answer
is "not available" with what it can hold (exit code 3), unless --any-node
lets it go elsewhere. Exit code 3 when no server can hold the request (the
alternatives follow), 6 when the ID is held under another request.`,
		Args: idArg("one claim ID"),
		// A new claim's ID is the caller's: nothing to complete.
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := parseClaimRequest(gpus, labels, len(devices) > 0)
			if err != nil {
				return err
			}
			req.Devices = devices
			if forKube {
				if req.Labels == nil {
					req.Labels = map[string]string{}
				}
				req.Labels[api.LabelKubernetes] = "true"
			}
			req.PreferNode = prefer
			if vcpus < 0 || cmd.Flags().Changed("vcpus") && vcpus == 0 {
				return cli.Usagef("--vcpus %d: give the VM's vCPU count, at least 1", vcpus)
			}
			req.VCPUs = vcpus
			if sameNode && anyNode {
				return cli.Usagef("--same-node and --any-node: give one of them")
			}
			req.SameNode = sameNode
			req.AnyNode = anyNode
			return callClaim(g, cmd, ho, func(ctx context.Context, c *api.Client) (api.Claim, error) { return c.Claim(ctx, args[0], req) })
		},
	}
	ho.flags(cmd)
	cmd.Flags().StringArrayVar(&gpus, "gpu", nil, "MODEL[:COUNT] to claim (repeatable)")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "k=v label kept with the claim (repeatable)")
	cmd.Flags().StringSliceVar(&devices, "device", nil, "PCI address of a GPU of this server to take (repeatable): exactly those, --gpu may be left out")
	cmd.Flags().BoolVar(&forKube, "kubernetes", false, "for a KubeVirt VM: its GPUs are published to Kubernetes for its ResourceClaim (-o kubevirt); docs/kubevirt.md")
	cmd.Flags().StringVar(&prefer, "prefer-node", "", "try this server first (default: the server the ID last ran on, when remembered)")
	cmd.Flags().IntVar(&vcpus, "vcpus", 0, "the VM's vCPUs: warns outside 8-16 per GPU")
	cmd.Flags().BoolVar(&sameNode, "same-node", false, "stay on --prefer-node: not available (with alternatives) when it is full (without --prefer-node: the default)")
	cmd.Flags().BoolVar(&anyNode, "any-node", false, "let an ID released within remember_released go to another server when the one it last ran on is full (with a warning)")
	_ = cmd.RegisterFlagCompletionFunc("gpu", completeModels(g))
	_ = cmd.RegisterFlagCompletionFunc("prefer-node", completeNodes(g))
	return cmd
}

// unknownModelName is how gpuherd names an NVIDIA GPU missing from its
// catalog ("10de:2bb5"); its colon is not a count separator.
var unknownModelName = regexp.MustCompile(`^[0-9a-fA-F]{4}:[0-9a-fA-F]{4}$`)

// parseClaimRequest reads --gpu and --label; pinned (--device given)
// needs no --gpu.
func parseClaimRequest(gpus, labels []string, pinned bool) (api.ClaimRequest, error) {
	var req api.ClaimRequest
	if len(gpus) == 0 && !pinned {
		return req, cli.Usagef("--gpu: give at least one, e.g. --gpu \"H100 80GB:2\"")
	}
	for _, s := range gpus {
		it, err := parseGPUFlag(s)
		if err != nil {
			return req, err
		}
		req.GPUs = append(req.GPUs, it)
	}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return req, cli.Usagef("--label %q: use key=value", l)
		}
		if req.Labels == nil {
			req.Labels = map[string]string{}
		}
		if _, dup := req.Labels[k]; dup {
			return req, cli.Usagef("--label %q: key %q given twice", l, k)
		}
		req.Labels[k] = v
	}
	return req, nil
}

func parseGPUFlag(s string) (api.Item, error) {
	model, count := strings.TrimSpace(s), 1
	if i := strings.LastIndex(model, ":"); i >= 0 && !unknownModelName.MatchString(model) {
		n, err := strconv.Atoi(strings.TrimSpace(model[i+1:]))
		if err != nil {
			return api.Item{}, cli.Usagef("--gpu %q: count %q is not a number (use MODEL[:COUNT])", s, model[i+1:])
		}
		model, count = strings.TrimSpace(model[:i]), n
	}
	if model == "" {
		return api.Item{}, cli.Usagef("--gpu %q: model is empty (use MODEL[:COUNT])", s)
	}
	if count < 1 {
		return api.Item{}, cli.Usagef("--gpu %q: count must be at least 1", s)
	}
	return api.Item{Model: model, Count: count}, nil
}

func printClaim(w io.Writer, cl api.Claim, wide bool) {
	fmt.Fprintf(w, "Claim %s on %s: %s, %d GPU(s)\n", esc(cl.ID), esc(cl.Node), esc(claimState(cl)), len(cl.GPUs))
	if wide {
		fmt.Fprintf(w, "Models: %s\n", esc(api.DescribeItems(cl.Items)))
		fmt.Fprintf(w, "Labels: %s\n", dash(esc(labelList(cl.Labels))))
		fmt.Fprintf(w, "Created: %s\n", timeOrDash(cl.CreatedAt))
		if !cl.CommittedAt.IsZero() {
			fmt.Fprintf(w, "Committed: %s\n", timeOrDash(cl.CommittedAt))
		}
		if !cl.ExpiresAt.IsZero() {
			fmt.Fprintf(w, "Reservation expires: %s\n", timeOrDash(cl.ExpiresAt))
		}
	}
	fmt.Fprintln(w, "PCI ADDRESS\tMODEL\tGROUP\tVFIO DEVICE")
	for _, gp := range cl.GPUs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", esc(gp.PCIAddress), esc(gp.Model), intOrDash(gp.IOMMUGroup), dash(esc(gp.VFIODevice)))
	}
	if d := cl.Domain; d != nil {
		state := "starting"
		if d.Started {
			state = "running"
		}
		fmt.Fprintf(w, "In use by libvirt domain %s (%s), %s since %s\n", dash(d.Name), d.UUID, state, d.Since.Format(time.RFC3339))
	}
}

func newReleaseCmd(g *globals) *cobra.Command {
	var force, ignoreNotFound bool
	cmd := &cobra.Command{
		Use:   "release ID",
		Short: "Release a claim, from any agent; its GPUs go back to the idle driver",
		Long: `Release the claim ID wherever it is held; its GPUs go back to the idle driver.
The answer shows the claim as released (state "released") with the GPUs it
freed. A claim whose GPUs a running VM holds open is not released (exit code
6) unless --force: the GPUs are then offered to nobody, and stay on vfio-pci,
until the VM lets go of them. Exit code 4 when no server holds the ID; with
--ignore-not-found that is success (exit 0, nothing printed), so that a
script can release idempotently.`,
		Args:              idArg("one claim ID"),
		ValidArgsFunction: completeClaimIDs(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := withTimeout(cmd)
			defer cancel()
			c := g.client()
			defer c.Close()
			cl, err := c.ReleaseWith(ctx, args[0], api.ReleaseRequest{Force: force})
			if err != nil {
				if ignoreNotFound && errorCode(err) == api.CodeNotFound {
					return nil
				}
				return g.fail(err)
			}
			if err := g.show(cl, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "Released %s on %s: %d GPU(s) freed\n", esc(cl.ID), esc(cl.Node), len(cl.GPUs))
			}); err != nil {
				return err
			}
			g.warn(cl.Warnings)
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "release even while a VM uses the GPUs (they return once it stops)")
	cmd.Flags().BoolVar(&ignoreNotFound, "ignore-not-found", false, "exit 0 when no server holds the claim")
	return cmd
}

func newGetCmd(g *globals) *cobra.Command {
	var ho handoffFlags
	cmd := &cobra.Command{
		Use:               "get ID",
		Short:             "Show one claim, from any agent",
		Long:              "Show claim ID wherever it is held. Exit code 4 when no server holds it.",
		Args:              idArg("one claim ID"),
		ValidArgsFunction: completeClaimIDs(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			return callClaim(g, cmd, ho, func(ctx context.Context, c *api.Client) (api.Claim, error) { return c.Get(ctx, args[0]) })
		},
	}
	ho.flags(cmd)
	return cmd
}

func newClaimsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "claims",
		Short: "List every claim of the platform, from any agent",
		Long: `List the claims of every server of the platform. When a server does not
answer, its claims are missing: the list is then marked partial (a warning
on stderr naming each server; "partial": true and "unanswered" in JSON and
YAML) and the exit code is 5, so that a shorter list never looks complete.`,
		Args: cli.ExactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := withTimeout(cmd)
			defer cancel()
			c := g.client()
			defer c.Close()
			l, err := c.Claims(ctx)
			if err != nil {
				return g.fail(err)
			}
			if l.Claims == nil {
				l.Claims = []api.Claim{}
			}
			if err := g.show(l, func(w *tabwriter.Writer) {
				head := "ID\tNODE\tSTATE\tGPUS\tMODELS"
				if g.wide() {
					head += "\tPCI ADDRESSES\tLABELS\tCREATED"
				}
				fmt.Fprintln(w, head)
				for _, cl := range l.Claims {
					fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s", esc(cl.ID), esc(cl.Node), esc(claimState(cl)), len(cl.GPUs), esc(api.DescribeItems(cl.Items)))
					if g.wide() {
						var addrs []string
						for _, gp := range cl.GPUs {
							addrs = append(addrs, gp.PCIAddress)
						}
						fmt.Fprintf(w, "\t%s\t%s\t%s", dash(esc(strings.Join(addrs, ","))), dash(esc(labelList(cl.Labels))), timeOrDash(cl.CreatedAt))
					}
					fmt.Fprintln(w)
				}
			}); err != nil {
				return err
			}
			if !l.Partial {
				return nil
			}
			return partial(g, "list", "their claims are missing", l.Unanswered)
		},
	}
}

// partial is the end of a listing that lacks servers: a warning on stderr
// naming each (in the table format; "partial" and "unanswered" carry them
// in JSON and YAML), and an unavailable error, exit 5, so that a script
// never takes a shorter answer for a complete one.
func partial(g *globals, what, missing string, unanswered []api.Unanswered) error {
	names := make([]string, len(unanswered))
	for i, u := range unanswered {
		names[i] = u.Node
		if !structured(g.output) {
			fmt.Fprintf(g.stderr, "gpuherd: warning: %s did not answer: %s\n", esc(u.Node), esc(u.Reason))
		}
	}
	return &api.Error{Code: api.CodeUnavailable,
		Message: fmt.Sprintf("partial %s: %d server(s) did not answer (%s); %s", what, len(names), strings.Join(names, ", "), missing)}
}

func newAvailabilityCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "availability",
		Short: "Every GPU model of the catalog and how many are free",
		Long: `List every GPU model of the platform and how many are free, as this agent
sees the servers (its own ledger, the others' gossip). When the agent lacks a
server's capacity (gossip not joined yet, a summary it cannot read, a server
it has seen before that its gossip does not list now), the counts may be
short: the answer is marked partial (a warning on stderr naming each server;
"partial": true and "unanswered" in JSON and YAML) and the exit code is 5.`,
		Args: cli.ExactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return callPartial(g, cmd, func(ctx context.Context, c *api.Client) (api.Availability, error) { return c.Availability(ctx) },
				func(av api.Availability) error {
					if !av.Partial {
						return nil
					}
					return partial(g, "availability", "their GPUs are not counted", av.Unanswered)
				},
				func(w *tabwriter.Writer, av api.Availability) {
					fmt.Fprintf(w, "As seen by %s (%d server(s))\n", esc(av.Node), av.Servers)
					head := "MODEL\tAVAILABLE\tFREE\tTOTAL\tMOST ON ONE SERVER"
					if g.wide() {
						head += "\tHEALTHY"
					}
					fmt.Fprintln(w, head)
					for _, m := range av.Models {
						avail := "Unavailable"
						if m.Available {
							avail = "Available"
						}
						total := fmt.Sprint(m.Total)
						if m.Unusable > 0 {
							total += fmt.Sprintf(" (%d unusable)", m.Unusable)
						}
						fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%d", esc(m.Model), avail, m.Free, total, m.MaxFreeOnOneServer)
						if g.wide() {
							fmt.Fprintf(w, "\t%d", m.Healthy)
						}
						fmt.Fprintln(w)
					}
				})
		},
	}
}

func newDrainCmd(g *globals, drain bool) *cobra.Command {
	var (
		reason string
		server bool
	)
	use, short := "drain PCI_ADDRESS | --server", "Stop new claims on a GPU or on the whole server (existing claims stay)"
	if !drain {
		use, short = "undrain PCI_ADDRESS | --server", "Offer a drained GPU, or a drained server, again"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args: func(cmd *cobra.Command, args []string) error {
			if server {
				return cli.ExactArgs(0, "no PCI address with --server")(cmd, args)
			}
			return cli.ExactArgs(1, "one PCI address (e.g. 0000:3b:00.0) or --server")(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := withTimeout(cmd)
			defer cancel()
			c := g.client()
			defer c.Close()
			if server {
				var (
					m   api.Member
					err error
				)
				if drain {
					m, err = c.DrainServer(ctx, reason)
				} else {
					m, err = c.UndrainServer(ctx)
				}
				if err != nil {
					return g.fail(err)
				}
				return g.show(m, func(w *tabwriter.Writer) {
					state := "takes new claims"
					if m.Drained {
						state = "drained: no new claims"
					}
					fmt.Fprintf(w, "server %s: %s\n", esc(m.Name), state)
				})
			}
			var (
				gp  api.GPU
				err error
			)
			if drain {
				gp, err = c.Drain(ctx, args[0], reason)
			} else {
				gp, err = c.Undrain(ctx, args[0])
			}
			if err != nil {
				return g.fail(err)
			}
			return g.show(gp, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "%s (%s): %s\n", esc(gp.PCIAddress), esc(gp.Model), esc(gp.State))
			})
		},
	}
	cmd.ValidArgsFunction = completeGPUs(g)
	cmd.Flags().BoolVar(&server, "server", false, "the whole server this agent runs on")
	if drain {
		cmd.Flags().StringVar(&reason, "reason", "", "why (shown in status and members)")
	}
	return cmd
}

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this binary",
		Args:  cli.ExactArgs(0, "no arguments"),
		RunE: func(*cobra.Command, []string) error {
			v := agent.VersionInfo()
			return g.show(v, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "gpuherd %s", v.Version)
				if v.Commit != "" {
					fmt.Fprintf(w, " (%s)", v.Commit)
				}
				fmt.Fprintf(w, " %s\n", v.Go)
			})
		},
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func intOrDash(n int) string {
	if n < 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

func timeOrDash(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// labelList writes labels as k=v,k=v in key order.
func labelList(labels map[string]string) string {
	parts := make([]string, 0, len(labels))
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+"="+labels[k])
	}
	return strings.Join(parts, ",")
}

func bytesGiB(b uint64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f GiB", float64(b)/(1<<30))
}

// printStatusErrors writes, under the status table, what the agent could
// not read: a GPU's device (its DRIVER is "-"), and the processes holding
// VFIO groups open (a VM's use may then be missing from STATE).
func printStatusErrors(w io.Writer, st api.Status) {
	for _, gp := range st.GPUs {
		if gp.DriverError != "" {
			fmt.Fprintf(w, "warning: %s: driver unknown, the device cannot be read: %s\n", esc(gp.PCIAddress), esc(gp.DriverError))
		}
	}
	if st.InUseError != "" {
		fmt.Fprintf(w, "warning: which VMs hold GPUs open is not known for every GPU: %s; check proc_root and the agent's permissions\n", esc(st.InUseError))
	}
}
