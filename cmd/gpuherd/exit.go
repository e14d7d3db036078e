package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
)

// Exit codes, as documented in the README and in gpuherd(1). Each class has
// its own, so that a script can tell what to do next without parsing text.
const (
	exitOK           = 0
	exitError        = 1 // anything else: a bug, a bad file, permission denied
	exitUsage        = 2 // bad input; nothing was changed
	exitNotAvailable = 3 // no server can hold the request now
	exitNotFound     = 4 // no such claim, group or GPU; or a claim lost with its server
	exitUnavailable  = 5 // retryable: an agent or a server did not answer
	exitConflict     = 6 // held under another request, or in use by a VM
)

// exitCodesHelp is the exit code table of the root command's help (and so
// of gpuherd(1)).
const exitCodesHelp = `Exit codes: 0 ok; 1 error; 2 usage (bad input, nothing changed); 3 not
available (no server can hold the request; alternatives follow); 4 not found
(or lost with a removed server); 5 unavailable (an agent or server did not
answer, or a listing lacks a server: claims, availability and members then
print what they have and name the missing servers; retry); 6 conflict (the ID is held under another request, or the GPU
is in use by a VM).`

type apiError = api.Error

// Codes of failures that happen before or instead of an agent's answer.
// The agent's own codes are api.Code*.
const (
	codeUsage            = api.CodeInvalid
	codeUnreachable      = "unreachable"
	codePermissionDenied = "permission_denied"
	codeError            = "error"
)

// errorCode names the class of err in the API's vocabulary.
func errorCode(err error) string {
	var (
		ue *usageError
		ve *ledger.ValidationError
	)
	switch {
	case errors.As(err, &ue), errors.As(err, &ve), isCobraUsage(err):
		return codeUsage
	case asAPIError(err) != nil:
		return asAPIError(err).Code
	case errors.Is(err, api.ErrAgentDown):
		return codeUnreachable
	case errors.Is(err, api.ErrPermission):
		return codePermissionDenied
	}
	return codeError
}

func exitCode(err error) int {
	switch errorCode(err) {
	case codeUsage, api.CodeUnknownModel:
		return exitUsage
	case api.CodeNotAvailable:
		return exitNotAvailable
	case api.CodeNotFound, api.CodeLost:
		return exitNotFound
	case api.CodeUnavailable, api.CodeLeaseExpired, codeUnreachable:
		return exitUnavailable
	case api.CodeConflict, api.CodeInUse:
		return exitConflict
	case api.CodeForbidden, api.CodeLimit:
		// Not the caller's input and not worth a retry: its certificate
		// does not let it say that (or it holds too much already).
		return exitError
	}
	return exitError
}

// usageError is bad input from the command line: exit 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// isCobraUsage recognises cobra's own argument errors, which it returns as
// plain errors.
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "accepts ", "requires at least", "unknown flag", "unknown shorthand flag", "flag needs an argument", "invalid argument"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// validID checks a claim ID on the command line, before any request: an
// empty or malformed ID is a usage error (exit 2), never a request to some
// other endpoint.
func validID(id string) error {
	if err := ledger.ValidateID(id); err != nil {
		return usagef("%v", err)
	}
	return nil
}
