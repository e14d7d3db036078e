package main

import (
	"slices"
	"testing"

	"github.com/spf13/pflag"

	"github.com/gpuherd/gpuherd/agent"
)

// TestNamesFlagsOverrideTheFile: the registry's flags reach the
// configuration when given, and leave the file's values alone when not.
func TestNamesFlagsOverrideTheFile(t *testing.T) {
	parse := func(args ...string) agent.Config {
		t.Helper()
		var f agent.Config
		fl := pflag.NewFlagSet("agent", pflag.ContinueOnError)
		addNamesFlags(fl, &f, agent.DefaultConfig())
		if err := fl.Parse(args); err != nil {
			t.Fatal(err)
		}
		cfg := agent.DefaultConfig()
		cfg.NamesDir = "/from/file"
		fl.Visit(func(p *pflag.Flag) { namesFlagSetters(&f, &cfg)[p.Name]() })
		return cfg
	}
	cfg := parse("--names-voters", "gpu-1,gpu-2,gpu-3", "--names-addr", "0.0.0.0:7948", "--names-bootstrap-expect", "5")
	if !slices.Equal(cfg.NamesVoters, []string{"gpu-1", "gpu-2", "gpu-3"}) || cfg.NamesAddr != "0.0.0.0:7948" || cfg.NamesBootstrapExpect != 5 || cfg.NamesDir != "/from/file" {
		t.Errorf("flags gave %+v %q %d %q", cfg.NamesVoters, cfg.NamesAddr, cfg.NamesBootstrapExpect, cfg.NamesDir)
	}
	if cfg := parse(); cfg.NamesBootstrapExpect != 3 || cfg.NamesVoters != nil {
		t.Errorf("without flags: %+v %d", cfg.NamesVoters, cfg.NamesBootstrapExpect)
	}
}
