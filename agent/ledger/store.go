package ledger

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"
)

// SchemaVersion is the newest layout of the ledger file this code reads.
// Bump it, with a migration in initFile, whenever a record changes in a way
// an older gpuherd would misread; an older gpuherd then refuses the file
// instead of corrupting it.
//
// Schema 2 is schema 1 with a journal beside the file that may hold writes
// the file does not (journal.go). An open ledger marks its file 2, and
// Close, once the journal is all in the file, marks it 1 again: a gpuherd
// that knows no journal reads a ledger closed cleanly, and refuses one
// whose agent was killed, rather than miss the journal's claims.
const SchemaVersion = 2

// The schemas this code writes: schemaSettled when the file holds every
// write (a new file, a clean Close, a journal applied by the operator's
// tools), schemaJournalled while a ledger has it open.
const (
	schemaSettled    = 1
	schemaJournalled = 2
)

// The file layout (schema 1). Values are JSON so that `bbolt get` shows an
// operator something readable in an emergency. The claims bucket holds
// committed claims only; an older gpuherd also wrote reservations there,
// which Open removes (see dropFileReservations).
var (
	bucketMeta   = []byte("meta")   // schema: decimal; revision: uint64 big-endian
	bucketClaims = []byte("claims") // claim ID -> claimRecord
	bucketDrains = []byte("drains") // PCI address -> drainRecord
	bucketFacts  = []byte("facts")  // PCI address -> opaque JSON from the inventory

	keySchema   = []byte("schema")
	keyRevision = []byte("revision")
)

// claimRecord is a claim as stored: the claim, plus the model of each of its
// GPUs at reservation time, so that a GPU which has since vanished from the
// inventory can still be reported with its model.
type claimRecord struct {
	Claim
	GPUModels map[string]string `json:"gpu_models,omitempty"`
}

// drainRecord is one drained GPU.
type drainRecord struct {
	Model  string    `json:"model"` // at drain time, for reporting if it vanishes
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

// state is the whole ledger in memory: what the file holds, plus the
// reservations and the inventory, which are not in it. A writer changes a
// copy (clone) or, when it must write the file, a fresh one built from the
// file inside its transaction; readers use the last published one.
//
// Its methods that change claims and drains take the write transaction, or
// nil for a change in memory only: a reservation is only ever in memory,
// while a committed claim or a drain is written through tx, and with tx nil
// the method fails with errNeedsFile before changing anything.
type state struct {
	claims    map[string]claimRecord // committed claims (in the file) and reservations (memory only), by ID
	drains    map[string]drainRecord
	rev       uint64
	inventory map[string]GPU // by address; replaced, never modified in place
}

// clone copies st's maps so that the copy can be changed while st stays
// published. Records are values whose slices and maps are never modified in
// place, and the inventory is only ever replaced, so they are shared.
func (st *state) clone() *state {
	return &state{
		claims:    maps.Clone(st.claims),
		drains:    maps.Clone(st.drains),
		rev:       st.rev,
		inventory: st.inventory,
	}
}

// reservations returns the reservations of st, live or not, sorted by ID.
func (st *state) reservations() []claimRecord {
	var out []claimRecord
	for _, rec := range st.claims {
		if rec.State == StateReserved {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b claimRecord) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// load reads and checks every record; the first one that fails is reported
// by bucket and key.
func load(tx recordReader, path string) (*state, error) {
	st := &state{
		claims:    map[string]claimRecord{},
		drains:    map[string]drainRecord{},
		inventory: map[string]GPU{},
	}
	for _, name := range [][]byte{bucketMeta, bucketClaims, bucketDrains, bucketFacts} {
		if !tx.hasBucket(name) {
			return nil, &CorruptError{Path: path, Bucket: string(name), Err: fmt.Errorf("bucket missing")}
		}
	}

	raw := tx.get(bucketMeta, keySchema)
	schema, err := strconv.Atoi(string(raw))
	if err != nil || schema < 1 {
		return nil, &CorruptError{Path: path, Bucket: "meta", Key: string(keySchema), Err: fmt.Errorf("schema version %q is not a positive number", raw)}
	}
	if schema > SchemaVersion {
		return nil, fmt.Errorf("ledger %s: %w: the file has schema %d, this gpuherd reads up to %d; run the newer gpuherd again, or restore a backup made before the upgrade",
			path, ErrSchemaTooNew, schema, SchemaVersion)
	}
	raw = tx.get(bucketMeta, keyRevision)
	if len(raw) != 8 {
		return nil, &CorruptError{Path: path, Bucket: "meta", Key: string(keyRevision), Err: fmt.Errorf("want 8 bytes, have %d", len(raw))}
	}
	st.rev = binary.BigEndian.Uint64(raw)

	err = tx.forEach(bucketClaims, func(k, v []byte) error {
		rec, err := decodeClaim(k, v)
		if err != nil {
			return &CorruptError{Path: path, Bucket: "claims", Key: string(k), Err: err}
		}
		st.claims[rec.ID] = rec
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = tx.forEach(bucketDrains, func(k, v []byte) error {
		var d drainRecord
		if err := json.Unmarshal(v, &d); err != nil {
			return &CorruptError{Path: path, Bucket: "drains", Key: string(k), Err: err}
		}
		st.drains[string(k)] = d
		return nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// decodeClaim decodes a claim and checks what the rest of the ledger relies
// on, so that a damaged record is refused at Open, not misused later.
func decodeClaim(k, v []byte) (claimRecord, error) {
	var rec claimRecord
	if err := json.Unmarshal(v, &rec); err != nil {
		return rec, err
	}
	switch {
	case rec.ID != string(k):
		return rec, fmt.Errorf("holds claim %q under key %q", rec.ID, k)
	case rec.State != StateReserved && rec.State != StateCommitted:
		return rec, fmt.Errorf("unknown state %q", rec.State)
	case rec.State == StateReserved && rec.ExpiresAt.IsZero():
		return rec, fmt.Errorf("reservation without a lease deadline")
	case len(rec.GPUs) == 0:
		return rec, fmt.Errorf("claim holds no GPU")
	}
	return rec, nil
}

func encodeRevision(rev uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, rev)
}

// putClaim stores rec: a reservation in memory only, a committed claim in
// the file through tx (errNeedsFile when tx is nil).
func (st *state) putClaim(tx *fileTx, rec claimRecord) error {
	if old, ok := st.claims[rec.ID]; ok && old.State == StateCommitted && rec.State != StateCommitted {
		// A committed claim is live until released, so no operation
		// replaces it with a reservation; if one did, the file's record
		// must go too.
		if err := st.deleteClaim(tx, rec.ID); err != nil {
			return err
		}
	}
	if rec.State == StateReserved {
		st.claims[rec.ID] = rec
		return nil
	}
	if tx == nil {
		return errNeedsFile
	}
	v, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode claim %q: %w", rec.ID, err)
	}
	tx.put(bucketClaims, []byte(rec.ID), v)
	st.claims[rec.ID] = rec
	return nil
}

// deleteClaim removes claim id: a reservation from memory, a committed
// claim from the file through tx (errNeedsFile when tx is nil).
func (st *state) deleteClaim(tx *fileTx, id string) error {
	if rec, ok := st.claims[id]; !ok || rec.State == StateReserved {
		delete(st.claims, id)
		return nil
	}
	if tx == nil {
		return errNeedsFile
	}
	tx.delete(bucketClaims, []byte(id))
	delete(st.claims, id)
	return nil
}

// putDrain stores a drain in the file through tx (errNeedsFile when tx is nil).
func (st *state) putDrain(tx *fileTx, addr string, d drainRecord) error {
	if tx == nil {
		return errNeedsFile
	}
	v, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("encode drain of GPU %s: %w", addr, err)
	}
	tx.put(bucketDrains, []byte(addr), v)
	st.drains[addr] = d
	return nil
}

// deleteDrain removes a drain from the file through tx (errNeedsFile when tx
// is nil).
func (st *state) deleteDrain(tx *fileTx, addr string) error {
	if tx == nil {
		return errNeedsFile
	}
	tx.delete(bucketDrains, []byte(addr))
	delete(st.drains, addr)
	return nil
}

// busy maps every GPU held by a live claim at now to that claim's ID.
func (st *state) busy(now time.Time) map[string]string {
	out := map[string]string{}
	for _, rec := range st.claims {
		if rec.Live(now) {
			for _, g := range rec.GPUs {
				out[g] = rec.ID
			}
		}
	}
	return out
}
