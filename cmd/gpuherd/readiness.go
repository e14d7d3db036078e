package main

import (
	"fmt"
	"io"

	"github.com/gpuherd/gpuherd/agent/api"
)

// printReadiness writes, under a GPU table, why each GPU that cannot be
// passed through is unusable and what to do, and every warning. `status`
// and `inventory` print the same lines for the same verdict.
func printReadiness(w io.Writer, gpus []api.GPU) {
	first := true
	for _, gp := range gpus {
		r := gp.Readiness
		if r == nil || (len(r.Blocking) == 0 && len(r.Warnings) == 0) {
			continue
		}
		if first {
			fmt.Fprintln(w)
			first = false
		}
		printVerdict(w, gp.PCIAddress, r)
	}
}

func printVerdict(w io.Writer, addr string, r *api.Readiness) {
	for _, p := range r.Blocking {
		fmt.Fprintf(w, "%s unusable: %s\n  fix: %s\n", addr, p.Message, p.Fix)
	}
	for _, p := range r.Warnings {
		fmt.Fprintf(w, "%s warning: %s\n  fix: %s\n", addr, p.Message, p.Fix)
	}
}
