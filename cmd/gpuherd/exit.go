package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
	"github.com/gpuherd/gpuherd/cmd/internal/cli"
)

// Exit codes, as documented in the README and in gpuherd(1). Each class has
// its own, so that a script can tell what to do next without parsing text.
// exitClasses says what each means and which error codes end in it.
const (
	exitOK           = 0
	exitError        = 1
	exitUsage        = 2
	exitNotAvailable = 3
	exitNotFound     = 4
	exitUnavailable  = 5
	exitConflict     = 6
)

// exitClass is one exit code: its name and the help's words on it, and the
// error codes (the API's and the CLI's own) that end in it.
type exitClass struct {
	code  int
	name  string
	help  string // in parentheses after the name; "" for none
	codes []string
}

// exitClasses is every exit code, once, in order, and every error code in
// exactly one of them: the help's exit code table is made from it and
// exitCode reads it; tests hold the README's table and api.ErrorCodes to it.
var exitClasses = []exitClass{
	{exitOK, "ok", "", nil},
	// Anything else: a bug, a bad file, permission denied. Forbidden and
	// limit are not the caller's input and not worth a retry: its
	// certificate does not let it say that (or it holds too much already).
	// go_back is between agents only.
	{exitError, "error", "", []string{api.CodeBindFailed, api.CodeInternal, api.CodeNotClaimed, api.CodeNotBound,
		api.CodeForbidden, api.CodeLimit, api.CodeGoBack, codePermissionDenied, codeError}},
	{exitUsage, "usage", "bad input, nothing changed", []string{codeUsage, api.CodeUnknownModel}},
	{exitNotAvailable, "not available", "no server can hold the request; alternatives follow", []string{api.CodeNotAvailable}},
	{exitNotFound, "not found", "or lost with a removed server", []string{api.CodeNotFound, api.CodeLost}},
	{exitUnavailable, "unavailable", "an agent or server did not answer, or a listing lacks a server: claims, " +
		"availability and members then print what they have and name the missing servers; retry",
		[]string{api.CodeUnavailable, api.CodeLeaseExpired, codeUnreachable}},
	{exitConflict, "conflict", "the ID is held under another request, or the GPU is in use by a VM",
		[]string{api.CodeConflict, api.CodeInUse}},
}

// exitCodesHelp is the exit code table of the root command's help (and so
// of gpuherd(1)).
func exitCodesHelp() string {
	parts := make([]string, len(exitClasses))
	for i, c := range exitClasses {
		parts[i] = fmt.Sprintf("%d %s", c.code, c.name)
		if c.help != "" {
			parts[i] += " (" + c.help + ")"
		}
	}
	return wrapWords("Exit codes: "+strings.Join(parts, "; ")+".", 79)
}

// wrapWords breaks s between words into lines of at most width bytes (a
// longer word gets a line of its own).
func wrapWords(s string, width int) string {
	var b strings.Builder
	n := 0
	for i, w := range strings.Fields(s) {
		switch {
		case i == 0:
		case n+1+len(w) > width:
			b.WriteByte('\n')
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len(w)
	}
	return b.String()
}

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
		ue *cli.UsageError
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

// exitOf is the exit code of each error code, from exitClasses.
var exitOf = func() map[string]int {
	m := map[string]int{}
	for _, c := range exitClasses {
		for _, code := range c.codes {
			m[code] = c.code
		}
	}
	return m
}()

func exitCode(err error) int {
	if code, ok := exitOf[errorCode(err)]; ok {
		return code
	}
	return exitError // a code of a newer agent
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
		return cli.Usagef("%v", err)
	}
	return nil
}
