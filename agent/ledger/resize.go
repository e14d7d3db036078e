package ledger

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/gpuherd/gpuherd/agent/placement"
)

// Resize changes the committed claim id, in place and atomically, to hold
// req on this server: for each model still wanted it keeps the GPUs it has
// (up to the new count) and takes the rest from the free ones; GPUs of
// models no longer wanted, or beyond the new count, are freed. Labels are
// kept. When this server cannot hold req it fails with *NotAvailableError
// and changes nothing, so the caller may move the claim elsewhere. Resizing
// to what the claim already holds returns it unchanged.
func (l *Ledger) Resize(id string, req Request, now time.Time) (Claim, error) {
	if err := ValidateID(id); err != nil {
		return Claim{}, err
	}
	if err := ValidateRequest(req, l.maxGPUs); err != nil {
		return Claim{}, err
	}
	now = now.UTC()
	var out Claim
	err := l.write(func(tx *fileTx, st *state) (bool, error) {
		rec, changed, err := st.resized(id, req, now)
		if err != nil || !changed {
			out = rec.Claim
			return false, err
		}
		if err := st.putClaim(tx, rec); err != nil {
			return false, fmt.Errorf("resizing claim %s: %w", id, err)
		}
		out = rec.Claim
		return true, nil
	})
	if err != nil {
		return Claim{}, err
	}
	return copyClaim(out), nil
}

// PlanResize returns the claim as Resize would make it at now, and changes
// nothing: the caller readies the GPUs it would add (binds them to
// vfio-pci) before the ledger hands them to the claim. A reservation taken
// in between can make Resize pick others.
func (l *Ledger) PlanResize(id string, req Request, now time.Time) (Claim, error) {
	if err := ValidateID(id); err != nil {
		return Claim{}, err
	}
	if err := ValidateRequest(req, l.maxGPUs); err != nil {
		return Claim{}, err
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	rec, _, err := l.state.resized(id, req, now.UTC())
	if err != nil {
		return Claim{}, err
	}
	return copyClaim(rec.Claim), nil
}

// resized is claim id resized to req at now, and whether that changes it.
func (st *state) resized(id string, req Request, now time.Time) (claimRecord, bool, error) {
	old, ok := st.claims[id]
	if !ok || !old.Live(now) {
		return claimRecord{}, false, notFound(id)
	}
	if old.State != StateCommitted {
		return claimRecord{}, false, &ConflictError{ID: id, Existing: old.Claim}
	}
	req.Labels = old.Labels
	if sameRequest(old.Claim, req) {
		return old, false, nil
	}
	free := st.freeByModel(now)
	models := map[string]string{}
	var missing []Item
	for _, it := range req.Items {
		var kept []string
		for _, a := range old.GPUs {
			if old.GPUModels[a] == it.Model && len(kept) < it.Count {
				kept = append(kept, a)
			}
		}
		var got []string
		if need := it.Count - len(kept); need > 0 {
			var ok bool
			if got, ok = placement.Pick(free[it.Model], need); !ok {
				missing = append(missing, it)
				continue
			}
		}
		for _, a := range append(kept, got...) {
			models[a] = it.Model
		}
	}
	if len(missing) > 0 {
		return claimRecord{}, false, &NotAvailableError{ID: id, Missing: missing}
	}
	rec := old
	rec.Items = slices.Clone(req.Items)
	rec.GPUs = slices.Sorted(maps.Keys(models))
	rec.GPUModels = models
	return rec, true, nil
}
