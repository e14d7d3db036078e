package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/gpuherd/gpuherd/agent"
	"github.com/gpuherd/gpuherd/agent/api"
)

// warn prints an answer's warnings for people, after the answer.
func (g *globals) warn(warnings []string) {
	for _, w := range warnings {
		fmt.Fprintln(g.stderr, "gpuherd: warning: "+w)
	}
}

// inUseNote is the status column's note for a GPU a VM holds open.
func inUseNote(u *api.InUse) string {
	if u == nil {
		return ""
	}
	s := fmt.Sprintf(" (in use by pid %d", u.PID)
	if u.Domain != "" {
		s += ", domain " + u.Domain
	}
	return s + ")"
}

// addVMFlags adds the agent's flags about the VMs using its GPUs.
func addVMFlags(fl *pflag.FlagSet, f *agent.Config, d agent.Config) {
	fl.StringVar(&f.ProcRoot, "proc-root", d.ProcRoot, "root of /proc (where the VMs holding VFIO groups open are found)")
	f.DriverCheckInterval = d.DriverCheckInterval
	fl.Var(&f.DriverCheckInterval, "driver-check-interval", "how often every GPU's driver is compared with the ledger")
	f.RememberReleased = d.RememberReleased
	fl.Var(&f.RememberReleased, "remember-released", "how long a released claim ID's server is remembered (0 forgets)")
}

// vmFlagSetters copies those flags over cfg (see applyAgentFlags).
func vmFlagSetters(f, cfg *agent.Config) map[string]func() {
	return map[string]func(){
		"proc-root":             func() { cfg.ProcRoot = f.ProcRoot },
		"driver-check-interval": func() { cfg.DriverCheckInterval = f.DriverCheckInterval },
		"remember-released":     func() { cfg.RememberReleased = f.RememberReleased },
	}
}
