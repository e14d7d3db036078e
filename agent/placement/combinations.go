package placement

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
)

// maxCombinations bounds the alternatives offered for a request of several
// models: a person picks from them.
const maxCombinations = 8

// combinations proposes, for a request of several models that no server
// holds whole, what each server could hold of it now: every requested
// model up to its count (the closest subset), and that subset completed
// with other models the server has free in place of the missing ones
// (the same number of GPUs, another model). Duplicates across servers are
// merged and counted; the ones closest to the request come first: most
// GPUs of the requested models, then most GPUs, then most servers.
func combinations(servers []Server, want []Want, models []string) []Alternative {
	type cand struct {
		items   []Want
		matched int // GPUs of a requested model, up to its count
		total   int
		servers int
	}
	seen := map[string]bool{}
	var cands []cand
	add := func(items []Want) {
		items = canonical(items)
		if len(items) == 0 || sameWants(items, want) {
			return
		}
		k := key(items)
		if seen[k] {
			return
		}
		seen[k] = true
		c := cand{items: items, servers: fitCount(servers, items)}
		for _, it := range items {
			c.total += it.Count
			for _, w := range want {
				if w.Model == it.Model {
					c.matched += min(it.Count, w.Count)
				}
			}
		}
		cands = append(cands, c)
	}
	for _, s := range servers {
		if s.Drained {
			continue
		}
		// The closest subset: each requested model up to its count.
		var subset []Want
		used := map[string]int{}
		short := 0
		for _, w := range want {
			n := min(s.Free[w.Model], w.Count)
			if n > 0 {
				subset = append(subset, Want{Model: w.Model, Count: n})
				used[w.Model] = n
			}
			short += w.Count - n
		}
		add(subset)
		if short == 0 {
			continue
		}
		// The subset completed with one other model the server has enough
		// of for the whole shortfall: as many GPUs as asked.
		for _, m := range models {
			if used[m] > 0 || s.Free[m] < short || isWanted(want, m) {
				continue
			}
			add(append(slices.Clone(subset), Want{Model: m, Count: short}))
		}
	}
	slices.SortFunc(cands, func(x, y cand) int {
		return cmp.Or(
			cmp.Compare(y.matched, x.matched),
			cmp.Compare(y.total, x.total),
			cmp.Compare(y.servers, x.servers),
			strings.Compare(key(x.items), key(y.items)),
		)
	})
	var out []Alternative
	for _, c := range cands {
		out = append(out, Alternative{Items: c.items, Servers: c.servers})
	}
	if len(out) > maxCombinations {
		out = out[:maxCombinations]
	}
	return out
}

func isWanted(want []Want, model string) bool {
	return slices.ContainsFunc(want, func(w Want) bool { return w.Model == model })
}

// canonical sorts items by model and drops empty ones.
func canonical(items []Want) []Want {
	items = slices.DeleteFunc(slices.Clone(items), func(w Want) bool { return w.Count <= 0 })
	slices.SortFunc(items, func(x, y Want) int { return strings.Compare(x.Model, y.Model) })
	return items
}

func sameWants(x, y []Want) bool {
	return key(canonical(x)) == key(canonical(y))
}

func key(items []Want) string {
	var b strings.Builder
	for _, it := range items {
		b.WriteString(it.Model)
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(it.Count))
		b.WriteByte('+')
	}
	return b.String()
}
