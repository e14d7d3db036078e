package api

import (
	"net/http"
	"slices"
)

// Error codes. The HTTP status carries the class; the code tells which.
// Each is a row of errorCodes, which says its status and what it means.
const (
	CodeInvalid      = "invalid_request"
	CodeUnknownModel = "unknown_model"
	CodeNotFound     = "not_found"
	CodeNotAvailable = "not_available"
	CodeConflict     = "conflict"
	CodeLeaseExpired = "lease_expired"
	CodeBindFailed   = "bind_failed"
	CodeInternal     = "internal"
	CodeUnavailable  = "unavailable"
	CodeNotClaimed   = "not_claimed"
	CodeInUse        = "in_use"
	CodeNotBound     = "not_bound"
	CodeLost         = "lost"
	CodeForbidden    = "forbidden"
	CodeLimit        = "limit"
	CodeGoBack       = "go_back"
)

// ErrorCode is one error code of the API: the HTTP status it travels with
// and, in a line of the operator's documentation, what it means.
type ErrorCode struct {
	Code    string
	Status  int
	Meaning string
}

// errorCodes is every error code, each once. A new code is a constant and
// a row here; the tests check that docs/protocol.md lists the same rows
// and that the CLI gives each an exit code.
var errorCodes = []ErrorCode{
	{CodeInvalid, http.StatusBadRequest, "a field is wrong; `field` names it"},
	{CodeUnknownModel, http.StatusBadRequest, "no model of the catalog matches; `known_models` lists the catalog"},
	{CodeForbidden, http.StatusForbidden, "a peer call without a verified caller, or naming a node other than its caller"},
	{CodeNotFound, http.StatusNotFound, "no such claim, group, GPU or endpoint"},
	{CodeNotAvailable, http.StatusConflict, "no server can hold the request now; `missing` lists what could not be placed, `alternatives` what one server could hold"},
	{CodeConflict, http.StatusConflict, "the ID is taken by a different request"},
	{CodeLeaseExpired, http.StatusConflict, "a reservation expired before commit"},
	{CodeNotClaimed, http.StatusConflict, "a domain names GPUs its claim does not hold; `pci_addresses` lists them, `held_by` the claims holding them"},
	{CodeInUse, http.StatusConflict, "the claim is in use by another VM, or a release would take GPUs from a VM using them"},
	{CodeNotBound, http.StatusConflict, "a GPU of the claim is not on vfio-pci; `pci_addresses` lists them"},
	// Clients never see go_back: the coordinator acts on it.
	{CodeGoBack, http.StatusConflict, "between agents only: an owner refused to commit a claim whose ID last ran on another server (`node`) within its `remember_released`, placed without `any_node`; the coordinator places it there instead"},
	{CodeLost, http.StatusGone, "the claim's server was removed from the cluster; release it to free the ID"},
	{CodeLimit, http.StatusTooManyRequests, "the caller holds as many records of this kind as one caller may"},
	{CodeBindFailed, http.StatusInternalServerError, "a GPU could not be moved to vfio-pci"},
	{CodeInternal, http.StatusInternalServerError, "the agent failed in a way no other code names"},
	{CodeUnavailable, http.StatusServiceUnavailable, "the agent cannot serve this now (starting, a server or the name registry did not answer, a placement in progress); the message says what, retry"},
}

// ErrorCodes lists every error code of the API, in the order of the
// documentation's table.
func ErrorCodes() []ErrorCode { return slices.Clone(errorCodes) }

// StatusOf is the HTTP status an error code travels with. The protocol
// names what went wrong by code only; the HTTP layer picks the status here,
// so that one table says which codes are the caller's fault (4xx) and which
// the server's (5xx). An unknown code is a 500.
func StatusOf(code string) int {
	for _, c := range errorCodes {
		if c.Code == code {
			return c.Status
		}
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
