package agent

import (
	"github.com/gpuherd/gpuherd/agent/owner"
)

// apiError maps the ledger's and the host's errors to the API's, for an
// answer of this server.
func (a *Agent) apiError(err error) error { return owner.APIError(a.cfg.NodeName, err) }
