package gossip

import (
	"strings"
	"testing"
)

func TestSummaryCarriesNamesInfo(t *testing.T) {
	for _, n := range []NamesInfo{
		{},
		{Addr: "10.0.0.7:41234", Role: NamesStandby},
		{Addr: "10.0.0.7:41234", Role: NamesVoter, Leader: true, Registry: "gpu-a@18c2f0e1d2a3b4c5"},
		{Role: NamesClient, Registry: "voters:0a1b2c3d4e5f"},
	} {
		s := Summary{AgentVersion: "1.0", PeerAddr: "10.0.0.7:7947", Names: n,
			Models: []ModelCapacity{{Model: "NVIDIA L40S", Total: 8, Free: 3, Healthy: 8}}}
		b, err := s.Encode()
		if err != nil {
			t.Fatalf("%+v: encode: %v", n, err)
		}
		got, err := DecodeSummary(b)
		if err != nil {
			t.Fatalf("%+v: decode: %v", n, err)
		}
		if got.Names != n || got.PeerAddr != s.PeerAddr || len(got.Models) != 1 {
			t.Errorf("round trip of %+v gave %+v", n, got)
		}
	}
}

func TestSummaryRefusesBadNamesInfo(t *testing.T) {
	for _, n := range []NamesInfo{
		{Role: "emperor"},
		{Registry: strings.Repeat("r", maxRegistryLen+1)},
		{Addr: strings.Repeat("a", maxPeerAddrLen+1)},
	} {
		if _, err := (Summary{Names: n}).Encode(); err == nil {
			t.Errorf("%+v encoded", n)
		}
	}
	// A role code from a newer agent reads as no role, not an error.
	b := appendTLV([]byte{summaryFormatV1}, fieldNamesRole, []byte{7})
	s, err := DecodeSummary(b)
	if err != nil || s.Names.Role != "" {
		t.Errorf("unknown role code: %+v, %v", s.Names, err)
	}
}
