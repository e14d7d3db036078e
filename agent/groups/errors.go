package groups

import (
	"errors"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
)

// The group operations answer in the API's error codes, with the messages
// the claim path gives for the same failures.

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
