package ledger

// Name tokens. With the name registry (agent/names), a placement holds the
// claim ID under a token that grows each time the ID is granted anew, so a
// reservation carrying an older token belongs to a placement that has lost
// the name: its claim was answered (conflict, not available) or released,
// and only its reservation was left behind, because the coordinator's abort
// never arrived (issue 11, point 4: "an orphan reservation"). Such a
// reservation must not make the ID's next claim answer conflict.
//
// Token 0 means "no registry" (a server alone, or a request from an older
// agent): it orders nothing, and the rules without tokens apply.

type tokenOrder int

const (
	tokenUnordered tokenOrder = iota // same token, or either is 0
	tokenNewer                       // the request's token is newer than a reservation's
	tokenOlder                       // the request's token is older than the claim's
)

// supersedes orders a request's token against the live claim old of the
// same ID. Only a reservation is superseded: a committed claim is the
// ID's until released, whatever token asks.
func supersedes(token uint64, old Claim) tokenOrder {
	if token == 0 || old.NameToken == 0 || token == old.NameToken {
		return tokenUnordered
	}
	if token < old.NameToken {
		return tokenOlder
	}
	if old.State == StateReserved {
		return tokenNewer
	}
	return tokenUnordered
}
