package main

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/cmd/internal/cli"
)

// completionTimeout bounds one question to the agent while the shell
// waits: a missing socket fails at once, a hung agent after this.
const completionTimeout = 2 * time.Second

// idArg takes exactly one claim ID (or group name), checked before any
// request: "" or "a/b" is a usage error (exit 2), never a request that the
// API would route to some other endpoint.
func idArg(what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cli.ExactArgs(1, what)(cmd, args); err != nil {
			return err
		}
		return validID(args[0])
	}
}

// complete asks the agent through list and offers the answers that start
// with what is typed. When the agent cannot answer the shell gets nothing
// (and no file names), quickly.
func complete(g *globals, list func(context.Context, *api.Client) ([]string, error)) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		ctx, cancel := context.WithTimeout(cmd.Context(), completionTimeout)
		defer cancel()
		c := g.client()
		defer c.Close()
		all, err := list(ctx, c)
		if err != nil {
			cobra.CompDebugln("gpuherd: "+err.Error(), true)
			return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
		}
		var out []cobra.Completion
		for _, s := range all {
			if strings.HasPrefix(s, toComplete) && safe(s, false) {
				out = append(out, s)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// positional completes the first argument only.
func positional(f cobra.CompletionFunc) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return f(cmd, args, toComplete)
	}
}

// completeClaimIDs offers the IDs of the platform's claims.
func completeClaimIDs(g *globals) cobra.CompletionFunc {
	return positional(complete(g, func(ctx context.Context, c *api.Client) ([]string, error) {
		l, err := c.Claims(ctx)
		var ids []string
		for _, cl := range l.Claims {
			ids = append(ids, cl.ID)
		}
		return ids, err
	}))
}

// completeNodes offers the servers of the platform.
func completeNodes(g *globals) cobra.CompletionFunc {
	return complete(g, func(ctx context.Context, c *api.Client) ([]string, error) {
		ms, err := c.Members(ctx)
		var names []string
		for _, m := range ms {
			names = append(names, m.Name)
		}
		return names, err
	})
}

// completeModels offers the platform's models by their catalog names.
func completeModels(g *globals) cobra.CompletionFunc {
	return complete(g, func(ctx context.Context, c *api.Client) ([]string, error) {
		av, err := c.Availability(ctx)
		var names []string
		for _, m := range av.Models {
			names = append(names, m.Model)
		}
		return names, err
	})
}

// completeGPUs offers this server's GPUs by PCI address.
func completeGPUs(g *globals) cobra.CompletionFunc {
	return positional(complete(g, func(ctx context.Context, c *api.Client) ([]string, error) {
		st, err := c.Status(ctx)
		var addrs []string
		for _, gp := range st.GPUs {
			addrs = append(addrs, gp.PCIAddress)
		}
		return addrs, err
	}))
}
