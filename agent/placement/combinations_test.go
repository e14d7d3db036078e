package placement

import (
	"reflect"
	"testing"
)

// A request of several models that no server holds whole is answered with
// what each server could hold of it now.
func TestAlternativesSeveralModels(t *testing.T) {
	models := []string{"A100 80GB", "H100 80GB", "L40S", "RTX 6000 Pro"}
	tests := []struct {
		name    string
		servers []Server
		want    []Want
		alts    []Alternative
	}{{
		// The first case: each model is free, never together.
		// Before: no alternative at all.
		name: "one of each, on different servers",
		servers: []Server{
			{Name: "a", Free: map[string]int{"H100 80GB": 2}},
			{Name: "b", Free: map[string]int{"L40S": 4, "A100 80GB": 1}},
		},
		want: []Want{{Model: "H100 80GB", Count: 1}, {Model: "L40S", Count: 1}},
		alts: []Alternative{
			{Items: []Want{{Model: "A100 80GB", Count: 1}, {Model: "L40S", Count: 1}}, Servers: 1},
			{Items: []Want{{Model: "H100 80GB", Count: 1}}, Servers: 1},
			{Items: []Want{{Model: "L40S", Count: 1}}, Servers: 1},
		},
	}, {
		// The second case. Before: only 1x A100 80GB.
		name: "two and one",
		servers: []Server{
			{Name: "a", Free: map[string]int{"A100 80GB": 1, "L40S": 2}},
			{Name: "b", Free: map[string]int{"A100 80GB": 2}},
			{Name: "c", Free: map[string]int{"A100 80GB": 2, "L40S": 1}, Drained: true},
		},
		want: []Want{{Model: "A100 80GB", Count: 2}, {Model: "L40S", Count: 1}},
		alts: []Alternative{
			{Items: []Want{{Model: "A100 80GB", Count: 1}, {Model: "L40S", Count: 1}}, Servers: 1},
			{Items: []Want{{Model: "A100 80GB", Count: 2}}, Servers: 1},
		},
	}, {
		name: "a substitute completes the request",
		servers: []Server{
			{Name: "a", Free: map[string]int{"H100 80GB": 1, "RTX 6000 Pro": 2}},
		},
		want: []Want{{Model: "H100 80GB", Count: 1}, {Model: "L40S", Count: 2}},
		alts: []Alternative{
			{Items: []Want{{Model: "H100 80GB", Count: 1}, {Model: "RTX 6000 Pro", Count: 2}}, Servers: 1},
			{Items: []Want{{Model: "H100 80GB", Count: 1}}, Servers: 1},
		},
	}, {
		name:    "nothing free anywhere",
		servers: []Server{{Name: "a", Free: map[string]int{}}, {Name: "b", Free: map[string]int{"L40S": 3}, Drained: true}},
		want:    []Want{{Model: "H100 80GB", Count: 1}, {Model: "L40S", Count: 1}},
		alts:    nil,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Alternatives(tt.servers, tt.want, models)
			if !reflect.DeepEqual(got, tt.alts) {
				t.Errorf("Alternatives(%v) =\n  %+v\nwant\n  %+v", tt.want, got, tt.alts)
			}
			for _, alt := range got {
				if alt.Servers < 1 {
					t.Errorf("%+v fits on no server", alt)
				}
			}
		})
	}
}

// Never more than maxCombinations, and never the request itself.
func TestAlternativesSeveralModelsBounded(t *testing.T) {
	models := []string{"m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9"}
	var servers []Server
	for i, m := range models {
		servers = append(servers, Server{Name: m, Free: map[string]int{m: 1, models[(i+1)%len(models)]: 1, "x": 1}})
	}
	want := []Want{{Model: "x", Count: 2}, {Model: "y", Count: 1}}
	got := Alternatives(servers, want, models)
	if len(got) == 0 || len(got) > maxCombinations {
		t.Fatalf("%d alternatives, want 1 to %d", len(got), maxCombinations)
	}
	for _, alt := range got {
		if sameWants(alt.Items, want) {
			t.Errorf("offered the request itself: %+v", alt)
		}
	}
}
