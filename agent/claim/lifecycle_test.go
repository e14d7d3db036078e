package claim

import (
	"strings"
	"testing"
)

func TestVCPUWarning(t *testing.T) {
	for _, tc := range []struct {
		vcpus, gpus int
		warn        bool
	}{{0, 2, false}, {8, 1, false}, {16, 1, false}, {7, 1, true}, {17, 1, true}, {16, 2, false}, {32, 2, false}, {33, 2, true}, {8, 0, false}} {
		if got := vcpuWarning(tc.vcpus, tc.gpus); (got != "") != tc.warn || (tc.warn && !strings.Contains(got, "8 to 16 per GPU")) {
			t.Errorf("vcpuWarning(%d, %d) = %q, want a warning: %v", tc.vcpus, tc.gpus, got, tc.warn)
		}
	}
}
