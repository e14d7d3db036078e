package agent

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/host"
	"github.com/gpuherd/gpuherd/agent/ledger"
)

// apiError maps the ledger's errors to the API's.
func (a *Agent) apiError(err error) error {
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
		missing := make([]api.Item, len(na.Missing))
		for i, m := range na.Missing {
			missing[i] = api.Item{Model: m.Model, Count: m.Count}
		}
		return &api.Error{Code: api.CodeNotAvailable,
			Message: api.NotAvailableMessage(missing), Missing: missing}
	case errors.As(err, &conf):
		return &api.Error{Code: api.CodeConflict, Message: a.here(err)}
	case errors.As(err, &val):
		return api.Invalid(val.Field, "%s", val.Error())
	case errors.Is(err, ledger.ErrNotFound):
		return &api.Error{Code: api.CodeNotFound, Message: a.here(err)}
	case errors.Is(err, ledger.ErrLeaseExpired):
		return &api.Error{Code: api.CodeLeaseExpired, Message: a.here(err)}
	case errors.Is(err, ledger.ErrCommitted):
		return &api.Error{Code: api.CodeConflict, Message: a.here(err)}
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
func (a *Agent) here(err error) string {
	return strings.ReplaceAll(err.Error(), "this server", a.cfg.NodeName)
}

func isCode(err error, code string) bool {
	var e *api.Error
	return errors.As(err, &e) && e.Code == code
}

// annotate puts what err is about around its message: into a copy of the
// *api.Error it carries (whose code and message the API answers), else
// into a wrapping error. format has one %s for the original message.
func annotate(err error, format string, args ...any) error {
	var ae *api.Error
	if errors.As(err, &ae) {
		out := *ae
		out.Message = fmt.Sprintf(format, append([]any{ae.Message}, args...)...)
		return &out
	}
	return &annotated{msg: fmt.Sprintf(format, append([]any{err.Error()}, args...)...), err: err}
}

// annotated is an error with what it is about, still matching what it wraps.
type annotated struct {
	msg string
	err error
}

func (e *annotated) Error() string { return e.msg }
func (e *annotated) Unwrap() error { return e.err }
