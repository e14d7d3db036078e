package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/cmd/internal/cli"
)

func newMembersRemoveCmd(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "remove NODE",
		Short: "Declare a server gone for good: its claims become lost",
		Long: `Declare server NODE gone for good (it will not come back with its ledger).
The claims it held are listed by "gpuherd claims" as lost, on NODE, instead
of leaving every get and release of their IDs waiting for it; their GPUs
went with the server. Release each lost claim once its VM runs elsewhere:
that frees its ID. Names NODE was placing are dropped, and this agent stops
listing NODE as a member. When NODE was a server of the name registry it
is taken out of it too: add a replacement.

A server that gossip still sees alive or suspect is refused (exit 6): it
still runs, with its claims and the VMs on them. Stop it first, or pass
--force. Run it on any other agent; it is safe to run again.`,
		Args: cli.ExactArgs(1, "one server name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(g, cmd, func(ctx context.Context, c *api.Client) (api.MemberRemoval, error) {
				return c.RemoveMember(ctx, args[0], force)
			}, func(w *tabwriter.Writer, r api.MemberRemoval) {
				fmt.Fprintf(w, "Removed %s (it was %s in gossip)\n", esc(r.Node), esc(r.State))
				fmt.Fprintf(w, "Lost claims (%d): %s\n", len(r.Lost), dash(esc(strings.Join(r.Lost, ", "))))
				if len(r.LostGroups) > 0 {
					fmt.Fprintf(w, "Lost node groups (%d): %s\n", len(r.LostGroups), esc(strings.Join(r.LostGroups, ", ")))
				}
				if len(r.Dropped) > 0 {
					fmt.Fprintf(w, "Placements dropped (%d): %s\n", len(r.Dropped), esc(strings.Join(r.Dropped, ", ")))
				}
				if r.RegistryServer {
					fmt.Fprintf(w, "Taken out of the name registry's servers\n")
				}
				for _, s := range r.Warnings {
					fmt.Fprintf(g.stderr, "gpuherd: warning: %s\n", esc(s))
				}
			})
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "remove the server even while gossip sees it alive")
	return cmd
}
