package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// Integrity: records that each read fine may still contradict each other —
// one GPU in two claims, a claim naming a GPU it recorded no model for, a
// claim whose items do not match its GPUs' models. Such a file comes from a
// bug, an older gpuherd or a hand edit, never from this ledger's own writes
// (each write is one check-and-take under the writer lock). Serving from it
// would hand one GPU to two VMs, or one the claim never asked for, so Open
// refuses it as it refuses an unreadable record, and Inspect lists every
// problem, unreadable records included, rather than only the first.

// ErrIntegrity is matched by errors.Is for a *IntegrityError.
var ErrIntegrity = errors.New("the ledger's records contradict each other")

// Problem is one thing wrong with a ledger file: a record that cannot be
// read, or one that contradicts another.
type Problem struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"` // the claim ID, or the PCI address of a drain
	// PCIAddress is the GPU the problem is about, "" when it is the whole record.
	PCIAddress string `json:"pci_address,omitempty"`
	Problem    string `json:"problem"`
	// err is the *CorruptError of an unreadable record, nil otherwise.
	err error
}

func (p Problem) String() string {
	what := fmt.Sprintf("claim %s", p.Key)
	if p.Bucket != string(bucketClaims) {
		what = fmt.Sprintf("record %s/%q", p.Bucket, p.Key)
	}
	return what + ": " + p.Problem
}

// IntegrityError lists every problem found in a ledger file. It unwraps to
// the *CorruptError of each unreadable record, so errors.Is(err,
// ErrCorrupt) holds when one is.
type IntegrityError struct {
	Path     string
	Problems []Problem
}

func (e *IntegrityError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ledger %s: %d problem(s): ", e.Path, len(e.Problems))
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	b.WriteString("; the file was not changed and no driver was moved: stop here, " +
		"find which claim is right with the VMs running on this server (virsh list), " +
		"then restore a backup taken before the problem (README, \"Ledger problems\") " +
		"or remove the wrong claim with `gpuherd ledger remove-claim ID`; " +
		"`gpuherd ledger check` lists the problems again")
	return b.String()
}

// Is makes errors.Is(err, ErrIntegrity) true.
func (e *IntegrityError) Is(target error) bool { return target == ErrIntegrity }

// Unwrap returns the *CorruptError of every unreadable record.
func (e *IntegrityError) Unwrap() []error {
	var out []error
	for _, p := range e.Problems {
		if p.err != nil {
			out = append(out, p.err)
		}
	}
	return out
}

// auditRecords reads every claim and drain record of tx, where load stops at
// the first one it cannot read, and returns every problem: the unreadable
// records, then the contradictions between the readable claims.
func auditRecords(tx *bolt.Tx, path string) []Problem {
	var probs []Problem
	claims := map[string]claimRecord{}
	if b := tx.Bucket(bucketClaims); b != nil {
		_ = b.ForEach(func(k, v []byte) error {
			rec, err := decodeClaim(k, v)
			if err != nil {
				probs = append(probs, Problem{Bucket: string(bucketClaims), Key: string(k),
					Problem: "unreadable: " + err.Error(),
					err:     &CorruptError{Path: path, Bucket: string(bucketClaims), Key: string(k), Err: err}})
				return nil
			}
			claims[rec.ID] = rec
			return nil
		})
	}
	if b := tx.Bucket(bucketDrains); b != nil {
		_ = b.ForEach(func(k, v []byte) error {
			if _, err := decodeDrain(v); err != nil {
				probs = append(probs, Problem{Bucket: string(bucketDrains), Key: string(k),
					Problem: "unreadable: " + err.Error(),
					err:     &CorruptError{Path: path, Bucket: string(bucketDrains), Key: string(k), Err: err}})
			}
			return nil
		})
	}
	return append(probs, contradictions(claims)...)
}

// contradictions returns what the claims say that cannot be true, by claim
// ID: a GPU that is not a PCI address, named twice, or with no model
// recorded (the claim names a GPU the ledger does not hold); items that do
// not match the models of the claim's GPUs; a GPU in two claims.
func contradictions(claims map[string]claimRecord) []Problem {
	var probs []Problem
	add := func(id, addr, format string, args ...any) {
		probs = append(probs, Problem{Bucket: string(bucketClaims), Key: id, PCIAddress: addr, Problem: fmt.Sprintf(format, args...)})
	}
	holder := map[string]string{} // GPU → the first claim (by ID) naming it
	for _, id := range slices.Sorted(maps.Keys(claims)) {
		rec := claims[id]
		got := map[string]int{} // model → GPUs of the claim
		seen := map[string]bool{}
		complete := true // every GPU has a model: the items can be compared
		for _, addr := range rec.GPUs {
			if err := ValidateAddress(addr); err != nil {
				add(id, addr, "%v", err)
				complete = false
				continue
			}
			if seen[addr] {
				add(id, addr, "names GPU %s twice", addr)
				continue
			}
			seen[addr] = true
			if other, taken := holder[addr]; taken {
				add(id, addr, "holds GPU %s, which claim %s holds too: one GPU is in two claims", addr, other)
			} else {
				holder[addr] = id
			}
			model, ok := rec.GPUModels[addr]
			if !ok || model == "" {
				add(id, addr, "names GPU %s, which the ledger does not hold: the record has no model for it", addr)
				complete = false
				continue
			}
			got[model]++
		}
		want := map[string]int{}
		for _, it := range rec.Items {
			want[it.Model] += it.Count
		}
		if complete && !maps.Equal(want, got) {
			add(id, "", "asks for %s but holds %s", describeCounts(want), describeCounts(got))
		}
	}
	return probs
}

// recordsError turns load's failure on one unreadable claim or drain into
// an *IntegrityError listing every problem of the file; other failures
// (the meta bucket, a missing bucket) are returned as they are.
func recordsError(tx *bolt.Tx, path string, err error) error {
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Key == "" || (ce.Bucket != string(bucketClaims) && ce.Bucket != string(bucketDrains)) {
		return err
	}
	return &IntegrityError{Path: path, Problems: auditRecords(tx, path)}
}

// checkIntegrity is nil when the claims of st contradict nothing.
func checkIntegrity(st *state, path string) error {
	if probs := contradictions(st.claims); len(probs) > 0 {
		return &IntegrityError{Path: path, Problems: probs}
	}
	return nil
}

func decodeDrain(v []byte) (drainRecord, error) {
	var d drainRecord
	err := json.Unmarshal(v, &d)
	return d, err
}

// describeCounts prints model counts as "2x A, 1x B", sorted by model.
func describeCounts(m map[string]int) string {
	if len(m) == 0 {
		return "no GPU"
	}
	var parts []string
	for _, model := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%dx %s", m[model], model))
	}
	return strings.Join(parts, ", ")
}
