package placement

// Node groups: every node of a group asks for the same GPUs, each node
// whole on one server, different nodes on the same or different servers.
// What fits, and what to offer instead, is a question about all nodes at
// once: three nodes of RTX:1 need three free RTX, not one.

// Copies is how many nodes of want, each whole on one server, the servers
// can hold at once by this view.
func Copies(servers []Server, want []Want) int {
	n := 0
	for _, s := range servers {
		if s.Drained {
			continue
		}
		c := -1
		for _, w := range want {
			if w.Count <= 0 {
				continue
			}
			k := s.Free[w.Model] / w.Count
			if c < 0 || k < c {
				c = k
			}
		}
		if c > 0 {
			n += c
		}
	}
	return n
}

// GroupAlternatives proposes what every one of nodes nodes could have
// instead of want, when the servers cannot hold nodes copies of want:
// the same alternatives Alternatives offers for one node, kept only when
// the servers can hold nodes copies of them at once, and for one model
// the largest count of it that every node can still get.
func GroupAlternatives(servers []Server, want []Want, models []string, nodes int) []Alternative {
	if nodes <= 1 {
		return Alternatives(servers, want, models)
	}
	var out []Alternative
	keep := func(items []Want) {
		if Copies(servers, items) >= nodes {
			out = append(out, Alternative{Items: items, Servers: fitCount(servers, items)})
		}
	}
	if len(want) > 1 {
		for _, alt := range combinations(servers, want, models) {
			keep(alt.Items)
		}
		return out
	}
	w := want[0]
	for _, m := range models {
		if m != w.Model {
			keep([]Want{{Model: m, Count: w.Count}})
		}
	}
	for c := w.Count - 1; c >= 1; c-- {
		if alt := []Want{{Model: w.Model, Count: c}}; Copies(servers, alt) >= nodes {
			keep(alt)
			break
		}
	}
	return out
}
