package pki

import "testing"

// BenchmarkPeerConfig is what one more member costs an agent's peer
// clients in TLS configuration (B/op): a configuration from the shared
// reading of the files, against one that reads and parses them itself.
func BenchmarkPeerConfig(b *testing.B) {
	c := newCluster(b)
	f := c.files("node-b")
	b.Run("shared", func(b *testing.B) {
		p, err := NewPeerConfigs(f)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := p.For("node-a"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("own-reading", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ClientConfigFor(f, "node-a"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
