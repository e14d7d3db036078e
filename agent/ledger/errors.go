package ledger

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors; every error the ledger returns for these cases wraps one,
// so callers test with errors.Is and still get a message that names the
// claim, GPU or file.
var (
	// ErrNotFound: no claim with that ID on this server. Release treats it
	// as success at the API level (the claim is gone either way).
	ErrNotFound = errors.New("not found")
	// ErrLeaseExpired: the reservation's lease ran out before the call; its
	// GPUs are free again and the coordinator must reserve anew.
	ErrLeaseExpired = errors.New("reservation lease expired")
	// ErrCommitted: an abort meant for a reservation found the claim
	// committed (by this or a concurrent coordinator) and left it.
	ErrCommitted = errors.New("claim is committed")
	// ErrNotAvailable is matched by every *NotAvailableError.
	ErrNotAvailable = errors.New("not available on this server")
	// ErrConflict is matched by every *ConflictError.
	ErrConflict = errors.New("claim ID already used for a different request")
	// ErrInvalid is matched by every *ValidationError.
	ErrInvalid = errors.New("invalid request")
	// ErrUnknownGPU: the address is not in this server's inventory.
	ErrUnknownGPU = errors.New("GPU not in this server's inventory")
	// ErrLocked: another process (usually a second agent on the same data
	// directory) holds the ledger file.
	ErrLocked = errors.New("locked by another process")
	// ErrSchemaTooNew: the file was written by a newer gpuherd.
	ErrSchemaTooNew = errors.New("ledger schema is newer than this gpuherd")
	// ErrCorrupt is matched by every *CorruptError.
	ErrCorrupt = errors.New("ledger is corrupt")
)

// ValidationError says which field of a request is wrong and why; the API
// maps it to 400.
type ValidationError struct {
	Field  string // JSON path of the field: "id", "items[1].count", "labels[\"team\"]"
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("invalid request: %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

// NotAvailableError lists every item of a request this server cannot place.
// An item is all or nothing: Missing carries the item's full count, not the
// shortfall, because a claim is never split and the coordinator looks for a
// server that holds the whole item.
type NotAvailableError struct {
	ID      string
	Missing []Item
	// Devices are the GPUs a pinned request named: some of them are not
	// free (held, drained, unhealthy or unusable).
	Devices []string
}

func (e *NotAvailableError) Error() string {
	if len(e.Devices) > 0 {
		return fmt.Sprintf("claim %q: the following GPUs are not available on this server: %s (of the GPUs asked for: %s, not all are free)",
			e.ID, describeItems(e.Missing), strings.Join(e.Devices, ", "))
	}
	return fmt.Sprintf("claim %q: the following GPUs are not available on this server: %s; try another server",
		e.ID, describeItems(e.Missing))
}

// Is makes errors.Is(err, ErrNotAvailable) true.
func (e *NotAvailableError) Is(target error) bool { return target == ErrNotAvailable }

// ConflictError: a live claim with this ID asks for something else. IDs are
// the callers' idempotency keys, so the ledger refuses rather than guess.
type ConflictError struct {
	ID       string
	Existing Claim
	// Stale is the request's name token when it was older than the
	// existing claim's: a placement that lost the name to a newer one.
	Stale uint64
}

func (e *ConflictError) Error() string {
	if e.Stale != 0 {
		return fmt.Sprintf("claim %q: this placement's name token %d is older than the %s claim's %d: a newer claim of the ID holds it; retry the claim to learn its state",
			e.ID, e.Stale, e.Existing.State, e.Existing.NameToken)
	}
	return fmt.Sprintf("claim %q already exists (%s, %s) with a different request; release it first or use another ID",
		e.ID, e.Existing.State, describeItems(e.Existing.Items))
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// CorruptError: a record in the ledger file cannot be read. The ledger never
// starts empty over such a file; an operator must look at it.
type CorruptError struct {
	Path   string // the ledger file
	Bucket string
	Key    string // "" when the problem is the bucket or the file itself
	Err    error
}

func (e *CorruptError) Error() string {
	what := "the file"
	switch {
	case e.Key != "":
		what = fmt.Sprintf("record %s/%q", e.Bucket, e.Key)
	case e.Bucket != "":
		what = fmt.Sprintf("bucket %q", e.Bucket)
	}
	return fmt.Sprintf("ledger %s: %s is unreadable: %v; the file was not changed: "+
		"restore it from a backup or move it aside (this drops every claim it holds)", e.Path, what, e.Err)
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

func (e *CorruptError) Unwrap() error { return e.Err }

func notFound(id string) error {
	return fmt.Errorf("claim %q: %w on this server", id, ErrNotFound)
}

func leaseExpired(c Claim, now time.Time) error {
	return fmt.Errorf("claim %q: %w at %s (now %s); its GPUs are free again: reserve anew",
		c.ID, ErrLeaseExpired, c.ExpiresAt.Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano))
}

func describeItems(items []Item) string {
	parts := make([]string, len(items))
	for i, it := range items {
		parts[i] = fmt.Sprintf("%d × %s", it.Count, it.Model)
	}
	return strings.Join(parts, ", ")
}
