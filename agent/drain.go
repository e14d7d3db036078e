package agent

import (
	"github.com/gpuherd/gpuherd/agent/drain"
)

// openDrains builds a's drains (agent/drain) over its ledger and the
// status of its GPUs, and reads the server's cordon.
func openDrains(a *Agent) (*drain.Drains, error) {
	return drain.Open(drain.Deps{
		Dir:      a.cfg.DataDir,
		Ledger:   a.ledger,
		GPUs:     a.status,
		Self:     a.self,
		APIError: a.apiError,
		Changed:  a.changed,
		Clock:    a.clk,
		Log:      a.log,
	})
}
