package gossip

import (
	"encoding/binary"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/memberlist"
	"pgregory.net/rapid"
)

// largeSummary is a realistic worst case: every model of the platform and a
// few more on one server, long peer address, big revision.
func largeSummary() Summary {
	return Summary{
		AgentVersion: "v1.12.3-rc.1+g0123456789ab",
		PeerAddr:     "gpu-server-0423.rack17.fra1.example.net:7443",
		Drained:      true,
		Revision:     1<<40 + 12345,
		Boot:         0xfedcba9876543210,
		Models: []ModelCapacity{
			{Model: "NVIDIA RTX 6000 Pro", Total: 8, Free: 3, Healthy: 8},
			{Model: "NVIDIA H100 80GB", Total: 8, Free: 8, Healthy: 7},
			{Model: "NVIDIA L40S", Total: 10, Free: 0, Healthy: 10},
			{Model: "NVIDIA A100 80GB", Total: 8, Free: 1, Healthy: 8},
			{Model: "NVIDIA H100 NVL", Total: 8, Free: 2, Healthy: 8},
			{Model: "NVIDIA H200", Total: 8, Free: 4, Healthy: 8},
			{Model: "NVIDIA A100 40GB", Total: 8, Free: 5, Healthy: 6},
			{Model: "10de:2bb4", Total: 4, Free: 4, Healthy: 4},
		},
	}
}

// sorted returns s as Decode returns it after Encode: models by name, an
// empty model list as nil.
func sorted(s Summary) Summary {
	s.Models = slices.Clone(s.Models)
	slices.SortFunc(s.Models, func(a, b ModelCapacity) int { return strings.Compare(a.Model, b.Model) })
	if len(s.Models) == 0 {
		s.Models = nil
	}
	return s
}

func TestSummaryRoundTripLarge(t *testing.T) {
	s := largeSummary()
	b, err := s.Encode()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("realistic large summary (%d models): %d of %d bytes", len(s.Models), len(b), memberlist.MetaMaxSize)
	if len(b) > memberlist.MetaMaxSize/2 {
		t.Errorf("large summary takes %d bytes; keep it well under %d", len(b), memberlist.MetaMaxSize)
	}
	got, err := DecodeSummary(b)
	if err != nil {
		t.Fatal(err)
	}
	if want := sorted(s); !reflect.DeepEqual(got, want) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, want)
	}
}

func TestSummaryEncodeSortsModels(t *testing.T) {
	a := Summary{Models: []ModelCapacity{{Model: "NVIDIA L40S", Total: 1}, {Model: "NVIDIA A100 80GB", Total: 2}}}
	b := Summary{Models: []ModelCapacity{{Model: "NVIDIA A100 80GB", Total: 2}, {Model: "NVIDIA L40S", Total: 1}}}
	ea, err := a.Encode()
	if err != nil {
		t.Fatal(err)
	}
	eb, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if string(ea) != string(eb) {
		t.Error("the same capacity in another order encodes differently; Publish would re-advertise for nothing")
	}
}

func genSummary(t *rapid.T) Summary {
	name := rapid.OneOf(
		rapid.StringMatching(`NVIDIA [A-Z0-9 ]{1,20}`),
		rapid.StringOfN(rapid.Rune(), 1, 12, maxModelNameLen),
	)
	names := rapid.SliceOfNDistinct(name, 0, 8, func(s string) string { return s }).Draw(t, "names")
	s := Summary{
		AgentVersion: rapid.StringOfN(rapid.Rune(), 0, 16, maxAgentVersionLen).Draw(t, "version"),
		PeerAddr:     rapid.StringOfN(rapid.Rune(), 0, 32, maxPeerAddrLen).Draw(t, "peer"),
		Drained:      rapid.Bool().Draw(t, "drained"),
		Leaving:      rapid.Bool().Draw(t, "leaving"),
		Revision:     rapid.Uint64().Draw(t, "revision"),
		Boot:         rapid.Uint64().Draw(t, "boot"),
	}
	for _, n := range names {
		total := rapid.Uint16().Draw(t, "total")
		s.Models = append(s.Models, ModelCapacity{
			Model:   n,
			Total:   total,
			Free:    rapid.Uint16Max(total).Draw(t, "free"),
			Healthy: rapid.Uint16Max(total).Draw(t, "healthy"),
		})
	}
	return s
}

func TestSummaryRoundTripProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := genSummary(t)
		b, err := s.Encode()
		if errors.Is(err, ErrSummaryTooLarge) {
			t.Skip("does not fit; Encode refused it as it must")
		}
		if err != nil {
			t.Fatalf("encode a valid summary: %v", err)
		}
		if len(b) > memberlist.MetaMaxSize {
			t.Fatalf("encoded %d bytes, over memberlist's limit", len(b))
		}
		got, err := DecodeSummary(b)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if want := sorted(s); !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
		}
	})
}

// An agent of today must read what a newer agent writes: unknown fields,
// unknown flag bits and per-model extras are skipped.
func TestSummaryOldDecoderSkipsNewFields(t *testing.T) {
	s := Summary{PeerAddr: "10.0.0.7:7443", Revision: 9, Models: []ModelCapacity{{Model: "NVIDIA L40S", Total: 4, Free: 2, Healthy: 4}}}
	b, err := s.Encode()
	if err != nil {
		t.Fatal(err)
	}
	// A newer agent appends a field of a type this one has never heard of,
	// puts another in front, sets a flag bit from the future and adds a
	// per-model value after the counts.
	future := []byte{summaryFormatV1}
	future = appendTLV(future, 200, []byte("rack=17;zone=b"))
	future = append(future, b[1:]...)
	future = appendTLV(future, 77, make([]byte, 300)) // longer than one length byte
	future = appendTLV(future, fieldFlags, binary.AppendUvarint(nil, flagDrained|1<<9))
	model := binary.AppendUvarint(nil, 4)
	model = append(model, "H200"...)
	model = append(model, 8, 8, 7, 1, 0xAA, 0xBB) // counts, unusable, then 2 bytes of a future per-model field
	future = appendTLV(future, fieldModelNVIDIA, model)

	got, err := DecodeSummary(future)
	if err != nil {
		t.Fatalf("old decoder rejected a newer summary: %v", err)
	}
	want := Summary{
		PeerAddr: "10.0.0.7:7443", Revision: 9, Drained: true,
		Models: []ModelCapacity{{Model: "NVIDIA L40S", Total: 4, Free: 2, Healthy: 4}, {Model: "NVIDIA H200", Total: 8, Free: 8, Healthy: 7, Unusable: 1}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

// The unusable count rides after the three counts, only when not zero, so a
// summary without unusable GPUs is byte for byte what older agents wrote,
// and older agents skip it as a future per-model field.
func TestSummaryUnusableCount(t *testing.T) {
	plain := Summary{Models: []ModelCapacity{{Model: "NVIDIA L40S", Total: 4, Free: 2, Healthy: 4}}}
	with := Summary{Models: []ModelCapacity{{Model: "NVIDIA L40S", Total: 4, Free: 2, Healthy: 3, Unusable: 1}}}
	a, err := plain.Encode()
	if err != nil {
		t.Fatal(err)
	}
	b, err := with.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != len(a)+1 {
		t.Errorf("unusable costs %d bytes, want 1", len(b)-len(a))
	}
	for _, s := range []Summary{plain, with} {
		enc, _ := s.Encode()
		got, err := DecodeSummary(enc)
		if err != nil || !reflect.DeepEqual(got, s) {
			t.Errorf("round trip %+v: %+v, %v", s, got, err)
		}
	}
	bad := Summary{Models: []ModelCapacity{{Model: "NVIDIA L40S", Total: 1, Unusable: 2}}}
	if _, err := bad.Encode(); err == nil {
		t.Error("more unusable than total encoded")
	}
}

func TestSummaryStripsNVIDIAPrefix(t *testing.T) {
	long, err := Summary{Models: []ModelCapacity{{Model: "NVIDIA H100 80GB", Total: 1}}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	short, err := Summary{Models: []ModelCapacity{{Model: "H100 80GB", Total: 1}}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if len(long) != len(short) {
		t.Errorf("the NVIDIA prefix costs %d bytes on the wire; it should cost none", len(long)-len(short))
	}
	got, err := DecodeSummary(long)
	if err != nil || got.Models[0].Model != "NVIDIA H100 80GB" {
		t.Errorf("prefix not restored: %+v, %v", got, err)
	}
}

func TestSummaryEncodeRefuses(t *testing.T) {
	manyModels := Summary{}
	for i := range 40 {
		manyModels.Models = append(manyModels.Models, ModelCapacity{Model: strings.Repeat("x", 30) + string(rune('A'+i)), Total: 1})
	}
	tests := []struct {
		name string
		s    Summary
		want string
	}{
		{"too large for NodeMeta", manyModels, "512-byte"},
		{"too many models", Summary{Models: make([]ModelCapacity, maxModels+1)}, "at most"},
		{"unnamed model", Summary{Models: []ModelCapacity{{Total: 1}}}, "no name"},
		{"duplicate model", Summary{Models: []ModelCapacity{{Model: "NVIDIA L40S"}, {Model: "NVIDIA L40S"}}}, "twice"},
		{"free over total", Summary{Models: []ModelCapacity{{Model: "NVIDIA L40S", Total: 1, Free: 2}}}, "free"},
		{"healthy over total", Summary{Models: []ModelCapacity{{Model: "NVIDIA L40S", Total: 1, Healthy: 2}}}, "healthy"},
		{"long version", Summary{AgentVersion: strings.Repeat("v", maxAgentVersionLen+1)}, "agent version"},
		{"long peer address", Summary{PeerAddr: strings.Repeat("h", maxPeerAddrLen+1)}, "peer address"},
		{"long model name", Summary{Models: []ModelCapacity{{Model: strings.Repeat("m", maxModelNameLen+1)}}}, "model name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.s.Encode()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Encode error = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

func TestDecodeSummaryMalformed(t *testing.T) {
	valid, err := largeSummary().Encode()
	if err != nil {
		t.Fatal(err)
	}
	v := byte(summaryFormatV1)
	tests := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"unknown format", []byte{0xC2}},
		{"not gpuherd", []byte("consul-meta")},
		{"missing length", []byte{v, fieldPeerAddr}},
		{"unterminated length varint", []byte{v, fieldPeerAddr, 0x80}},
		{"length past end", []byte{v, fieldPeerAddr, 5, 'a', 'b'}},
		{"huge length", []byte{v, 99, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"revision not a varint", []byte{v, fieldRevision, 1, 0x80}},
		{"revision with trailing byte", []byte{v, fieldRevision, 2, 1, 1}},
		{"revision twice", []byte{v, fieldRevision, 1, 1, fieldRevision, 1, 2}},
		{"boot not a varint", []byte{v, fieldBoot, 1, 0x80}},
		{"model name past end", []byte{v, fieldModel, 2, 9, 'a'}},
		{"model without counts", []byte{v, fieldModel, 2, 1, 'a'}},
		{"model count over uint16", []byte{v, fieldModel, 6, 1, 'a', 0x80, 0x80, 0x04, 0}},
		{"model free over total", []byte{v, fieldModel, 5, 1, 'a', 1, 2, 1}},
		{"model empty name", []byte{v, fieldModel, 4, 0, 1, 1, 1}},
		{"model twice", []byte{v, fieldModel, 5, 1, 'a', 1, 1, 1, fieldModel, 5, 1, 'a', 1, 1, 1}},
		{"too long for NodeMeta", append(slices.Clone(valid), make([]byte, memberlist.MetaMaxSize)...)},
		{"truncated", valid[:len(valid)-1]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if s, err := DecodeSummary(tt.b); err == nil {
				t.Errorf("DecodeSummary(%x) = %+v, want an error", tt.b, s)
			}
		})
	}
}

// Every prefix of a valid summary either decodes or fails cleanly.
func TestDecodeSummaryEveryTruncation(t *testing.T) {
	b, err := largeSummary().Encode()
	if err != nil {
		t.Fatal(err)
	}
	for i := range len(b) {
		_, _ = DecodeSummary(b[:i])
	}
}

func FuzzDecodeSummary(f *testing.F) {
	for _, s := range []Summary{{}, largeSummary(), {PeerAddr: "[::1]:7443", Models: []ModelCapacity{{Model: "10de:2bb5", Total: 65535, Free: 65535}}}} {
		b, err := s.Encode()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{summaryFormatV1, 200, 3, 'x', 'y', 'z'})
	f.Add([]byte{summaryFormatV1, fieldModel, 0x80})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeSummary(b)
		if err != nil {
			return
		}
		// Whatever decodes must re-encode (Publish relies on it), no larger
		// than it came, and read back the same.
		again, err := s.Encode()
		if err != nil {
			t.Fatalf("decoded %+v but cannot re-encode it: %v", s, err)
		}
		if len(again) > len(b) {
			t.Fatalf("re-encoding grew from %d to %d bytes", len(b), len(again))
		}
		back, err := DecodeSummary(again)
		if err != nil {
			t.Fatalf("re-encoded summary does not decode: %v", err)
		}
		if want := sorted(s); !reflect.DeepEqual(back, want) {
			t.Fatalf("re-encode round trip:\n got %+v\nwant %+v", back, want)
		}
	})
}
