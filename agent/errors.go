package agent

import (
	"errors"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/owner"
)

func isCode(err error, code string) bool {
	var e *api.Error
	return errors.As(err, &e) && e.Code == code
}

// apiError maps the ledger's and the host's errors to the API's, for an
// answer of this server.
func (a *Agent) apiError(err error) error { return owner.APIError(a.cfg.NodeName, err) }
