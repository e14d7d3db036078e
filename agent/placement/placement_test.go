package placement

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// gpu builds a candidate at 0000:<bus>:00.0 on numa.
func gpu(bus string, numa int) Candidate {
	return Candidate{Address: addr(bus), NUMANode: numa}
}

func addr(bus string) string { return "0000:" + bus + ":00.0" }

func addrs(buses ...string) []string {
	out := make([]string, len(buses))
	for i, b := range buses {
		out[i] = addr(b)
	}
	return out
}

// withDistances sets symmetric distances between the given bus pairs.
func withDistances(cands []Candidate, d map[[2]string]int) []Candidate {
	byAddr := map[string]int{}
	for i := range cands {
		byAddr[cands[i].Address] = i
	}
	for pair, v := range d {
		a, b := byAddr[addr(pair[0])], byAddr[addr(pair[1])]
		if cands[a].Distance == nil {
			cands[a].Distance = map[string]int{}
		}
		if cands[b].Distance == nil {
			cands[b].Distance = map[string]int{}
		}
		cands[a].Distance[cands[b].Address] = v
		cands[b].Distance[cands[a].Address] = v
	}
	return cands
}

// pcieSwitches returns distances for GPUs behind PCIe switches: 10 (PIX)
// inside a group, 30 (PHB) across groups.
func pcieSwitches(groups ...[]string) map[[2]string]int {
	d := map[[2]string]int{}
	all := slices.Concat(groups...)
	group := map[string]int{}
	for i, g := range groups {
		for _, b := range g {
			group[b] = i
		}
	}
	for i, a := range all {
		for _, b := range all[i+1:] {
			if group[a] == group[b] {
				d[[2]string{a, b}] = 10
			} else {
				d[[2]string{a, b}] = 30
			}
		}
	}
	return d
}

func TestPick(t *testing.T) {
	tests := []struct {
		name  string
		free  []Candidate
		count int
		want  []string // nil: not placeable
	}{
		{
			name:  "zero count is not a request",
			free:  []Candidate{gpu("3b", 0)},
			count: 0,
		},
		{
			name:  "negative count",
			free:  []Candidate{gpu("3b", 0)},
			count: -1,
		},
		{
			name:  "more than free",
			free:  []Candidate{gpu("3b", 0), gpu("5e", 1)},
			count: 3,
		},
		{
			name:  "nothing free",
			count: 1,
		},
		{
			name:  "duplicates count once",
			free:  []Candidate{gpu("3b", 0), gpu("3b", 0)},
			count: 2,
		},
		{
			name:  "no distances: lowest addresses",
			free:  []Candidate{gpu("86", 0), gpu("3b", 0), gpu("5e", 0), gpu("18", 0)},
			count: 2,
			want:  addrs("18", "3b"),
		},
		{
			name:  "all of one node",
			free:  []Candidate{gpu("86", 0), gpu("3b", 0)},
			count: 2,
			want:  addrs("3b", "86"),
		},
		{
			name:  "best fit: the node with fewer free GPUs that can hold it",
			free:  []Candidate{gpu("18", 0), gpu("2a", 0), gpu("3b", 0), gpu("5e", 0), gpu("86", 1), gpu("af", 1)},
			count: 2,
			want:  addrs("86", "af"),
		},
		{
			name:  "best fit skips a node too small",
			free:  []Candidate{gpu("18", 0), gpu("2a", 0), gpu("3b", 0), gpu("86", 1)},
			count: 2,
			want:  addrs("18", "2a"),
		},
		{
			name:  "best fit tie: lowest node id",
			free:  []Candidate{gpu("86", 1), gpu("af", 1), gpu("18", 0), gpu("2a", 0)},
			count: 2,
			want:  addrs("18", "2a"),
		},
		{
			name:  "single GPU goes to the most fragmented node",
			free:  []Candidate{gpu("18", 0), gpu("2a", 0), gpu("3b", 0), gpu("86", 1), gpu("af", 1), gpu("c1", 2)},
			count: 1,
			want:  addrs("c1"),
		},
		{
			name:  "unknown NUMA (-1) is a node like any other",
			free:  []Candidate{gpu("18", -1), gpu("2a", -1), gpu("86", 0)},
			count: 2,
			want:  addrs("18", "2a"),
		},
		{
			name: "distances: closest pair, not lowest addresses",
			free: withDistances([]Candidate{gpu("01", 0), gpu("02", 0), gpu("03", 0), gpu("04", 0)}, map[[2]string]int{
				{"01", "02"}: 30, {"01", "03"}: 10, {"01", "04"}: 30,
				{"02", "03"}: 30, {"02", "04"}: 10, {"03", "04"}: 30,
			}),
			count: 2,
			want:  addrs("01", "03"),
		},
		{
			name: "distances: stay behind one PCIe switch",
			// Switch A had 1a,1b,1c,1d; 1c and 1d are taken. Switch B is whole.
			free:  withDistances([]Candidate{gpu("1a", 0), gpu("1b", 0), gpu("2a", 0), gpu("2b", 0), gpu("2c", 0)}, pcieSwitches([]string{"1a", "1b"}, []string{"2a", "2b", "2c"})),
			count: 3,
			want:  addrs("2a", "2b", "2c"),
		},
		{
			name:  "distances: a pair fills the fragmented switch first",
			free:  withDistances([]Candidate{gpu("1a", 0), gpu("2a", 0), gpu("2b", 0), gpu("2c", 0)}, pcieSwitches([]string{"1a"}, []string{"2a", "2b", "2c"})),
			count: 2,
			want:  addrs("2a", "2b"),
		},
		{
			name: "unknown distance ranks behind any known one",
			free: withDistances([]Candidate{gpu("01", 0), gpu("02", 0), gpu("03", 0)}, map[[2]string]int{
				{"01", "03"}: 50,
			}),
			count: 2,
			want:  addrs("01", "03"),
		},
		{
			name: "distance known by one side only",
			free: []Candidate{
				{Address: addr("01"), NUMANode: 0},
				{Address: addr("02"), NUMANode: 0},
				{Address: addr("03"), NUMANode: 0, Distance: map[string]int{addr("02"): 10}},
			},
			count: 2,
			want:  addrs("02", "03"),
		},
		{
			name: "asymmetric distances: the larger wins",
			free: []Candidate{
				{Address: addr("01"), NUMANode: 0, Distance: map[string]int{addr("02"): 10, addr("03"): 20}},
				{Address: addr("02"), NUMANode: 0, Distance: map[string]int{addr("01"): 40, addr("03"): 30}},
				{Address: addr("03"), NUMANode: 0, Distance: map[string]int{addr("01"): 20, addr("02"): 30}},
			},
			count: 2,
			want:  addrs("01", "03"),
		},
		{
			name:  "span: smaller node whole, the rest from the larger",
			free:  []Candidate{gpu("18", 0), gpu("2a", 0), gpu("3b", 0), gpu("86", 1), gpu("af", 1)},
			count: 4,
			want:  addrs("18", "2a", "86", "af"),
		},
		{
			name: "span: best fit among two-node spans",
			// Node sizes 5, 4, 3; 7 GPUs fit exactly on nodes 1 and 2,
			// keeping node 0 whole.
			free: []Candidate{
				gpu("01", 0), gpu("02", 0), gpu("03", 0), gpu("04", 0), gpu("05", 0),
				gpu("11", 1), gpu("12", 1), gpu("13", 1), gpu("14", 1),
				gpu("21", 2), gpu("22", 2), gpu("23", 2),
			},
			count: 7,
			want:  addrs("11", "12", "13", "14", "21", "22", "23"),
		},
		{
			name: "span: fewest nodes beats best fit over more nodes",
			free: []Candidate{
				gpu("01", 0), gpu("11", 1), gpu("21", 2),
				gpu("31", 3), gpu("32", 3), gpu("33", 3), gpu("34", 3),
			},
			count: 5,
			want:  addrs("01", "31", "32", "33", "34"),
		},
		{
			name: "span: the remainder uses distances",
			free: withDistances([]Candidate{
				gpu("01", 0), gpu("02", 0),
				gpu("11", 1), gpu("12", 1), gpu("13", 1), gpu("14", 1),
			}, map[[2]string]int{
				{"11", "12"}: 30, {"11", "13"}: 10, {"11", "14"}: 10,
				{"12", "13"}: 30, {"12", "14"}: 30, {"13", "14"}: 10,
			}),
			count: 5,
			want:  addrs("01", "02", "11", "13", "14"),
		},
		{
			name:  "span: every node",
			free:  []Candidate{gpu("01", 0), gpu("11", 1), gpu("21", 2)},
			count: 3,
			want:  addrs("01", "11", "21"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := Pick(tt.free, tt.count)
			if ok != (tt.want != nil) {
				t.Fatalf("Pick(count %d) ok = %v, want %v (got %v)", tt.count, ok, tt.want != nil, got)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("Pick(count %d) = %v, want %v", tt.count, got, tt.want)
			}
			// The caller's order must not matter.
			rev := slices.Clone(tt.free)
			slices.Reverse(rev)
			again, _ := Pick(rev, tt.count)
			if !slices.Equal(again, got) {
				t.Fatalf("Pick on reversed input = %v, want %v", again, got)
			}
		})
	}
}

func TestPickDoesNotModifyInput(t *testing.T) {
	free := []Candidate{gpu("86", 1), gpu("3b", 0), gpu("18", 0)}
	before := slices.Clone(free)
	Pick(free, 2)
	if !slices.EqualFunc(free, before, func(a, b Candidate) bool { return a.Address == b.Address && a.NUMANode == b.NUMANode }) {
		t.Fatalf("Pick reordered its input: %v, was %v", free, before)
	}
}

// TestPickProperties checks the rules on random servers: the answer is a set
// of distinct free GPUs of the right size, on one node whenever one node can
// hold it, otherwise on as few nodes as possible, and it does not depend on
// the order of the input.
func TestPickProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 16).Draw(t, "gpus")
		var free []Candidate
		for i := range n {
			free = append(free, Candidate{
				Address:  fmt.Sprintf("0000:%02x:00.0", i+1),
				NUMANode: rapid.IntRange(-1, 3).Draw(t, "numa"),
			})
		}
		if rapid.Bool().Draw(t, "distances") {
			for i := range free {
				free[i].Distance = map[string]int{}
			}
			for i := range free {
				for j := i + 1; j < len(free); j++ {
					if rapid.IntRange(0, 4).Draw(t, "known") == 0 {
						continue
					}
					d := rapid.SampledFrom([]int{0, 10, 20, 30, 40, 50}).Draw(t, "distance")
					free[i].Distance[free[j].Address] = d
					free[j].Distance[free[i].Address] = d
				}
			}
		}
		count := rapid.IntRange(1, 17).Draw(t, "count")

		got, ok := Pick(free, count)
		if count > n {
			if ok {
				t.Fatalf("placed %d of %d GPUs: %v", count, n, got)
			}
			return
		}
		if !ok || len(got) != count {
			t.Fatalf("Pick(%d of %d) = %v, %v", count, n, got, ok)
		}
		if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != count {
			t.Fatalf("not sorted and distinct: %v", got)
		}
		numa := map[string]int{}
		size := map[int]int{}
		for _, c := range free {
			numa[c.Address] = c.NUMANode
			size[c.NUMANode]++
		}
		used := map[int]bool{}
		for _, a := range got {
			nd, ok := numa[a]
			if !ok {
				t.Fatalf("picked %s, not a candidate", a)
			}
			used[nd] = true
		}
		sizes := make([]int, 0, len(size))
		for _, s := range size {
			sizes = append(sizes, s)
		}
		slices.Sort(sizes)
		slices.Reverse(sizes)
		need, sum := 0, 0
		for sum < count {
			sum += sizes[need]
			need++
		}
		if len(used) != need {
			t.Fatalf("spans %d nodes, %d would do (node sizes %v): %v", len(used), need, sizes, got)
		}

		shuffled := slices.Clone(free)
		for i := len(shuffled) - 1; i > 0; i-- {
			j := rapid.IntRange(0, i).Draw(t, "swap")
			shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
		}
		again, _ := Pick(shuffled, count)
		if !slices.Equal(again, got) {
			t.Fatalf("order-dependent: %v then %v", got, again)
		}
	})
}
