package main

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/cmd/internal/cli"
)

// ledgerFlags pick the ledger file: --file, or ledger.db in --data-dir (or
// in the data_dir of --config).
type ledgerFlags struct {
	dataDir, config, file string
	wait                  time.Duration
}

func (f *ledgerFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.dataDir, "data-dir", agent.DefaultConfig().DataDir, "the agent's data directory")
	cmd.Flags().StringVar(&f.config, "config", "", "take data_dir from this agent configuration file")
	cmd.Flags().StringVar(&f.file, "file", "", "a ledger file anywhere (a backup to check before restoring it)")
	cmd.Flags().DurationVar(&f.wait, "lock-wait", 2*time.Second, "how long to wait for an agent to let go of the file")
}

func (f *ledgerFlags) path(cmd *cobra.Command) (string, error) {
	if f.file != "" {
		if cmd.Flags().Changed("data-dir") || f.config != "" {
			return "", cli.Usagef("--file excludes --data-dir and --config")
		}
		return f.file, nil
	}
	cfg, err := cli.LoadConfig(f.config)
	if err != nil {
		return "", err
	}
	if f.config == "" || cmd.Flags().Changed("data-dir") {
		cfg.DataDir = f.dataDir
	}
	return cfg.LedgerPath(), nil
}

func newLedgerCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ledger",
		Short: "Check, back up or repair the claims ledger of a stopped agent",
		Long: `The ledger (ledger.db in the data directory) is the truth about who holds
which GPU of this server. "check" reads it without writing and says exactly
what is wrong with it; "backup" makes a consistent copy; "remove-claim"
deletes one claim record the agent refuses to start with. All need the
agent stopped: a running agent holds the file locked. The recovery procedure is in
the README, "Ledger problems".`,
	}
	cmd.AddCommand(newLedgerCheckCmd(g), newLedgerBackupCmd(g), newLedgerRemoveClaimCmd(g))
	return cmd
}

func newLedgerCheckCmd(g *globals) *cobra.Command {
	var f ledgerFlags
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Verify every page and record of the ledger, read-only, and list its claims",
		Long: `Open the ledger read-only, run bbolt's page check, read every record as the
agent would at start, and print the claims, drains and revision it holds.
Every problem is listed: an unreadable record, a GPU in two claims, a claim
naming a GPU the ledger does not hold, a claim whose items do not match its
GPUs' models. Writes that the ledger's journal holds and the file does not
yet (an agent killed or crashed) are applied to a copy and included, as the
agent would at start. Exit 0 when the agent would accept the file, 1 when it
would not. Nothing is ever written.`,
		Args: cli.ExactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, err := f.path(cmd)
			if err != nil {
				return err
			}
			rep, err := ledger.Inspect(path, f.wait)
			var ie *ledger.IntegrityError
			if errors.As(err, &ie) {
				// Every problem, then one line on what to do.
				if serr := g.show(rep, func(w *tabwriter.Writer) { printProblems(w, rep) }); serr != nil {
					return serr
				}
				return fmt.Errorf("ledger %s: %d problem(s), listed above; the agent refuses to start on it: find which claim is right with the VMs running here (virsh list), then restore a backup or run `gpuherd ledger remove-claim ID` for each wrong claim: %w",
					path, len(ie.Problems), ledger.ErrIntegrity)
			}
			if err != nil {
				return err
			}
			return g.show(rep, func(w *tabwriter.Writer) { printLedger(w, rep, "ok") })
		},
	}
	f.add(cmd)
	return cmd
}

func newLedgerBackupCmd(g *globals) *cobra.Command {
	var (
		f   ledgerFlags
		out string
	)
	cmd := &cobra.Command{
		Use:   "backup --out FILE",
		Short: "Copy the ledger of a stopped agent, checked, to FILE",
		Long: `Check the ledger as "ledger check" does, then write a consistent copy to FILE
(through a temporary file, fsynced, renamed into place; mode 0600) and check
the copy. A damaged ledger is not copied: keep the file itself instead.`,
		Args: cli.ExactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return cli.Usagef("--out FILE is required")
			}
			path, err := f.path(cmd)
			if err != nil {
				return err
			}
			if abs, _ := filepath.Abs(out); abs == mustAbs(path) {
				return cli.Usagef("--out %s is the ledger itself", out)
			}
			rep, err := ledger.BackupFile(path, out, f.wait)
			if err != nil {
				return err
			}
			return g.show(rep, func(w *tabwriter.Writer) { printLedger(w, rep, "backup of "+path) })
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&out, "out", "", "the backup file to write")
	return cmd
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

func printLedger(w *tabwriter.Writer, rep ledger.Report, what string) {
	fmt.Fprintf(w, "LEDGER %s: %s, schema %d, revision %d, %d claims, %d drained GPUs, %d bytes\n",
		rep.Path, what, rep.Schema, rep.Revision, len(rep.Claims), len(rep.Drains), rep.Size)
	if rep.JournalPending > 0 {
		fmt.Fprintf(w, "journal: %d writes not yet in the file (the agent stopped without closing it); included above, and applied at its next start\n", rep.JournalPending)
	}
	if len(rep.Claims) > 0 {
		fmt.Fprintln(w, "CLAIM\tSTATE\tGPUS\tCREATED\tEXPIRES")
		for _, c := range rep.Claims {
			exp := "-"
			if !c.ExpiresAt.IsZero() {
				exp = c.ExpiresAt.Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", c.ID, c.State, strings.Join(c.GPUs, ","), c.CreatedAt.Format(time.RFC3339), exp)
		}
	}
	for _, addr := range slices.Sorted(maps.Keys(rep.Drains)) {
		fmt.Fprintf(w, "drained %s: %s\n", addr, rep.Drains[addr].Reason)
	}
}

func newLedgerRemoveClaimCmd(g *globals) *cobra.Command {
	var f ledgerFlags
	cmd := &cobra.Command{
		Use:   "remove-claim ID",
		Short: "Delete one claim record from the ledger of a stopped agent",
		Long: `Delete the record of claim ID from the ledger file, readable or not, in one
fsynced write: the way out of a ledger the agent refuses to start with
("ledger check" lists why). Find first which claim is right: compare with
the VMs running on this server (virsh list) and the platform's records. The
claim's GPUs are free when the agent starts again; a GPU a running VM still
holds open is kept back until the VM lets go. Back the file up first
(cp, not "ledger backup", which refuses a damaged ledger).`,
		Args: cli.ExactArgs(1, "one claim ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := f.path(cmd)
			if err != nil {
				return err
			}
			c, err := ledger.RemoveClaim(path, args[0], f.wait)
			if errors.Is(err, ledger.ErrNotFound) {
				return &apiError{Code: api.CodeNotFound, Message: err.Error()}
			}
			if err != nil {
				return err
			}
			return g.show(c, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "removed claim %s (%s, GPUs %s) from %s\n", c.ID, orDash(string(c.State)), orDash(strings.Join(c.GPUs, ",")), path)
			})
		},
	}
	f.add(cmd)
	return cmd
}

func printProblems(w *tabwriter.Writer, rep ledger.Report) {
	fmt.Fprintf(w, "LEDGER %s: %d problem(s)\n", rep.Path, len(rep.Problems))
	fmt.Fprintln(w, "RECORD\tGPU\tPROBLEM")
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "%s/%s\t%s\t%s\n", p.Bucket, p.Key, orDash(p.PCIAddress), p.Problem)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
