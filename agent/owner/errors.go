package owner

import (
	"errors"
	"slices"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/agent/ledger"
)

// APIError maps the ledger's and the host's errors to the API's, for an
// answer of the owner on node.
func APIError(node string, err error) error {
	var (
		na   *ledger.NotAvailableError
		conf *ledger.ConflictError
		val  *ledger.ValidationError
		ae   *api.Error
	)
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &na):
		missing := slices.Clone(na.Missing)
		return &api.Error{Code: api.CodeNotAvailable,
			Message: api.NotAvailableMessage(missing), Missing: missing}
	case errors.As(err, &conf):
		return &api.Error{Code: api.CodeConflict, Message: here(node, err)}
	case errors.As(err, &val):
		return api.Invalid(val.Field, "%s", val.Error())
	case errors.Is(err, ledger.ErrNotFound):
		return &api.Error{Code: api.CodeNotFound, Message: here(node, err)}
	case errors.Is(err, ledger.ErrLeaseExpired):
		return &api.Error{Code: api.CodeLeaseExpired, Message: here(node, err)}
	case errors.Is(err, ledger.ErrCommitted):
		return &api.Error{Code: api.CodeConflict, Message: here(node, err)}
	}
	var nr *host.NotReadyFailure
	if errors.As(err, &nr) {
		return &api.Error{Code: api.CodeNotAvailable, Message: err.Error()}
	}
	var bf *host.BindFailure
	if errors.As(err, &bf) {
		return &api.Error{Code: api.CodeBindFailed, Message: err.Error()}
	}
	return err
}

// here is the ledger's message with "this server" named: an owner's
// answer reaches a coordinator, and the operator, on another server.
func here(node string, err error) string {
	return strings.ReplaceAll(err.Error(), "this server", node)
}

// apiError is APIError for this owner's answers.
func (o *Owner) apiError(err error) error { return APIError(o.cfg.NodeName, err) }
