package names

import (
	"errors"
	"fmt"
	"strings"
)

// UnavailableError says the registry could not answer: no leader could be
// reached, or the leader could not reach a quorum of voters. It is always
// worth retrying: every command is idempotent, so a retry of one whose
// outcome is uncertain either finds it done or does it.
type UnavailableError struct {
	Op  Op
	Key Key
	// Unreached are the registry servers that did not answer, or that the
	// leader could not reach.
	Unreached []string
	// NoLeader are the servers that answered but knew no leader.
	NoLeader []string
	// Leader is the last leader known, if any.
	Leader string
	// Uncertain: the command may still be applied (it reached a leader
	// that lost its quorum or its leadership before answering).
	Uncertain bool
	// Reason is what went wrong, in words.
	Reason string
}

func (e *UnavailableError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "name registry unavailable for %s", e.Op)
	if e.Key.Name != "" {
		fmt.Fprintf(&b, " of %s", e.Key)
	}
	if e.Reason != "" {
		b.WriteString(": " + e.Reason)
	}
	if len(e.Unreached) > 0 {
		fmt.Fprintf(&b, "; no answer from %s", strings.Join(e.Unreached, ", "))
	}
	if len(e.NoLeader) > 0 {
		fmt.Fprintf(&b, "; no leader known to %s", strings.Join(e.NoLeader, ", "))
	}
	if e.Uncertain {
		b.WriteString("; it may still take effect")
	}
	b.WriteString("; retry when a majority of the registry's voters are reachable")
	return b.String()
}

// Retryable is true: the registry may answer later.
func (e *UnavailableError) Retryable() bool { return true }

// RefusedError is a command the registry answered and refused: a conflict,
// a stale token, a name that is not held, a lapsed or lost name, a limit.
type RefusedError struct {
	Op     Op
	Key    Key
	Code   Code
	Record *Record
	Detail string
}

func (e *RefusedError) Error() string {
	if e.Detail != "" {
		return fmt.Sprintf("name registry refused %s: %s", e.Op, e.Detail)
	}
	return fmt.Sprintf("name registry refused %s of %s: %s", e.Op, e.Key, e.Code)
}

// Is matches the sentinel of the same code, so errors.Is(err, ErrConflict)
// works.
func (e *RefusedError) Is(target error) bool {
	var s codeSentinel
	return errors.As(target, &s) && Code(s) == e.Code
}

type codeSentinel Code

func (s codeSentinel) Error() string { return "name registry: " + string(s) }

// Sentinels for errors.Is on a RefusedError.
var (
	ErrConflict = error(codeSentinel(CodeConflict))
	ErrStale    = error(codeSentinel(CodeStale))
	ErrNotFound = error(codeSentinel(CodeNotFound))
	ErrExpired  = error(codeSentinel(CodeExpired))
	ErrLost     = error(codeSentinel(CodeLost))
	ErrLimit    = error(codeSentinel(CodeLimit))
	ErrInvalid  = error(codeSentinel(CodeInvalid))
	ErrHalted   = error(codeSentinel(CodeHalted))
	ErrRecalled = error(codeSentinel(CodeRecalled))
)

// IsUnavailable reports whether err says the registry could not answer.
func IsUnavailable(err error) bool {
	var u *UnavailableError
	return errors.As(err, &u)
}
