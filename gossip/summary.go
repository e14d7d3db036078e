package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/memberlist"
)

// Summary is the capacity a server publishes to the others as its memberlist
// NodeMeta. It is a hint for placement; the owner's ledger is the truth.
type Summary struct {
	AgentVersion string          // version of the gpuherd agent that published it
	PeerAddr     string          // host:port of the owner's mTLS peer API
	Drained      bool            // whole server cordoned: no new claims there
	Leaving      bool            // a graceful leave is under way (set by Cluster.Leave)
	Revision     uint64          // owner's ledger revision: a newer one wins
	Boot         uint64          // random per agent run: a restart behind the same name shows as a new boot
	Models       []ModelCapacity // per model, sorted by name when encoded
	Names        NamesInfo       // its part in the name registry
}

// ModelCapacity is how many GPUs of one model a server has, has free, has
// healthy, and has unusable (healthy, but they cannot be passed through:
// neither free nor healthy).
type ModelCapacity struct {
	Model    string
	Total    uint16
	Free     uint16
	Healthy  uint16
	Unusable uint16
}

// Wire format, version 1:
//
//	byte 0      summaryFormatV1 (magic and version in one byte)
//	then TLVs   type (1 byte) | length (uvarint) | value (length bytes)
//
// A decoder skips TLV types it does not know, so a newer agent can add fields
// without breaking older ones; the leading byte changes only for a change an
// older decoder must not misread. Inside a model field the fixed values are
// followed by whatever a newer agent appends; an older decoder ignores that
// tail, so per-model fields can be added the same way.
//
// Model names almost all start with "NVIDIA "; fieldModelNVIDIA stores the name
// without that prefix and the decoder puts it back, which saves 7 bytes per
// model and keeps 8 models far below memberlist's 512-byte limit.
const (
	summaryFormatV1 byte = 0xC1

	fieldAgentVersion byte = 1 // string
	fieldPeerAddr     byte = 2 // string
	fieldFlags        byte = 3 // uvarint bit set, see flag*
	fieldRevision     byte = 4 // uvarint
	fieldModel        byte = 5 // model, name stored verbatim
	fieldModelNVIDIA  byte = 6 // model, name stored without modelPrefix
	fieldBoot         byte = 7 // uvarint

	flagDrained uint64 = 1 << 0
	flagLeaving uint64 = 1 << 1

	modelPrefix = "NVIDIA "
)

// Limits keep a summary well inside memberlist.MetaMaxSize and bound what a
// broken or hostile peer can make a decoder allocate. Decode enforces the same
// limits as Encode so whatever decodes also re-encodes.
const (
	maxAgentVersionLen = 64
	maxPeerAddrLen     = 128
	maxModelNameLen    = 64
	maxModels          = 64
)

// ErrSummaryTooLarge is returned by Encode when the summary does not fit in
// memberlist's NodeMeta; the caller keeps publishing its previous summary.
var ErrSummaryTooLarge = errors.New("gossip: capacity summary exceeds memberlist's 512-byte node metadata limit")

// Encode returns the compact binary form of s, with Models sorted by name.
// It fails, instead of producing something memberlist would panic on, when
// the summary is invalid or larger than memberlist.MetaMaxSize.
func (s Summary) Encode() ([]byte, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	models := slices.Clone(s.Models)
	slices.SortFunc(models, func(a, b ModelCapacity) int { return strings.Compare(a.Model, b.Model) })

	b := make([]byte, 0, 256)
	b = append(b, summaryFormatV1)
	if s.AgentVersion != "" {
		b = appendTLV(b, fieldAgentVersion, []byte(s.AgentVersion))
	}
	if s.PeerAddr != "" {
		b = appendTLV(b, fieldPeerAddr, []byte(s.PeerAddr))
	}
	var flags uint64
	if s.Drained {
		flags |= flagDrained
	}
	if s.Leaving {
		flags |= flagLeaving
	}
	if flags != 0 {
		b = appendTLV(b, fieldFlags, binary.AppendUvarint(nil, flags))
	}
	if s.Revision != 0 {
		b = appendTLV(b, fieldRevision, binary.AppendUvarint(nil, s.Revision))
	}
	if s.Boot != 0 {
		b = appendTLV(b, fieldBoot, binary.AppendUvarint(nil, s.Boot))
	}
	b = s.Names.append(b)
	var v []byte
	for _, m := range models {
		typ, name := fieldModel, m.Model
		if rest, ok := strings.CutPrefix(m.Model, modelPrefix); ok {
			typ, name = fieldModelNVIDIA, rest
		}
		v = binary.AppendUvarint(v[:0], uint64(len(name)))
		v = append(v, name...)
		v = binary.AppendUvarint(v, uint64(m.Total))
		v = binary.AppendUvarint(v, uint64(m.Free))
		v = binary.AppendUvarint(v, uint64(m.Healthy))
		if m.Unusable > 0 {
			// A per-model tail field: agents before it ignore it.
			v = binary.AppendUvarint(v, uint64(m.Unusable))
		}
		b = appendTLV(b, typ, v)
	}
	if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("%w: %d bytes for %d models; shorten the model names or the peer address", ErrSummaryTooLarge, len(b), len(models))
	}
	return b, nil
}

// validate checks the rules Encode and DecodeSummary share.
func (s Summary) validate() error {
	if len(s.AgentVersion) > maxAgentVersionLen {
		return fmt.Errorf("gossip: agent version %q is longer than %d bytes", s.AgentVersion, maxAgentVersionLen)
	}
	if len(s.PeerAddr) > maxPeerAddrLen {
		return fmt.Errorf("gossip: peer address %q is longer than %d bytes", s.PeerAddr, maxPeerAddrLen)
	}
	if err := s.Names.validate(); err != nil {
		return err
	}
	if len(s.Models) > maxModels {
		return fmt.Errorf("gossip: %d models in the capacity summary, at most %d fit", len(s.Models), maxModels)
	}
	seen := make(map[string]bool, len(s.Models))
	for _, m := range s.Models {
		if err := m.validate(); err != nil {
			return err
		}
		if seen[m.Model] {
			return fmt.Errorf("gossip: model %q appears twice in the capacity summary; merge its counts", m.Model)
		}
		seen[m.Model] = true
	}
	return nil
}

func (m ModelCapacity) validate() error {
	switch {
	case m.Model == "":
		return errors.New("gossip: a model in the capacity summary has no name")
	case len(m.Model) > maxModelNameLen:
		return fmt.Errorf("gossip: model name %q is longer than %d bytes", m.Model, maxModelNameLen)
	case m.Free > m.Total:
		return fmt.Errorf("gossip: model %q has %d free of %d GPUs", m.Model, m.Free, m.Total)
	case m.Healthy > m.Total:
		return fmt.Errorf("gossip: model %q has %d healthy of %d GPUs", m.Model, m.Healthy, m.Total)
	case m.Unusable > m.Total:
		return fmt.Errorf("gossip: model %q has %d unusable of %d GPUs", m.Model, m.Unusable, m.Total)
	}
	return nil
}

func appendTLV(b []byte, typ byte, value []byte) []byte {
	b = append(b, typ)
	b = binary.AppendUvarint(b, uint64(len(value)))
	return append(b, value...)
}

// DecodeSummary parses what Encode produced, by this or a newer agent. It
// skips fields it does not know and fails, never panics, on anything truncated,
// malformed or over the limits; a member whose summary fails to decode is
// listed but not used for placement.
func DecodeSummary(b []byte) (Summary, error) {
	var s Summary
	if len(b) == 0 {
		return s, errors.New("gossip: empty capacity summary (the peer publishes no gpuherd metadata)")
	}
	if len(b) > memberlist.MetaMaxSize {
		return s, fmt.Errorf("gossip: capacity summary of %d bytes exceeds %d", len(b), memberlist.MetaMaxSize)
	}
	if b[0] != summaryFormatV1 {
		return s, fmt.Errorf("gossip: capacity summary format 0x%02x is not understood by this agent (it reads 0x%02x); upgrade it", b[0], summaryFormatV1)
	}
	r := b[1:]
	seen := make(map[byte]bool)
	for len(r) > 0 {
		typ := r[0]
		n, k := binary.Uvarint(r[1:])
		if k <= 0 {
			return Summary{}, fmt.Errorf("gossip: capacity summary field %d: bad length", typ)
		}
		r = r[1+k:]
		if n > uint64(len(r)) {
			return Summary{}, fmt.Errorf("gossip: capacity summary field %d: %d bytes announced, %d left (truncated)", typ, n, len(r))
		}
		v := r[:n]
		r = r[n:]
		if typ != fieldModel && typ != fieldModelNVIDIA {
			if seen[typ] {
				return Summary{}, fmt.Errorf("gossip: capacity summary field %d appears twice", typ)
			}
			seen[typ] = true
		}
		if err := s.decodeField(typ, v); err != nil {
			return Summary{}, err
		}
	}
	if err := s.validate(); err != nil {
		return Summary{}, err
	}
	return s, nil
}

func (s *Summary) decodeField(typ byte, v []byte) error {
	if ok, err := s.decodeNamesField(typ, v); ok {
		return err
	}
	switch typ {
	case fieldAgentVersion:
		s.AgentVersion = string(v)
	case fieldPeerAddr:
		s.PeerAddr = string(v)
	case fieldFlags:
		flags, err := fullUvarint(v)
		if err != nil {
			return fmt.Errorf("gossip: capacity summary flags: %w", err)
		}
		// Unknown bits are a newer agent's flags: ignored like unknown fields.
		s.Drained = flags&flagDrained != 0
		s.Leaving = flags&flagLeaving != 0
	case fieldRevision:
		rev, err := fullUvarint(v)
		if err != nil {
			return fmt.Errorf("gossip: capacity summary revision: %w", err)
		}
		s.Revision = rev
	case fieldBoot:
		boot, err := fullUvarint(v)
		if err != nil {
			return fmt.Errorf("gossip: capacity summary boot: %w", err)
		}
		s.Boot = boot
	case fieldModel, fieldModelNVIDIA:
		m, err := decodeModel(v, typ == fieldModelNVIDIA)
		if err != nil {
			return err
		}
		if len(s.Models) == maxModels {
			return fmt.Errorf("gossip: capacity summary has more than %d models", maxModels)
		}
		s.Models = append(s.Models, m)
	}
	return nil
}

func decodeModel(v []byte, prefixed bool) (ModelCapacity, error) {
	var m ModelCapacity
	n, k := binary.Uvarint(v)
	if k <= 0 || n > uint64(len(v)-k) {
		return m, errors.New("gossip: capacity summary model: bad or truncated name")
	}
	m.Model = string(v[k : k+int(n)])
	if prefixed {
		m.Model = modelPrefix + m.Model
	}
	v = v[k+int(n):]
	for _, dst := range []*uint16{&m.Total, &m.Free, &m.Healthy} {
		x, k := binary.Uvarint(v)
		if k <= 0 {
			return m, fmt.Errorf("gossip: capacity summary model %q: truncated counts", m.Model)
		}
		if x > 0xFFFF {
			return m, fmt.Errorf("gossip: capacity summary model %q: count %d out of range", m.Model, x)
		}
		*dst = uint16(x)
		v = v[k:]
	}
	// The unusable count, when there is one; bytes left after it are
	// per-model fields of a newer agent: ignored.
	if x, k := binary.Uvarint(v); k > 0 && x <= 0xFFFF {
		m.Unusable = uint16(x)
	}
	return m, nil
}

// fullUvarint decodes a value that must be exactly one uvarint.
func fullUvarint(v []byte) (uint64, error) {
	x, k := binary.Uvarint(v)
	if k <= 0 || k != len(v) {
		return 0, errors.New("not a single unsigned varint")
	}
	return x, nil
}
