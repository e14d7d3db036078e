package claim

import (
	"context"
	"fmt"
	"slices"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/names"
)

// lostError is the answer for a claim whose server was removed.
func lostError(r names.Record) error {
	return &api.Error{Code: api.CodeLost,
		Message: fmt.Sprintf("claim %s was held on %s, which was removed from the cluster for good (members remove); its GPUs went with that server. Release it (gpuherd release %s) to free the ID", r.Name, r.Owner, r.Name)}
}

// addLost adds the lost claims (held on removed servers) to a claim list,
// and takes their servers out of the unanswered ones: they will never
// answer, and what they held is listed. A registry that does not answer
// makes the list partial, saying so.
func (co *Coordinator) addLost(ctx context.Context, out *api.ClaimList) {
	if co.names() == nil {
		return
	}
	listing, err := co.names().List(ctx, names.Filter{Kind: names.KindClaim, State: names.StateLost}, names.Linearizable)
	if err != nil {
		out.Unanswered = append(out.Unanswered, api.Unanswered{Node: "name registry", Reason: "lost claims (held on removed servers) not listed: " + err.Error()})
		return
	}
	removed := map[string]bool{}
	for _, r := range listing.Records {
		removed[r.Owner] = true
		out.Claims = append(out.Claims, api.Claim{ID: r.Name, Node: r.Owner, State: api.StateLost, Items: []api.Item{}, GPUs: []api.ClaimGPU{}})
	}
	if listing.Truncated {
		out.Unanswered = append(out.Unanswered, api.Unanswered{Node: "name registry", Reason: "more lost claims than one answer lists"})
	}
	out.Unanswered = slices.DeleteFunc(out.Unanswered, func(u api.Unanswered) bool { return removed[u.Node] })
}
