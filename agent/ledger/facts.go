package ledger

import (
	"bytes"
	"encoding/json"
	"fmt"
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
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	err := l.journalWrite(OpFacts, func(tx *fileTx) error {
		if !bytes.Equal(tx.get(bucketFacts, []byte(addr)), data) {
			tx.put(bucketFacts, []byte(addr), data)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("ledger %s: write facts of GPU %s: %w", l.path, addr, err)
	}
	return nil
}

// Facts returns every stored facts blob by PCI address.
func (l *Ledger) Facts() (map[string][]byte, error) {
	out := map[string][]byte{}
	err := l.view(func(tx recordReader) error {
		return tx.forEach(bucketFacts, func(k, v []byte) error {
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
