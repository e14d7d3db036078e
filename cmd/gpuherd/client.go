package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
)

const defaultSocket = agent.DefaultSocket

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

func (g *globals) json() bool { return g.output == "json" }

// show prints v as JSON, or calls table for people.
func (g *globals) show(v any, table func(w *tabwriter.Writer)) error {
	if g.json() {
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// fail reports an agent error: as JSON on stdout for programs (the exit
// code still tells the class), as one line on stderr for people, followed
// by the alternatives when the GPUs were not available.
func (g *globals) fail(err error) error {
	var ae *api.Error
	if !errors.As(err, &ae) {
		return err
	}
	if g.json() {
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(api.ErrorBody{Error: ae})
		return &printedError{err: err}
	}
	if len(ae.Alternatives) == 0 && len(ae.Refusals) == 0 {
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

func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("expected %s, got %d argument(s)", what, len(args))
		}
		return nil
	}
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

func newStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "This server's GPUs and their state",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, cmd, func(ctx context.Context, c *api.Client) (api.Status, error) { return c.Status(ctx) },
				func(w *tabwriter.Writer, st api.Status) {
					fabric := ""
					if st.Fabric != "" && st.Fabric != "none" {
						fabric = "; NVSwitch fabric: " + st.Fabric
					}
					fmt.Fprintf(w, "NODE %s: %d GPUs%s\n", st.Node, len(st.GPUs), fabric)
					if st.FabricWarning != "" {
						fmt.Fprintf(w, "warning: %s\n", st.FabricWarning)
					}
					fmt.Fprintln(w, "PCI ADDRESS\tMODEL\tMEMORY\tNUMA\tGROUP\tDRIVER\tSTATE\tCLAIM")
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
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", gp.PCIAddress, gp.Model, bytesGiB(gp.MemoryBytes),
							intOrDash(gp.NUMANode), intOrDash(gp.IOMMUGroup), dash(gp.Driver), state, dash(gp.Claim))
					}
					w.Flush()
					printReadiness(w, st.GPUs)
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
	)
	cmd := &cobra.Command{
		Use:   "claim ID --gpu MODEL[:COUNT] [--gpu ...] [--label k=v]",
		Short: "Claim GPUs on this server for a VM (all of them, or none)",
		Long: `Claim GPUs for the VM or node ID. Every GPU is taken on this server and bound,
with its IOMMU group, to vfio-pci. MODEL is matched case-insensitively, with or
without "NVIDIA ", spaces and dashes alike, or by a unique abbreviation
("H100 80GB", "h100-80gb", "L40S"). Claiming again with the same ID and request
returns the same claim. Exit code 3 when the server cannot hold the request.`,
		Args: exactArgs(1, "one claim ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := parseClaimRequest(gpus, labels)
			if err != nil {
				return err
			}
			req.PreferNode = prefer
			if vcpus < 0 || cmd.Flags().Changed("vcpus") && vcpus == 0 {
				return usagef("--vcpus %d: give the VM's vCPU count, at least 1", vcpus)
			}
			req.VCPUs = vcpus
			req.SameNode = sameNode
			return callClaim(g, cmd, ho, func(ctx context.Context, c *api.Client) (api.Claim, error) { return c.Claim(ctx, args[0], req) })
		},
	}
	ho.flags(cmd)
	cmd.Flags().StringArrayVar(&gpus, "gpu", nil, "MODEL[:COUNT] to claim (repeatable)")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "k=v label kept with the claim (repeatable)")
	cmd.Flags().StringVar(&prefer, "prefer-node", "", "try this server first (default: the server the ID last ran on, when remembered)")
	cmd.Flags().IntVar(&vcpus, "vcpus", 0, "the VM's vCPUs: warns outside 8-16 per GPU")
	cmd.Flags().BoolVar(&sameNode, "same-node", false, "stay on --prefer-node, or on the server the ID last ran on: not available (with alternatives) when it is full")
	return cmd
}

// unknownModelName is how gpuherd names an NVIDIA GPU missing from its
// catalog ("10de:2bb5"); its colon is not a count separator.
var unknownModelName = regexp.MustCompile(`^[0-9a-fA-F]{4}:[0-9a-fA-F]{4}$`)

func parseClaimRequest(gpus, labels []string) (api.ClaimRequest, error) {
	var req api.ClaimRequest
	if len(gpus) == 0 {
		return req, usagef("--gpu: give at least one, e.g. --gpu \"H100 80GB:2\"")
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
			return req, usagef("--label %q: use key=value", l)
		}
		if req.Labels == nil {
			req.Labels = map[string]string{}
		}
		if _, dup := req.Labels[k]; dup {
			return req, usagef("--label %q: key %q given twice", l, k)
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
			return api.Item{}, usagef("--gpu %q: count %q is not a number (use MODEL[:COUNT])", s, model[i+1:])
		}
		model, count = strings.TrimSpace(model[:i]), n
	}
	if model == "" {
		return api.Item{}, usagef("--gpu %q: model is empty (use MODEL[:COUNT])", s)
	}
	if count < 1 {
		return api.Item{}, usagef("--gpu %q: count must be at least 1", s)
	}
	return api.Item{Model: model, Count: count}, nil
}

func printClaim(w io.Writer, cl api.Claim) {
	fmt.Fprintf(w, "Claim %s on %s: %s, %d GPU(s)\n", cl.ID, cl.Node, cl.State, len(cl.GPUs))
	fmt.Fprintln(w, "PCI ADDRESS\tMODEL\tGROUP\tVFIO DEVICE")
	for _, gp := range cl.GPUs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", gp.PCIAddress, gp.Model, intOrDash(gp.IOMMUGroup), dash(gp.VFIODevice))
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
	var force bool
	cmd := &cobra.Command{
		Use:   "release ID",
		Short: "Release a claim; its GPUs go back to the idle driver",
		Long: `Release the claim ID wherever it is held; its GPUs go back to the idle driver.
A claim whose GPUs a running VM holds open is not released (exit code 6) unless
--force: the GPUs are then offered to nobody, and stay on vfio-pci, until the VM
lets go of them.`,
		Args: exactArgs(1, "one claim ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(g, cmd, func(ctx context.Context, c *api.Client) (api.Claim, error) {
				return c.ReleaseWith(ctx, args[0], api.ReleaseRequest{Force: force})
			},
				func(w *tabwriter.Writer, cl api.Claim) {
					fmt.Fprintf(w, "Released %s on %s: %d GPU(s) freed\n", cl.ID, cl.Node, len(cl.GPUs))
				})
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "release even while a VM uses the GPUs (they return once it stops)")
	return cmd
}

func newGetCmd(g *globals) *cobra.Command {
	var ho handoffFlags
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show one claim",
		Args:  exactArgs(1, "one claim ID"),
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
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := withTimeout(cmd)
			defer cancel()
			c := g.client()
			defer c.Close()
			cls, err := c.Claims(ctx)
			if err != nil {
				return g.fail(err)
			}
			if cls == nil {
				cls = []api.Claim{}
			}
			return g.show(cls, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "ID\tNODE\tSTATE\tGPUS\tMODELS")
				for _, cl := range cls {
					fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\n", cl.ID, cl.Node, cl.State, len(cl.GPUs), api.DescribeItems(cl.Items))
				}
			})
		},
	}
}

func newAvailabilityCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "availability",
		Short: "Every GPU model of the catalog and how many are free",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, cmd, func(ctx context.Context, c *api.Client) (api.Availability, error) { return c.Availability(ctx) },
				func(w *tabwriter.Writer, av api.Availability) {
					fmt.Fprintf(w, "As seen by %s (%d server(s))\n", av.Node, av.Servers)
					fmt.Fprintln(w, "MODEL\tAVAILABLE\tFREE\tTOTAL\tMOST ON ONE SERVER")
					for _, m := range av.Models {
						avail := "Unavailable"
						if m.Available {
							avail = "Available"
						}
						total := fmt.Sprint(m.Total)
						if m.Unusable > 0 {
							total += fmt.Sprintf(" (%d unusable)", m.Unusable)
						}
						fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%d\n", m.Model, avail, m.Free, total, m.MaxFreeOnOneServer)
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
				return exactArgs(0, "no PCI address with --server")(cmd, args)
			}
			return exactArgs(1, "one PCI address (e.g. 0000:3b:00.0) or --server")(cmd, args)
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
					fmt.Fprintf(w, "server %s: %s\n", m.Name, state)
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
				fmt.Fprintf(w, "%s (%s): %s\n", gp.PCIAddress, gp.Model, gp.State)
			})
		},
	}
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
		Args:  exactArgs(0, "no arguments"),
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

func bytesGiB(b uint64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f GiB", float64(b)/(1<<30))
}
