package claim

import (
	"slices"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/events"
)

// Every API error code is counted as a claim outcome someone chose, and
// every outcome is one of the event vocabulary's.
func TestEveryErrorCodeHasAClaimOutcome(t *testing.T) {
	known := events.ClaimOutcomes()
	codes := map[string]bool{}
	for _, c := range api.ErrorCodes() {
		codes[c.Code] = true
		o, ok := claimOutcomes[c.Code]
		if !ok {
			t.Errorf("error code %q has no claim outcome: add it to claimOutcomes", c.Code)
			continue
		}
		if !slices.Contains(known, o) {
			t.Errorf("error code %q is counted as %q, which agent/events does not define", c.Code, o)
		}
		if got := outcome(&api.Error{Code: c.Code}); got != o {
			t.Errorf("outcome of %q = %q, want %q", c.Code, got, o)
		}
	}
	for code := range claimOutcomes {
		if !codes[code] {
			t.Errorf("claimOutcomes names %q, which is no API error code", code)
		}
	}
	if outcome(nil) != events.ClaimGranted {
		t.Error("a claim without error is not granted")
	}
}
