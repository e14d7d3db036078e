package names

import (
	"os"
	"testing"

	"github.com/gpuherd/gpuherd/agent/internal/testmain"
)

// TestMain runs the cluster tests, which mostly wait for elections, six at
// a time, and keeps their files in memory (testmain.Run).
func TestMain(m *testing.M) { os.Exit(testmain.Run(m, 6)) }
