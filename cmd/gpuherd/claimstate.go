package main

import "github.com/gpuherd/gpuherd/agent/api"

// claimState is a claim's state for tables: a duplicate copy says so, and
// where the copy the name registry names is.
func claimState(cl api.Claim) string {
	if !cl.Duplicate {
		return cl.State
	}
	if cl.KeptOn == "" {
		return cl.State + " (duplicate)"
	}
	return cl.State + " (duplicate; kept on " + cl.KeptOn + ")"
}
