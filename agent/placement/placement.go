// Package placement chooses which GPUs of one server serve a request.
//
// It is plain Go over plain data: the ledger hands it the free GPUs of one
// model and gets back the addresses to take. It owns no state and does no
// I/O, so every rule here is a table test away from being checked.
//
// The rules, in order:
//
//  1. Keep the set on one NUMA node when some node can hold it. Among the
//     nodes that can, take the best fit: the node with the fewest free GPUs
//     (ties: lowest node id), so that nodes with many free GPUs stay whole
//     for large requests.
//  2. Inside a node, take the GPUs that are closest to each other: the set
//     with the smallest sum of pairwise NVML topology distances. Without
//     distances every pair is equally far and the lowest addresses win.
//  3. When no single node can hold the set, span as few nodes as possible,
//     and among those spans the one with the fewest free GPUs in total (best
//     fit again).
//
// Everything is deterministic: the same input always gives the same answer,
// whatever order the candidates come in, so a retried reservation and a test
// see the same GPUs.
package placement

import (
	"cmp"
	"math/bits"
	"slices"
)

// Candidate is one free GPU that placement may choose.
type Candidate struct {
	// Address is the PCI address (0000:3b:00.0); it identifies the GPU.
	Address string
	// NUMANode is the node the GPU hangs off; -1 (no NUMA information) is
	// just another node.
	NUMANode int
	// Distance to other GPUs by address (NVML topology level, smaller is
	// closer); nil or a missing entry means unknown.
	Distance map[string]int
}

// unknownDistance ranks a pair whose distance is unknown behind every known
// one: NVML topology levels stay well below it, and 120 pairs (16 GPUs) of it
// still fit an int comfortably.
const unknownDistance = 1 << 20

// maxExactSpan bounds the number of NUMA nodes for which spanning tries every
// combination of nodes; beyond it (no real server has that many) it falls
// back to taking the largest nodes first, which still spans the fewest nodes.
const maxExactSpan = 16

// Pick chooses count GPUs among free, which must all be of one model (the
// caller filters by model and by availability). It returns their addresses
// sorted, or false when free holds fewer than count GPUs or count < 1.
// Duplicate addresses in free count once.
func Pick(free []Candidate, count int) ([]string, bool) {
	cands := dedupe(free)
	if count < 1 || count > len(cands) {
		return nil, false
	}
	nodes := byNode(cands)

	// Rule 1: best fit on one node. nodes is sorted by id, so the first
	// node with the smallest sufficient size wins ties.
	var best *node
	for i := range nodes {
		n := &nodes[i]
		if len(n.gpus) >= count && (best == nil || len(n.gpus) < len(best.gpus)) {
			best = n
		}
	}
	if best != nil {
		return sorted(closest(best.gpus, count)), true
	}

	// Rule 3: span the fewest nodes. Take every chosen node whole except
	// the largest, which gives the remainder: the free GPUs left over then
	// stay together on one node.
	span := chooseSpan(nodes, count)
	slices.SortStableFunc(span, func(a, b node) int { return cmp.Compare(len(a.gpus), len(b.gpus)) })
	var out []string
	for _, n := range span[:len(span)-1] {
		for _, g := range n.gpus {
			out = append(out, g.Address)
		}
	}
	out = append(out, closest(span[len(span)-1].gpus, count-len(out))...)
	return sorted(out), true
}

// node is the free GPUs of one NUMA node, sorted by address.
type node struct {
	id   int
	gpus []Candidate
}

// dedupe returns the candidates sorted by address, each address once; the
// sort makes every later tie-break independent of the caller's order.
func dedupe(free []Candidate) []Candidate {
	out := slices.Clone(free)
	slices.SortStableFunc(out, func(a, b Candidate) int { return cmp.Compare(a.Address, b.Address) })
	return slices.CompactFunc(out, func(a, b Candidate) bool { return a.Address == b.Address })
}

// byNode groups address-sorted candidates by NUMA node, nodes sorted by id.
func byNode(cands []Candidate) []node {
	var nodes []node
	for _, c := range cands {
		i, found := slices.BinarySearchFunc(nodes, c.NUMANode, func(n node, id int) int { return cmp.Compare(n.id, id) })
		if !found {
			nodes = slices.Insert(nodes, i, node{id: c.NUMANode})
		}
		nodes[i].gpus = append(nodes[i].gpus, c)
	}
	return nodes
}

// chooseSpan returns the nodes to spread count GPUs over when no single node
// can hold them: as few nodes as possible and, among such sets, the one with
// the fewest free GPUs in total (ties: the set whose node ids come first).
func chooseSpan(nodes []node, count int) []node {
	// The fewest nodes needed is reached by taking the largest first.
	bySize := slices.Clone(nodes)
	slices.SortStableFunc(bySize, func(a, b node) int { return cmp.Compare(len(b.gpus), len(a.gpus)) })
	need, sum := 0, 0
	for sum < count {
		sum += len(bySize[need].gpus)
		need++
	}
	if len(nodes) > maxExactSpan {
		return bySize[:need]
	}

	// Try every set of exactly that many nodes; nodes are sorted by id, so
	// comparing index lists breaks ties by node id.
	bestMask, bestTotal := uint32(0), 0
	for mask := uint32(1); mask < 1<<len(nodes); mask++ {
		if bits.OnesCount32(mask) != need {
			continue
		}
		total := 0
		for i := range nodes {
			if mask&(1<<i) != 0 {
				total += len(nodes[i].gpus)
			}
		}
		if total < count {
			continue
		}
		if bestMask == 0 || total < bestTotal || (total == bestTotal && lowerIndexes(mask, bestMask)) {
			bestMask, bestTotal = mask, total
		}
	}
	var out []node
	for i := range nodes {
		if bestMask&(1<<i) != 0 {
			out = append(out, nodes[i])
		}
	}
	return out
}

// lowerIndexes reports whether the set bits of a, read from the lowest,
// come before those of b in lexicographic order.
func lowerIndexes(a, b uint32) bool {
	for a != 0 && b != 0 {
		ia, ib := bits.TrailingZeros32(a), bits.TrailingZeros32(b)
		if ia != ib {
			return ia < ib
		}
		a &= a - 1
		b &= b - 1
	}
	return false
}

// closest picks count of the address-sorted gpus with a small sum of
// pairwise distances.
//
// It is greedy: from every GPU as a seed it adds, one at a time, the GPU
// closest to those already chosen (ties: lowest address), and keeps the seed
// whose set costs least (ties: the lowest seed). That is exact for two GPUs
// and for the tree-shaped topologies NVML reports (same board < same PCIe
// switch < same host bridge < same node), and costs O(n²·count) — nothing
// for the 16 GPUs a server holds at most. On odd hand-made matrices it may
// miss the optimum; the result is still a valid, deterministic choice.
func closest(gpus []Candidate, count int) []string {
	if count >= len(gpus) {
		out := make([]string, len(gpus))
		for i, g := range gpus {
			out[i] = g.Address
		}
		return out
	}
	n := len(gpus)
	dist := make([][]int, n)
	for i := range gpus {
		dist[i] = make([]int, n)
		for j := range gpus {
			if i != j {
				dist[i][j] = distance(gpus[i], gpus[j])
			}
		}
	}

	var best []int
	bestCost := -1
	chosen := make([]bool, n)
	for seed := range n {
		clear(chosen)
		set := []int{seed}
		chosen[seed] = true
		cost := 0
		for len(set) < count {
			next, nextCost := -1, 0
			for c := range n {
				if chosen[c] {
					continue
				}
				sum := 0
				for _, m := range set {
					sum += dist[c][m]
				}
				if next < 0 || sum < nextCost {
					next, nextCost = c, sum
				}
			}
			set = append(set, next)
			chosen[next] = true
			cost += nextCost
		}
		if bestCost < 0 || cost < bestCost {
			best, bestCost = set, cost
		}
	}
	out := make([]string, len(best))
	for i, idx := range best {
		out[i] = gpus[idx].Address
	}
	return out
}

// distance is the topology distance between two GPUs. Either side may know
// it; when both do and disagree, the larger (more pessimistic) wins.
func distance(a, b Candidate) int {
	ab, okA := a.Distance[b.Address]
	ba, okB := b.Distance[a.Address]
	switch {
	case okA && okB:
		return max(ab, ba)
	case okA:
		return ab
	case okB:
		return ba
	default:
		return unknownDistance
	}
}

func sorted(s []string) []string {
	slices.Sort(s)
	return s
}
