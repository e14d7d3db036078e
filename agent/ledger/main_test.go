package ledger

import (
	"os"
	"testing"

	"github.com/gpuherd/gpuherd/agent/internal/testmain"
)

// TestMain keeps the tests' files in memory (testmain.Run): their fsyncs
// are real, the disk under them is not what they test.
func TestMain(m *testing.M) { os.Exit(testmain.Run(m, 0)) }
