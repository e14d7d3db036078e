package claim

import (
	"fmt"
	"slices"

	"github.com/gpuherd/gpuherd/agent/api"
	"github.com/gpuherd/gpuherd/agent/ledger"
)

// A user's request as the protocol reads it: models resolved to catalog
// names, and the conversions between the API's items and the ledger's.

// resolve turns the user's model names into canonical ones (case, the
// "NVIDIA " prefix, spaces and dashes do not matter; a unique abbreviation
// is enough) and merges repeated models.
func (co *Coordinator) resolve(req api.ClaimRequest) (ledger.Request, error) {
	return co.resolveIn(req, co.servers.Targets())
}

// resolveIn is resolve against the servers of view, which a claim's
// placement reads anyway: one reading of the view per claim, not two.
func (co *Coordinator) resolveIn(req api.ClaimRequest, view []Target) (ledger.Request, error) {
	if len(req.GPUs) == 0 {
		return ledger.Request{}, api.Invalid("gpus", "a claim needs at least one GPU (e.g. --gpu \"H100 80GB:2\")")
	}
	if len(req.GPUs) > co.cfg.MaxGPUsPerClaim {
		return ledger.Request{}, api.Invalid("gpus", "%d items: at most %d", len(req.GPUs), co.cfg.MaxGPUsPerClaim)
	}
	var names []string // every model name of the view, read once an item needs it
	out := ledger.Request{Labels: req.Labels, Devices: req.Devices}
	index := map[string]int{}
	for i, it := range req.GPUs {
		// A catalog name as the catalog spells it (what a client that
		// lists the models sends) matches itself.
		model, ok := co.catalog.Exact(it.Model)
		if !ok {
			if names == nil {
				names = co.modelNamesIn(view)
			}
			var err error
			if model, err = co.catalog.MatchIn(it.Model, names); err != nil {
				return ledger.Request{}, &api.Error{Code: api.CodeUnknownModel,
					Field: fmt.Sprintf("gpus[%d].model", i), Message: err.Error(), KnownModels: names}
			}
		}
		m := model.Name
		if it.Count < 1 || it.Count > co.cfg.MaxGPUsPerClaim {
			return ledger.Request{}, api.Invalid(fmt.Sprintf("gpus[%d].count", i), "count %d for %s: must be between 1 and %d", it.Count, m, co.cfg.MaxGPUsPerClaim)
		}
		if j, ok := index[m]; ok {
			out.Items[j].Count += it.Count
			continue
		}
		index[m] = len(out.Items)
		out.Items = append(out.Items, ledger.Item{Model: m, Count: it.Count})
	}
	return out, nil
}

// modelNames is every name a claim may ask for: the catalog, and the models
// missing from it that some server of the platform has.
func (co *Coordinator) modelNames() []string { return co.modelNamesIn(co.servers.Targets()) }

// modelNamesIn is modelNames with the servers of view.
func (co *Coordinator) modelNamesIn(view []Target) []string {
	names := co.catalog.Names()
	for _, t := range view {
		for m := range t.caps {
			if !slices.Contains(names, m) {
				names = append(names, m)
			}
		}
	}
	slices.Sort(names)
	return names
}
