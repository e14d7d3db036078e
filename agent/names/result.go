package names

// Code is the outcome of one command.
type Code string

// The outcomes of the registry's commands.
const (
	// CodeOK: the command did what it asked (a name granted, confirmed,
	// released; pending names expired; a member's names marked lost).
	CodeOK Code = "ok"
	// CodeSame: an idempotent retry; the record is what the first call made.
	CodeSame Code = "same"
	// CodeConflict: the name is held by another request, or on another
	// server; the record says by whom.
	CodeConflict Code = "conflict"
	// CodeStale: the token is not the name's current one: the grant it
	// proved has ended and the name may have been granted again.
	CodeStale Code = "stale"
	// CodeNotFound: the registry holds no such name.
	CodeNotFound Code = "not_found"
	// CodeExpired: the pending name lapsed before it was confirmed.
	CodeExpired Code = "expired"
	// CodeLost: the name's owner was removed from the cluster; release it.
	CodeLost Code = "lost"
	// CodeLimit: the caller or owner holds as many names as it may.
	CodeLimit Code = "limit"
	// CodeInvalid: the command does not make sense for this name.
	CodeInvalid Code = "invalid"
	// CodeHalted: this server met a command it cannot apply and stopped
	// applying the log.
	CodeHalted Code = "halted"
	// CodeRecalled: a hold with recall, refused because the claim ID last
	// ran on another server within its remember window; the record (state
	// released) names that server as its owner.
	CodeRecalled Code = "recalled"
)

// Result is what applying one command answers.
type Result struct {
	Code Code `json:"code"`
	// Record is the name's record after the command, or the record that
	// refused it (conflict, stale, lost); a release answers the freed
	// record in state released.
	Record *Record `json:"record,omitempty"`
	// Keys are the names an expiry or member removal changed.
	Keys []Key `json:"keys,omitempty"`
	// Detail says why a command was refused.
	Detail string `json:"detail,omitempty"`
	// Records are a list's answer (OpList); Truncated says more matched.
	Records   []Record `json:"records,omitempty"`
	Truncated bool     `json:"truncated,omitempty"`
}

func withRecord(c Code, r Record) Result {
	r = r.clone()
	return Result{Code: c, Record: &r}
}
