package placement

import (
	"math/rand/v2"
	"reflect"
	"testing"
)

func TestRank(t *testing.T) {
	servers := []Server{
		{Name: "a", Free: map[string]int{"H100": 8}},
		{Name: "b", Free: map[string]int{"H100": 2, "L40S": 4}},
		{Name: "c", Free: map[string]int{"H100": 3}},
		{Name: "d", Free: map[string]int{"H100": 8}, Drained: true},
		{Name: "e", Free: map[string]int{"L40S": 1}},
	}
	cases := []struct {
		name   string
		want   []Want
		prefer string
		ranked []string
	}{
		{"best fit first", []Want{{Model: "H100", Count: 2}}, "", []string{"b", "c", "a"}},
		{"too big for all but one", []Want{{Model: "H100", Count: 4}}, "", []string{"a"}},
		{"preferred first when it fits", []Want{{Model: "H100", Count: 2}}, "a", []string{"a", "b", "c"}},
		{"preferred skipped when it does not fit", []Want{{Model: "H100", Count: 4}}, "c", []string{"a"}},
		{"drained never offered", []Want{{Model: "H100", Count: 8}}, "d", []string{"a"}},
		{"every item on the same server", []Want{{Model: "H100", Count: 1}, {Model: "L40S", Count: 2}}, "", []string{"b"}},
		{"nothing fits", []Want{{Model: "H100", Count: 9}}, "", []string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Rank(servers, tc.want, tc.prefer, nil)
			if !reflect.DeepEqual(got, tc.ranked) {
				t.Errorf("Rank = %v, want %v", got, tc.ranked)
			}
		})
	}
}

func TestRankShufflesTiesOnly(t *testing.T) {
	servers := []Server{
		{Name: "tight", Free: map[string]int{"H100": 1}},
		{Name: "x", Free: map[string]int{"H100": 4}},
		{Name: "y", Free: map[string]int{"H100": 4}},
		{Name: "z", Free: map[string]int{"H100": 4}},
	}
	seen := map[string]bool{}
	rnd := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		got := Rank(servers, []Want{{Model: "H100", Count: 1}}, "", rnd)
		if got[0] != "tight" {
			t.Fatalf("best fit lost to a tie shuffle: %v", got)
		}
		seen[got[1]] = true
	}
	if len(seen) != 3 {
		t.Errorf("ties were not spread: second place only ever %v", seen)
	}
}

func TestAlternatives(t *testing.T) {
	servers := []Server{
		{Name: "a", Free: map[string]int{"H100": 1, "L40S": 4}},
		{Name: "b", Free: map[string]int{"H100": 3}},
		{Name: "c", Free: map[string]int{"A100": 8}, Drained: true},
	}
	got := Alternatives(servers, []Want{{Model: "H100", Count: 4}}, []string{"A100", "H100", "L40S"})
	want := []Alternative{
		{Items: []Want{{Model: "L40S", Count: 4}}, Servers: 1},
		{Items: []Want{{Model: "H100", Count: 3}}, Servers: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Alternatives = %+v, want %+v", got, want)
	}
	if got := Alternatives(servers, []Want{{Model: "B200", Count: 1}}, []string{"B200"}); len(got) != 0 {
		t.Errorf("nothing free anywhere: got %+v", got)
	}
}

func TestNearest(t *testing.T) {
	servers := []Server{
		{Name: "exact", Free: map[string]int{"H100": 2}},
		{Name: "short", Free: map[string]int{"H100": 1}}, // may have had a release
		{Name: "over", Free: map[string]int{"H100": 3}},
		{Name: "empty", Free: map[string]int{"H100": 0}},
		{Name: "roomy", Free: map[string]int{"H100": 8}},
		{Name: "drained", Free: map[string]int{"H100": 2}, Drained: true},
		{Name: "small", Free: map[string]int{"H100": 1}}, // cannot hold 2 at all
	}
	capable := func(name string) bool { return name != "small" }
	want := []Want{{Model: "H100", Count: 2}}
	got := Nearest(servers, want, capable, 10, nil)
	if w := []string{"exact", "over", "short", "empty", "roomy"}; !reflect.DeepEqual(got, w) {
		t.Errorf("Nearest = %v, want %v (distance from the request, ties to those that fit)", got, w)
	}
	if got := Nearest(servers, want, capable, 2, nil); !reflect.DeepEqual(got, []string{"exact", "over"}) {
		t.Errorf("Nearest, at most 2 = %v", got)
	}
	// Several models: the distances add up.
	two := []Server{
		{Name: "a", Free: map[string]int{"H100": 1, "L40S": 1}},
		{Name: "b", Free: map[string]int{"H100": 2, "L40S": 4}},
	}
	if got := Nearest(two, []Want{{Model: "H100", Count: 1}, {Model: "L40S", Count: 2}}, func(string) bool { return true }, 5, nil); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Errorf("Nearest over two models = %v, want [a b]", got)
	}
}
