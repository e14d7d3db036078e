package api

import "net/http"

// StatusOf is the HTTP status an error code travels with. The protocol
// names what went wrong by code only; the HTTP layer picks the status here,
// so that one table says which codes are the caller's fault (4xx) and which
// the server's (5xx). An unknown code is a 500.
func StatusOf(code string) int {
	switch code {
	case CodeInvalid, CodeUnknownModel:
		return http.StatusBadRequest
	case CodeNotFound:
		return http.StatusNotFound
	case CodeNotAvailable, CodeConflict, CodeLeaseExpired, CodeNotClaimed, CodeInUse, CodeNotBound, CodeGoBack:
		return http.StatusConflict
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	case CodeLost:
		return http.StatusGone
	case CodeForbidden:
		return http.StatusForbidden
	case CodeLimit:
		return http.StatusTooManyRequests
	}
	return http.StatusInternalServerError
}

// HTTPStatus is the status e is (or was) answered with: the one set
// explicitly (by the HTTP layer, or read from an answer), else its code's.
func (e *Error) HTTPStatus() int {
	if e.Status != 0 {
		return e.Status
	}
	return StatusOf(e.Code)
}

// ServerFault reports whether e is the server's failure (a 5xx: the request
// may not have been carried out, or only half) rather than an answer about
// the request itself (a 4xx: nothing was done, asking again will not help).
func (e *Error) ServerFault() bool { return e.HTTPStatus() >= 500 }
