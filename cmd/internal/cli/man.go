package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/gpuherd/gpuherd/agent"
)

// NewManCmd writes a man page for every command of its root, from the
// commands' own help, so the pages cannot drift from the binary. Hidden:
// the packages run it at build time (packaging.mk); operators read the
// result with man(1). The pages' date is SOURCE_DATE_EPOCH's when set
// (reproducible builds).
func NewManCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:    "man --dir DIR",
		Short:  "Write the man pages of every command into DIR",
		Hidden: true,
		Args:   ExactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return Usagef("--dir: name the directory to write the pages into")
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			root := cmd.Root()
			root.DisableAutoGenTag = true
			err := doc.GenManTreeFromOpts(root, doc.GenManTreeOptions{
				Header: &doc.GenManHeader{
					Section: "1",
					Source:  "gpuherd " + agent.Version,
					Manual:  "gpuherd manual",
				},
				Path:             dir,
				CommandSeparator: "-",
			})
			if err != nil {
				return fmt.Errorf("writing man pages into %s: %w", dir, err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory to write the pages (gpuherd.1, gpuherd-claim.1, ...) into")
	return cmd
}
