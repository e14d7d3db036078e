package main

import (
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/cmd/internal/cli"
)

// defaultConfigPath is the packaged configuration file.
const defaultConfigPath = "/etc/gpuherd/gpuherd.yaml"

// configProblem is one thing wrong with a configuration.
type configProblem struct {
	Key     string `json:"key,omitempty"`
	Message string `json:"message"`
}

type configReport struct {
	Config   string          `json:"config"`
	OK       bool            `json:"ok"`
	Problems []configProblem `json:"problems"`
}

func newConfigCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Check the agent's configuration",
	}
	var path string
	check := &cobra.Command{
		Use:   "check",
		Short: "Validate a configuration without touching any device",
		Long: `Validate the agent's configuration the way the agent does at start, without
touching any device or binding any port: every key (an unknown one is named
with the closest known key), every value, offered_models against the model
catalog, the paths, the socket group, the ports, the TLS files (the chain to
the CA, the certificate naming node_name, a private key only its owner can
read) and the gossip key file's owner and mode. Every problem is listed;
the exit code is 1 when there is any.`,
		Args: cli.ExactArgs(0, "no arguments"),
		RunE: func(*cobra.Command, []string) error {
			rep := checkConfig(path)
			if err := g.show(rep, func(w *tabwriter.Writer) {
				if rep.OK {
					fmt.Fprintf(w, "%s: ok\n", rep.Config)
					return
				}
				for _, p := range rep.Problems {
					fmt.Fprintln(w, p.Message)
				}
			}); err != nil {
				return err
			}
			if !rep.OK {
				return &printedError{err: fmt.Errorf("%s: %d problem(s)", path, len(rep.Problems))}
			}
			return nil
		},
	}
	check.Flags().StringVar(&path, "config", defaultConfigPath, "YAML configuration file")
	cmd.AddCommand(check)
	return cmd
}

// checkConfig loads and checks the file at path with agent.Config.Check,
// the function the agent's own start runs.
func checkConfig(path string) configReport {
	rep := configReport{Config: path, Problems: []configProblem{}}
	cfg := agent.DefaultConfig()
	if err := agent.LoadConfigFile(path, &cfg); err != nil {
		rep.Problems = problems(err)
		return rep
	}
	if err := cfg.Check(); err != nil {
		rep.Problems = problems(err)
		return rep
	}
	rep.OK = true
	return rep
}

// problems splits an error of several problems into one per line.
func problems(err error) []configProblem {
	var many *agent.ConfigErrors
	errs := []error{err}
	if errors.As(err, &many) {
		errs = many.Errs
	}
	out := make([]configProblem, 0, len(errs))
	for _, e := range errs {
		p := configProblem{Message: e.Error()}
		var ce *agent.ConfigError
		var uk *agent.UnknownKeyError
		switch {
		case errors.As(e, &ce):
			p.Key = ce.Key
		case errors.As(e, &uk):
			p.Key = uk.Key
		}
		out = append(out, p)
	}
	return out
}
