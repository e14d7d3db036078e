package api

import (
	"errors"
	"fmt"
)

// Annotate puts what err is about around its message: into a copy of the
// *api.Error it carries (whose code and message the API answers), else
// into a wrapping error. format has one %s for the original message.
func Annotate(err error, format string, args ...any) error {
	var ae *Error
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

// IsCode reports whether err carries an *Error with code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// SummaryOf returns the capacity summary an owner's "not available" to a
// peer carries; nil when it carries none (an agent before it).
func SummaryOf(err error) []byte {
	var e *Error
	if errors.As(err, &e) {
		return e.Summary
	}
	return nil
}

// RefusalsOf returns the refusals an owner's "not available" carries.
func RefusalsOf(err error) []string {
	var e *Error
	if errors.As(err, &e) {
		return e.Refusals
	}
	return nil
}
