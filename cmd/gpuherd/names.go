package main

import (
	"github.com/spf13/pflag"

	"github.com/gpuherd/gpuherd/agent"
)

// addNamesFlags adds the agent's flags about the name registry
// (docs/names.md).
func addNamesFlags(fl *pflag.FlagSet, f *agent.Config, d agent.Config) {
	fl.StringSliceVar(&f.NamesVoters, "names-voters", nil, "node names of the name registry's voters: 1, 3 or 5 (default: chosen at run time)")
	fl.StringVar(&f.NamesAddr, "names-addr", "", "HOST:PORT the name registry's raft listens on (default: peer-addr's host, a free port)")
	fl.StringVar(&f.NamesDir, "names-dir", "", "the name registry's raft state (default: DATA_DIR/names)")
	fl.IntVar(&f.NamesBootstrapExpect, "names-bootstrap-expect", d.NamesBootstrapExpect, "voters a registry without --names-voters grows to: 1, 3 or 5")
}

// namesFlagSetters copies the name registry's flags over cfg.
func namesFlagSetters(f, cfg *agent.Config) map[string]func() {
	return map[string]func(){
		"names-voters":           func() { cfg.NamesVoters = f.NamesVoters },
		"names-addr":             func() { cfg.NamesAddr = f.NamesAddr },
		"names-dir":              func() { cfg.NamesDir = f.NamesDir },
		"names-bootstrap-expect": func() { cfg.NamesBootstrapExpect = f.NamesBootstrapExpect },
	}
}
