package placement

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// fleet is n servers with a realistic spread of models and free counts.
func fleet(n int) []Server {
	rnd := rand.New(rand.NewPCG(1, 2))
	models := []string{"NVIDIA H100 80GB", "NVIDIA A100 80GB", "NVIDIA L40S", "NVIDIA RTX 6000 Pro"}
	out := make([]Server, n)
	for i := range out {
		s := Server{Name: fmt.Sprintf("gpu%04d", i), Free: map[string]int{}}
		s.Free[models[i%len(models)]] = rnd.IntN(9)
		if i%5 == 4 { // a mixed server
			s.Free[models[(i+1)%len(models)]] = rnd.IntN(3)
		}
		s.Drained = i%97 == 0
		out[i] = s
	}
	return out
}

// BenchmarkRank1000 ranks 1,000 servers for a claim, as a coordinator does
// for every claim with its whole gossip view: best fit, ties shuffled.
func BenchmarkRank1000(b *testing.B) {
	servers := fleet(1000)
	for _, w := range []struct {
		name string
		want []Want
	}{
		{"1xH100", []Want{{Model: "NVIDIA H100 80GB", Count: 1}}},
		{"8xH100", []Want{{Model: "NVIDIA H100 80GB", Count: 8}}},
		{"2xH100+1xL40S", []Want{{Model: "NVIDIA H100 80GB", Count: 2}, {Model: "NVIDIA L40S", Count: 1}}},
	} {
		b.Run(w.name, func(b *testing.B) {
			rnd := rand.New(rand.NewPCG(3, 4))
			b.ReportAllocs()
			for b.Loop() {
				_ = Rank(servers, w.want, "", rnd)
			}
		})
	}
}

// BenchmarkAlternatives1000 is the not-available answer's work over 1,000
// servers: what would fit instead, for every model of the platform.
func BenchmarkAlternatives1000(b *testing.B) {
	servers := fleet(1000)
	models := []string{"NVIDIA H100 80GB", "NVIDIA A100 80GB", "NVIDIA L40S", "NVIDIA RTX 6000 Pro"}
	want := []Want{{Model: "NVIDIA H100 80GB", Count: 9}}
	b.ReportAllocs()
	for b.Loop() {
		_ = Alternatives(servers, want, models)
	}
}
