package gossip

import "testing"

// BenchmarkSummaryEncode is what every Publish and every NodeMeta costs.
func BenchmarkSummaryEncode(b *testing.B) {
	s := largeSummary()
	enc, err := s.Encode()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Encode(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(enc)), "bytes/summary")
}

// BenchmarkSummaryDecode is what every member pays per update it receives
// (memberlist NotifyJoin/NotifyUpdate run it under memberlist's node lock).
func BenchmarkSummaryDecode(b *testing.B) {
	enc, err := largeSummary().Encode()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeSummary(enc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkViewList1000 is one Members() call with 1,000 members: a
// coordinator's view per claim.
func BenchmarkViewList1000(b *testing.B) {
	v := newView("self", defaultRememberDeparted)
	enc, err := largeSummary().Encode()
	if err != nil {
		b.Fatal(err)
	}
	for i := range 1000 {
		v.alive(string(rune('a'+i%26))+string(rune('a'+i/26%26))+string(rune('a'+i/676)), []byte{10, 0, byte(i >> 8), byte(i)}, 7946, enc)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = v.list()
	}
}
