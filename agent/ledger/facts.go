package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// MaxFactsLen bounds one facts blob; NVML's answers about a card are a few
// kilobytes at most, and bbolt keeps large values on overflow pages.
const MaxFactsLen = 64 << 10

// PutFacts stores what NVML told the inventory about the GPU at addr (opaque
// JSON), so that it is still known once the card is bound to vfio-pci and
// NVML no longer sees it. Facts are a cache, not ledger state: they do not
// move the revision. An identical blob is not rewritten.
func (l *Ledger) PutFacts(addr string, data []byte) error {
	if err := ValidateAddress(addr); err != nil {
		return err
	}
	if len(data) > MaxFactsLen {
		return fmt.Errorf("facts of GPU %s are %d bytes; at most %d", addr, len(data), MaxFactsLen)
	}
	if !json.Valid(data) {
		return fmt.Errorf("facts of GPU %s are not valid JSON; the inventory must store what it can read back", addr)
	}
	// bbolt serialises writers anyway; taking fileMu keeps the rule simple
	// (one file transaction at a time) and orders facts with Close.
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	start := time.Now()
	err := l.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketFacts)
		if bytes.Equal(b.Get([]byte(addr)), data) {
			return errUnchanged
		}
		return b.Put([]byte(addr), bytes.Clone(data))
	})
	switch {
	case errors.Is(err, errUnchanged):
	case err != nil:
		err = fmt.Errorf("ledger %s: write facts of GPU %s: %w", l.path, addr, err)
		l.wrote(OpFacts, err)
		return err
	default:
		l.syncs.Add(1)
		l.took(OpFacts, start)
		l.wrote(OpFacts, nil)
	}
	return nil
}

// Facts returns every stored facts blob by PCI address.
func (l *Ledger) Facts() (map[string][]byte, error) {
	out := map[string][]byte{}
	err := l.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketFacts).ForEach(func(k, v []byte) error {
			// bbolt's slices are only valid inside the transaction.
			out[string(k)] = bytes.Clone(v)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("ledger %s: read facts: %w", l.path, err)
	}
	return out, nil
}
