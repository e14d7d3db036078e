package ledger

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// Adopt commits claim id on exactly the GPUs gpus, which must all be in the
// inventory and held by no live claim: how the agent takes over the GPUs of
// a VM that was already running when it started, so that they are never
// offered to anyone else. The claim's items are counted from the GPUs'
// models. It is written and fsynced like any commit. An ID that is already
// live fails with *ConflictError; a GPU unknown or held, with
// *ValidationError naming it.
func (l *Ledger) Adopt(id string, gpus []string, labels map[string]string, now time.Time) (Claim, error) {
	if err := ValidateID(id); err != nil {
		return Claim{}, err
	}
	if len(gpus) == 0 {
		return Claim{}, &ValidationError{Field: "gpus", Reason: "an adopted claim needs at least one GPU"}
	}
	now = now.UTC()
	var out Claim
	err := l.write(func(tx *fileTx, st *state) (bool, error) {
		if old, ok := st.claims[id]; ok && old.Live(now) {
			return false, &ConflictError{ID: id, Existing: old.Claim}
		}
		busy := st.busy(now)
		models := map[string]string{}
		count := map[string]int{}
		for _, addr := range gpus {
			g, ok := st.inventory[addr]
			if !ok {
				return false, &ValidationError{Field: "gpus", Reason: fmt.Sprintf("GPU %s is not in this server's inventory", addr)}
			}
			if holder, held := busy[addr]; held {
				return false, &ValidationError{Field: "gpus", Reason: fmt.Sprintf("GPU %s is held by claim %s", addr, holder)}
			}
			models[addr] = g.Model
			count[g.Model]++
		}
		var items []Item
		for _, m := range slices.Sorted(maps.Keys(count)) {
			items = append(items, Item{Model: m, Count: count[m]})
		}
		rec := claimRecord{
			Claim: Claim{
				ID:          id,
				State:       StateCommitted,
				Items:       items,
				GPUs:        slices.Sorted(maps.Keys(models)),
				CreatedAt:   now,
				CommittedAt: now,
			},
			GPUModels: models,
		}
		if len(labels) > 0 {
			rec.Labels = maps.Clone(labels)
		}
		if err := st.putClaim(tx, rec); err != nil {
			return false, err
		}
		out = rec.Claim
		return true, nil
	})
	if err != nil {
		return Claim{}, err
	}
	return copyClaim(out), nil
}
