package ledger

import (
	"cmp"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"time"
)

// GPUStatus is what a GPU is doing, as one word for tables and metrics.
type GPUStatus string

// GPU statuses. When several apply, the first in this list wins: a GPU held
// by a claim is reported as held even if it is sick or drained (the claim is
// what an operator must deal with first), a sick GPU as unhealthy even if
// drained (draining it does not make it usable again), an unusable one (its
// IOMMU group cannot be passed through now) as unusable even if drained,
// and only a healthy, usable, unheld GPU as drained or free.
const (
	GPUClaimed   GPUStatus = "claimed"   // in a committed claim
	GPUReserved  GPUStatus = "reserved"  // in a live reservation
	GPUUnhealthy GPUStatus = "unhealthy" // not healthy, or gone from the inventory
	GPUUnusable  GPUStatus = "unusable"  // healthy, but it cannot be passed through now (see GPU.Unusable)
	GPUDrained   GPUStatus = "drained"   // an operator took it out of service
	GPUFree      GPUStatus = "free"      // can be reserved now
)

// GPUState is one GPU of this server as the ledger sees it.
type GPUState struct {
	// GPU is the inventory's view; for a GPU missing from the inventory
	// only Address and Model (as remembered by a claim or drain) are set.
	GPU    GPU       `json:"gpu"`
	Status GPUStatus `json:"status"`
	// ClaimID is the live claim holding the GPU, if any.
	ClaimID string `json:"claim_id,omitempty"`
	// Missing: a claim or drain names this GPU but the inventory does not
	// list it (the card fell off the bus or the inventory lost it). Its
	// claim stays; an operator decides.
	Missing     bool      `json:"missing,omitempty"`
	Drained     bool      `json:"drained,omitempty"`
	DrainReason string    `json:"drain_reason,omitempty"`
	DrainedAt   time.Time `json:"drained_at,omitzero"`
}

// ModelTotals is the capacity of one model on this server, as gossip
// publishes it.
type ModelTotals struct {
	Total   int `json:"total"`   // in the inventory
	Healthy int `json:"healthy"` // in the inventory, healthy and usable, held or not
	Free    int `json:"free"`    // could be reserved now
	// Unusable counts GPUs that are healthy but cannot be passed through
	// now (GPUUnusable): neither free nor healthy.
	Unusable int `json:"unusable,omitempty"`
}

var pciAddress = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// ValidateAddress checks a PCI address in the canonical sysfs form
// (0000:3b:00.0, lower-case hex), the only key the ledger uses for a GPU.
func ValidateAddress(addr string) error {
	if !pciAddress.MatchString(addr) {
		return fmt.Errorf("GPU address %q is not a PCI address like 0000:3b:00.0 (lower-case hex)", addr)
	}
	return nil
}

// SetInventory replaces the list of GPUs this server has now; the
// inventory calls it at start and on every change (a card appears or
// vanishes, health changes). It is not the truth about claims: a claim on a
// GPU that is no longer listed keeps it (see Orphans). An unchanged list is
// a no-op; a changed one bumps the revision. The inventory lives in memory
// only: SetInventory writes no file.
func (l *Ledger) SetInventory(gpus []GPU) error {
	inv := make(map[string]GPU, len(gpus))
	for i, g := range gpus {
		if err := ValidateAddress(g.Address); err != nil {
			return fmt.Errorf("inventory entry %d: %w", i, err)
		}
		if err := validateModel(g.Model); err != nil {
			return fmt.Errorf("inventory GPU %s: model %w", g.Address, err)
		}
		if _, dup := inv[g.Address]; dup {
			return fmt.Errorf("inventory lists GPU %s twice; a PCI address names one GPU", g.Address)
		}
		g.Distance = maps.Clone(g.Distance)
		inv[g.Address] = g
	}
	return l.write(func(_ *fileTx, st *state) (bool, error) {
		if maps.EqualFunc(st.inventory, inv, sameGPU) {
			return false, nil
		}
		st.inventory = inv
		return true, nil
	})
}

func sameGPU(a, b GPU) bool {
	return a.Address == b.Address && a.Model == b.Model && a.NUMANode == b.NUMANode &&
		a.Healthy == b.Healthy && a.Unusable == b.Unusable && maps.Equal(a.Distance, b.Distance)
}

// Drain takes the GPU at addr out of service for new claims, durably, with
// the operator's reason. A claim already on it stays. Draining a drained
// GPU again only updates the reason. The GPU must be in the inventory:
// ErrUnknownGPU otherwise, since a typo would else drain nothing silently.
func (l *Ledger) Drain(addr, reason string, now time.Time) error {
	if err := ValidateAddress(addr); err != nil {
		return err
	}
	if len(reason) > MaxDrainReasonLen || !printable(reason) {
		return &ValidationError{Field: "reason", Reason: fmt.Sprintf("must be printable and at most %d bytes", MaxDrainReasonLen)}
	}
	now = now.UTC()
	return l.write(func(tx *fileTx, st *state) (bool, error) {
		g, ok := st.inventory[addr]
		if !ok {
			return false, fmt.Errorf("drain GPU %s: %w; list the GPUs with `gpuherd status`", addr, ErrUnknownGPU)
		}
		d, drained := st.drains[addr]
		if drained && d.Reason == reason {
			return false, nil
		}
		if !drained {
			d = drainRecord{Model: g.Model, Since: now}
		}
		d.Reason = reason
		if err := st.putDrain(tx, addr, d); err != nil {
			return false, err
		}
		return true, nil
	})
}

// Undrain puts the GPU at addr back in service. Undraining a GPU that is not
// drained is a no-op; a drained GPU that has vanished from the inventory can
// still be undrained (to clear the record). ErrUnknownGPU when addr is
// neither drained nor in the inventory.
func (l *Ledger) Undrain(addr string) error {
	if err := ValidateAddress(addr); err != nil {
		return err
	}
	return l.write(func(tx *fileTx, st *state) (bool, error) {
		if _, drained := st.drains[addr]; !drained {
			if _, ok := st.inventory[addr]; !ok {
				return false, fmt.Errorf("undrain GPU %s: %w; list the GPUs with `gpuherd status`", addr, ErrUnknownGPU)
			}
			return false, nil
		}
		if err := st.deleteDrain(tx, addr); err != nil {
			return false, err
		}
		return true, nil
	})
}

// GPUStates returns every GPU the ledger knows at now, sorted by address:
// the inventory, plus any GPU a live claim or a drain names that the
// inventory no longer lists (Missing). See GPUStatus for the precedence.
func (l *Ledger) GPUStates(now time.Time) []GPUState {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.state.gpuStates(now)
}

// Orphans returns the GPUs held by live claims at now that the inventory no
// longer lists, sorted by address. Their claims stay until released: the
// card may come back, and only an operator (or the VM's owner) can tell.
func (l *Ledger) Orphans(now time.Time) []GPUState {
	var out []GPUState
	for _, s := range l.GPUStates(now) {
		if s.Missing && s.ClaimID != "" {
			out = append(out, s)
		}
	}
	return out
}

// Free returns, per model in the inventory, how many GPUs could be reserved
// at now (zero counts included, so a model that is all taken still shows).
func (l *Ledger) Free(now time.Time) map[string]int {
	out := map[string]int{}
	for model, t := range l.Totals(now) {
		out[model] = t.Free
	}
	return out
}

// Totals returns the capacity per model in the inventory at now: the
// GPUs of GPUStates that are not missing, counted by model (a
// coordinator reads its own server's on every claim, so they are counted
// here without building the states).
func (l *Ledger) Totals(now time.Time) map[string]ModelTotals {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.state.totals(now)
}

func (st *state) totals(now time.Time) map[string]ModelTotals {
	held := make(map[string]bool, len(st.inventory))
	for _, rec := range st.claims {
		if rec.Live(now) {
			for _, addr := range rec.GPUs {
				held[addr] = true
			}
		}
	}
	out := map[string]ModelTotals{}
	for addr, g := range st.inventory {
		t := out[g.Model]
		t.Total++
		switch {
		case g.Healthy && g.Unusable:
			t.Unusable++
		case g.Healthy:
			t.Healthy++
		}
		if _, drained := st.drains[addr]; g.Healthy && !g.Unusable && !drained && !held[addr] {
			t.Free++ // GPUFree: no live claim, healthy, usable, not drained
		}
		out[g.Model] = t
	}
	return out
}

func (st *state) gpuStates(now time.Time) []GPUState {
	byAddr := map[string]*GPUState{}
	get := func(addr, model string) *GPUState {
		s, ok := byAddr[addr]
		if !ok {
			s = &GPUState{GPU: GPU{Address: addr, Model: model}, Missing: true}
			byAddr[addr] = s
		}
		return s
	}
	for addr, g := range st.inventory {
		g.Distance = maps.Clone(g.Distance)
		byAddr[addr] = &GPUState{GPU: g}
	}
	for _, rec := range st.claims {
		if !rec.Live(now) {
			continue
		}
		for _, addr := range rec.GPUs {
			get(addr, rec.GPUModels[addr]).ClaimID = rec.ID
		}
	}
	for addr, d := range st.drains {
		s := get(addr, d.Model)
		s.Drained, s.DrainReason, s.DrainedAt = true, d.Reason, d.Since
	}

	out := make([]GPUState, 0, len(byAddr))
	for _, s := range byAddr {
		switch {
		case s.ClaimID != "" && st.claims[s.ClaimID].State == StateCommitted:
			s.Status = GPUClaimed
		case s.ClaimID != "":
			s.Status = GPUReserved
		case s.Missing || !s.GPU.Healthy:
			s.Status = GPUUnhealthy
		case s.GPU.Unusable:
			s.Status = GPUUnusable
		case s.Drained:
			s.Status = GPUDrained
		default:
			s.Status = GPUFree
		}
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b GPUState) int { return cmp.Compare(a.GPU.Address, b.GPU.Address) })
	return out
}
