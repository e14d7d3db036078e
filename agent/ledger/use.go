package ledger

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Use is the VM that runs on a committed claim's GPUs, as the hypervisor's
// hook reported it: the libvirt domain's UUID and name, the host's boot it
// was seen in, and whether the VM got past its start. It is written with
// the claim, so it survives an agent restart; no VM survives a reboot, so a
// use recorded in another boot is stale.
type Use struct {
	Domain  string    `json:"domain"`         // the domain's UUID
	Name    string    `json:"name,omitempty"` // the domain's name when marked
	BootID  string    `json:"boot_id,omitempty"`
	Started bool      `json:"started,omitempty"` // the hypervisor reported the VM running
	Since   time.Time `json:"since"`
}

// ErrNotMarked: the claim is not marked in use by the domain that asked to
// end its use; nothing was changed.
var ErrNotMarked = errors.New("claim not in use by this domain")

// InUseError: a claim is marked in use by another domain in this boot.
type InUseError struct {
	ID  string
	Use Use
}

func (e *InUseError) Error() string {
	return fmt.Sprintf("claim %s is in use by domain %s (%s) since %s", e.ID, e.Use.Name, e.Use.Domain, e.Use.Since.Format(time.RFC3339))
}

// MaxDomainNameLen bounds the domain name kept with a use.
const MaxDomainNameLen = 256

// MarkUse records that domain use.Domain runs, or is about to run, on the
// committed claim id, whose GPUs the caller checked to be gpus: if the
// claim holds other GPUs now (a release and a new claim, or a resize,
// between the check and the mark), it fails with *ConflictError and changes
// nothing. A claim marked by the same domain is marked again, with
// use.Started as given (a new start of the domain, whose stop after an
// earlier run was never reported, must not count as running before it
// does); one marked by another domain in the same boot fails with
// *InUseError; a use from another boot is replaced. A reservation, or no claim: ErrNotFound. The mark is written
// to the file (one fsync) unless nothing changed.
func (l *Ledger) MarkUse(id string, gpus []string, use Use, now time.Time) (Claim, error) {
	if err := ValidateID(id); err != nil {
		return Claim{}, err
	}
	if use.Domain == "" || len(use.Domain) > MaxIDLen || !printable(use.Domain) {
		return Claim{}, &ValidationError{Field: "domain_uuid", Reason: fmt.Sprintf("must be 1 to %d printable bytes", MaxIDLen)}
	}
	if len(use.Name) > MaxDomainNameLen || !printable(use.Name) {
		return Claim{}, &ValidationError{Field: "domain_name", Reason: fmt.Sprintf("must be printable and at most %d bytes", MaxDomainNameLen)}
	}
	now = now.UTC()
	var out Claim
	err := l.write(func(tx *fileTx, st *state) (bool, error) {
		rec, ok := st.claims[id]
		if !ok || rec.State != StateCommitted {
			return false, fmt.Errorf("claim %s is not committed on this server: %w", id, ErrNotFound)
		}
		if !slices.Equal(rec.GPUs, gpus) {
			return false, &ConflictError{ID: id, Existing: rec.Claim}
		}
		old := rec.Use
		switch {
		case old.Domain == use.Domain && old.BootID == use.BootID:
			use.Since = old.Since
			if old == use {
				out = rec.Claim
				return false, nil
			}
		case old.Domain != "" && old.BootID == use.BootID:
			return false, &InUseError{ID: id, Use: old}
		default:
			use.Since = now
		}
		rec.Use = use
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

// EndUse ends domain's use of claim id: when the claim is marked in use by
// domain, the mark is removed, and with release the claim itself too, but
// only if the domain had started (a start that failed or was refused
// releases nothing). released says whether the claim went. A claim marked
// by another domain, or by none, is left as it is: ErrNotMarked. No claim:
// ErrNotFound.
func (l *Ledger) EndUse(id, domain string, release bool, now time.Time) (c Claim, released bool, err error) {
	if err := ValidateID(id); err != nil {
		return Claim{}, false, err
	}
	now = now.UTC()
	err = l.write(func(tx *fileTx, st *state) (bool, error) {
		released = false // fn may run more than once (Ledger.write)
		rec, ok := st.claims[id]
		if !ok || !rec.Live(now) {
			return false, notFound(id)
		}
		c = rec.Claim
		if rec.State != StateCommitted || rec.Use.Domain != domain || domain == "" {
			return false, fmt.Errorf("claim %s: %w (marked by %q)", id, ErrNotMarked, rec.Use.Domain)
		}
		if release && rec.Use.Started {
			released = true
			return true, st.deleteClaim(tx, id)
		}
		rec.Use = Use{}
		c = rec.Claim
		return true, st.putClaim(tx, rec)
	})
	if err != nil {
		return Claim{}, false, err
	}
	return copyClaim(c), released, nil
}
