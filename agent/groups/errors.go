package groups

import (
	"errors"
	"fmt"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/agent/names"
)

// The group operations answer in the API's error codes, with the messages
// the claim path gives for the same failures.

func isCode(err error, code string) bool {
	var e *api.Error
	return errors.As(err, &e) && e.Code == code
}

// asAPIError is err as the *api.Error it carries, or an internal one.
func asAPIError(err error) *api.Error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae
	}
	return &api.Error{Code: api.CodeInternal, Message: err.Error()}
}

// invalid is a ledger's refusal of a request as the API's invalid.
func invalid(err error) error {
	var val *ledger.ValidationError
	if errors.As(err, &val) {
		return api.Invalid(val.Field, "%s", val.Error())
	}
	return err
}

// refusalsOf returns the refusals an owner's "not available" carries.
func refusalsOf(err error) []string {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Refusals
	}
	return nil
}

// registryError turns a name registry error into the API's: unavailable
// (retryable, naming the servers) or the refusal it is.
func registryError(err error, what string) error {
	var (
		re *names.RefusedError
		ue *names.UnavailableError
	)
	switch {
	case errors.As(err, &ue):
		return &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("%s: %v", what, err)}
	case errors.As(err, &re) && (re.Code == names.CodeConflict || re.Code == names.CodeStale || re.Code == names.CodeLost):
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("%s: %v", what, err)}
	case errors.As(err, &re) && re.Code == names.CodeNotFound:
		return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("%s: %v", what, err)}
	case errors.As(err, &re) && re.Code == names.CodeInvalid:
		return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("%s: %v", what, err)}
	}
	return fmt.Errorf("%s: %w", what, err)
}
