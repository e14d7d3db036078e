package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/cmd/internal/cli"
)

func newGroupCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "group",
		Short: "Kubernetes node groups: every node gets the same GPUs, each node's on one server",
	}
	var (
		nodes   int
		gpus    []string
		forKube bool
	)
	create := &cobra.Command{
		Use:   "create NAME --nodes N [--gpu MODEL[:COUNT] ...]",
		Short: "Create a node group, all of it or nothing",
		Long: `Create a node group of N nodes. With --gpu, every node gets those GPUs, all of
a node's on one server (different nodes may use different servers); if the
nodes cannot all be placed nothing is kept and the exit code is 3, with what
every node could have instead. A group created without --gpu can never get
GPUs later. A name already taken is refused (exit 6); with the name registry,
the same request again is a retry and answers the group.`,
		Args: idArg("one group name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := api.GroupRequest{Nodes: nodes, Kubernetes: forKube}
			if len(gpus) > 0 {
				cr, err := parseClaimRequest(gpus, nil, false)
				if err != nil {
					return err
				}
				req.GPUs = cr.GPUs
			}
			if nodes < 1 {
				return cli.Usagef("--nodes: a group needs at least one node")
			}
			return groupCall(g, cmd, func(ctx context.Context, c *api.Client) (api.Group, error) {
				return c.CreateGroup(ctx, args[0], req)
			})
		},
	}
	create.Flags().IntVar(&nodes, "nodes", 0, "number of nodes")
	create.Flags().StringArrayVar(&gpus, "gpu", nil, "MODEL[:COUNT] per node (repeatable)")
	create.Flags().BoolVar(&forKube, "kubernetes", false, "the nodes are KubeVirt VMs: their GPUs are published to Kubernetes (get NAME.node-I -o kubevirt); docs/kubevirt.md")
	_ = create.RegisterFlagCompletionFunc("gpu", completeModels(g))

	var rgpus []string
	resize := &cobra.Command{
		Use:   "resize NAME --gpu MODEL[:COUNT] [--gpu ...]",
		Short: "Change the GPUs of every node of a group (it must keep at least one)",
		Args:  idArg("one group name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(rgpus) == 0 {
				return cli.Usagef("--gpu: a group with GPUs must keep at least one (and one without GPUs can never get any)")
			}
			cr, err := parseClaimRequest(rgpus, nil, false)
			if err != nil {
				return err
			}
			return groupCall(g, cmd, func(ctx context.Context, c *api.Client) (api.Group, error) {
				return c.ResizeGroup(ctx, args[0], api.ResizeRequest{GPUs: cr.GPUs})
			})
		},
	}
	resize.Flags().StringArrayVar(&rgpus, "gpu", nil, "MODEL[:COUNT] per node (repeatable)")
	_ = resize.RegisterFlagCompletionFunc("gpu", completeModels(g))

	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a group and its nodes' GPUs",
		Args:  idArg("one group name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return groupCall(g, cmd, func(ctx context.Context, c *api.Client) (api.Group, error) { return c.GetGroup(ctx, args[0]) })
		},
	}
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Release every node's GPUs and forget the group",
		Args:  idArg("one group name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return groupCall(g, cmd, func(ctx context.Context, c *api.Client) (api.Group, error) { return c.DeleteGroup(ctx, args[0]) })
		},
	}
	repair := &cobra.Command{
		Use:   "repair NAME",
		Short: "Place again the node claims of a group that were released directly",
		Long: `A node's claim released directly (gpuherd release NAME.node-I) leaves its group
with the node missing; group get lists it. Repair places every missing node
again with the GPUs of the group's other nodes, all or nothing (exit 3 when
they cannot all be placed). A group resize places missing nodes too.`,
		Args: idArg("one group name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return groupCall(g, cmd, func(ctx context.Context, c *api.Client) (api.Group, error) { return c.RepairGroup(ctx, args[0]) })
		},
	}
	cmd.AddCommand(create, resize, get, repair, del)
	return cmd
}

func groupCall(g *globals, cmd *cobra.Command, req func(context.Context, *api.Client) (api.Group, error)) error {
	return call(g, cmd, req, func(w *tabwriter.Writer, gr api.Group) {
		per := "no GPUs (can never get any)"
		if gr.WithGPUs {
			per = api.DescribeItems(gr.GPUs) + " per node"
		}
		fmt.Fprintf(w, "Group %s: %d node(s), %s\n", esc(gr.Name), gr.Nodes, esc(per))
		if len(gr.Claims)+len(gr.Missing) > 0 {
			fmt.Fprintln(w, "NODE CLAIM\tSERVER\tSTATE\tGPUS")
			for _, c := range gr.Claims {
				var addrs []string
				for _, gp := range c.GPUs {
					addrs = append(addrs, gp.PCIAddress)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", esc(c.ID), esc(c.Node), esc(c.State), esc(fmt.Sprint(addrs)))
			}
		}
		for _, id := range gr.Missing {
			fmt.Fprintf(w, "%s\t-\tmissing\t(released; gpuherd group repair %s places it again)\n", esc(id), esc(gr.Name))
		}
	})
}
