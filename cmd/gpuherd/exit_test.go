package main

import (
	"fmt"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

// The peer API's refusals of who a caller is reach a script as plain
// errors: neither a usage error nor anything a retry could fix.
func TestExitCodeOfRefusedIdentity(t *testing.T) {
	for code, want := range map[string]int{
		api.CodeForbidden:   exitError,
		api.CodeLimit:       exitError,
		api.CodeUnavailable: exitUnavailable,
		api.CodeConflict:    exitConflict,
	} {
		err := fmt.Errorf("claim vm-1: %w", &api.Error{Code: code, Message: "m"})
		if got := exitCode(err); got != want {
			t.Errorf("exitCode(%s) = %d, want %d", code, got, want)
		}
	}
}
