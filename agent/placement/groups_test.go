package placement

import (
	"reflect"
	"testing"
)

func TestCopies(t *testing.T) {
	servers := []Server{
		{Name: "a", Free: map[string]int{"RTX": 5, "L40S": 2}},
		{Name: "b", Free: map[string]int{"RTX": 1}},
		{Name: "c", Drained: true, Free: map[string]int{"RTX": 8}},
	}
	for _, tc := range []struct {
		want []Want
		n    int
	}{
		{[]Want{{Model: "RTX", Count: 1}}, 6},
		{[]Want{{Model: "RTX", Count: 2}}, 2},
		{[]Want{{Model: "RTX", Count: 2}, {Model: "L40S", Count: 1}}, 2},
		{[]Want{{Model: "RTX", Count: 1}, {Model: "L40S", Count: 2}}, 1},
		{[]Want{{Model: "H100", Count: 1}}, 0},
	} {
		if n := Copies(servers, tc.want); n != tc.n {
			t.Errorf("Copies(%v) = %d, want %d", tc.want, n, tc.n)
		}
	}
}

// Alternatives for a group are for the whole group: RTX:1 for three nodes
// only when three RTX are free, wherever they are.
func TestGroupAlternativesAreForEveryNode(t *testing.T) {
	models := []string{"L40S", "RTX"}
	two := []Server{
		{Name: "a", Free: map[string]int{"RTX": 1, "L40S": 4}},
		{Name: "b", Free: map[string]int{"RTX": 1, "L40S": 1}},
	}
	want := []Want{{Model: "RTX", Count: 2}}
	// One node alone could have RTX:1 (and L40S:2): a per-node answer.
	if got := Alternatives(two, want, models); len(got) != 2 {
		t.Fatalf("one node: %+v", got)
	}
	// Three nodes: only two RTX exist, so RTX:1 is no alternative; L40S:2
	// fits twice on a, not three times anywhere.
	if got := GroupAlternatives(two, want, models, 3); len(got) != 0 {
		t.Fatalf("three nodes with two RTX free: offered %+v", got)
	}
	// Two nodes: L40S:2 fits twice on a, RTX:1 once on each server.
	got := GroupAlternatives(two, want, models, 2)
	wantAlts := []Alternative{
		{Items: []Want{{Model: "L40S", Count: 2}}, Servers: 1},
		{Items: []Want{{Model: "RTX", Count: 1}}, Servers: 2},
	}
	if !reflect.DeepEqual(got, wantAlts) {
		t.Fatalf("two nodes: %+v, want %+v", got, wantAlts)
	}
	three := append(two, Server{Name: "c", Free: map[string]int{"RTX": 1}})
	got = GroupAlternatives(three, want, models, 3)
	if !reflect.DeepEqual(got, []Alternative{{Items: []Want{{Model: "RTX", Count: 1}}, Servers: 3}}) {
		t.Fatalf("three nodes with three RTX free: %+v", got)
	}
	// The largest count every node can get: 4 RTX free on one server
	// give two nodes RTX:2 each, not RTX:3.
	big := []Server{{Name: "a", Free: map[string]int{"RTX": 4}}}
	got = GroupAlternatives(big, []Want{{Model: "RTX", Count: 4}}, []string{"RTX"}, 2)
	if !reflect.DeepEqual(got, []Alternative{{Items: []Want{{Model: "RTX", Count: 2}}, Servers: 1}}) {
		t.Fatalf("two nodes of RTX:4 on 4 free: %+v", got)
	}
	// Several models: only the combinations every node can get.
	mixed := []Server{
		{Name: "a", Free: map[string]int{"RTX": 1, "L40S": 1}},
		{Name: "b", Free: map[string]int{"RTX": 1}},
	}
	got = GroupAlternatives(mixed, []Want{{Model: "RTX", Count: 1}, {Model: "L40S", Count: 1}}, models, 2)
	if !reflect.DeepEqual(got, []Alternative{{Items: []Want{{Model: "RTX", Count: 1}}, Servers: 2}}) {
		t.Fatalf("two nodes of RTX+L40S: %+v", got)
	}
}
