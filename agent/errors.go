package agent

import (
	"errors"
	"fmt"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/owner"
)

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

// apiError maps the ledger's and the host's errors to the API's, for an
// answer of this server.
func (a *Agent) apiError(err error) error { return owner.APIError(a.cfg.NodeName, err) }
