package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/cmd/internal/cli"
	"github.com/gpuherd/gpuherd/gossip"
)

func newMembersCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "members",
		Short: "The servers of the platform, their state and free capacity",
		Long: `List the servers of the platform with their state and free capacity. A
server this agent has seen before but whose state its gossip does not know
now (not heard of since the agent started, or gone for longer than gossip
remembers) is listed with state "unknown": the list is then partial (a
warning on stderr naming it) and the exit code is 5. members remove NODE
takes a server that is gone for good off the list.`,
		Args: cli.ExactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return callPartial(g, cmd, func(ctx context.Context, c *api.Client) ([]api.Member, error) { return c.Members(ctx) },
				func(ms []api.Member) error {
					var unknown []api.Unanswered
					for _, m := range ms {
						if m.State == api.MemberUnknown {
							unknown = append(unknown, api.Unanswered{Node: m.Name, Reason: "its state is unknown to this agent's gossip (not heard of since the agent started, or gone for longer than gossip remembers)"})
						}
					}
					if len(unknown) == 0 {
						return nil
					}
					return partial(g, "member list", "their state and capacity are unknown", unknown)
				},
				func(w *tabwriter.Writer, ms []api.Member) { printMembers(w, ms, g.wide()) })
		},
	}
	cmd.AddCommand(newMembersRemoveCmd(g))
	return cmd
}

func newResizeCmd(g *globals) *cobra.Command {
	var gpus []string
	cmd := &cobra.Command{
		Use:   "resize ID --gpu MODEL[:COUNT] [--gpu ...]",
		Short: "Change a claim's GPUs (model or count); in place when its server can, else moved",
		Long: `Change the GPUs of claim ID. When its server can hold the new request the
claim changes in place, atomically; otherwise it moves to a server that can
(the VM restarts anyway). Exit code 3 when no server can hold it; the claim is
then unchanged.`,
		Args:              idArg("one claim ID"),
		ValidArgsFunction: completeClaimIDs(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := parseClaimRequest(gpus, nil, false)
			if err != nil {
				return err
			}
			return call(g, cmd, func(ctx context.Context, c *api.Client) (api.Claim, error) {
				return c.Resize(ctx, args[0], api.ResizeRequest{GPUs: req.GPUs})
			},
				func(w *tabwriter.Writer, cl api.Claim) { printClaim(w, cl, g.wide()) })
		},
	}
	cmd.Flags().StringArrayVar(&gpus, "gpu", nil, "MODEL[:COUNT] the claim should hold (repeatable)")
	_ = cmd.RegisterFlagCompletionFunc("gpu", completeModels(g))
	return cmd
}

func newGossipCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "gossip", Short: "Gossip encryption keys"}
	cmd.AddCommand(&cobra.Command{
		Use:   "keygen",
		Short: "Print a new random gossip key (base64, 32 bytes) for the key file",
		Long: `Print a new AES-256 key for gossip_key_file. The file holds one key per line;
the first encrypts, every one decrypts. To rotate: add the new key as the
second line on every server and reload (SIGHUP); move it to the first line
everywhere and reload; remove the old line and reload.`,
		Args: cli.ExactArgs(0, "no arguments"),
		RunE: func(*cobra.Command, []string) error {
			k, err := gossip.GenerateKey()
			if err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, k)
			return nil
		},
	})
	return cmd
}

// printMembers writes the members table; a member whose gossip summary
// cannot be read shows "-" for what it would have said, and its error on
// a line under the table.
func printMembers(w *tabwriter.Writer, ms []api.Member, wide bool) {
	head := "SERVER\tSTATE\tDRAINED\tFREE/TOTAL\tVERSION\tREGISTRY"
	if wide {
		head += "\tADDRESS"
	}
	fmt.Fprintln(w, head)
	for _, m := range ms {
		var caps []string
		for _, mc := range m.Models {
			c := fmt.Sprintf("%s %d/%d", mc.Model, mc.Free, mc.Total)
			if mc.Unusable > 0 {
				c += fmt.Sprintf(" (%d unusable)", mc.Unusable)
			}
			caps = append(caps, c)
		}
		name := m.Name
		if m.Self {
			name += " (this)"
		}
		drained := "no"
		if m.Drained {
			drained = "yes"
		}
		if m.SummaryError != "" {
			drained = "-"
		}
		role := m.NamesRole
		if m.NamesLeader {
			role += " (leader)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s", esc(name), esc(m.State), drained, dash(esc(strings.Join(caps, ", "))), dash(esc(m.AgentVersion)), dash(esc(role)))
		if wide {
			fmt.Fprintf(w, "\t%s", dash(esc(m.Addr)))
		}
		fmt.Fprintln(w)
	}
	w.Flush()
	for _, m := range ms {
		if m.SummaryError != "" {
			fmt.Fprintf(w, "warning: %s: its gossip summary cannot be read (%s): its capacity, version and drain are unknown and no claim is placed there; run the same gpuherd version on every server (gpuherd version there)\n",
				esc(m.Name), esc(m.SummaryError))
		}
	}
}
