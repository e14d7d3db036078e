package placement

import (
	"cmp"
	"math/rand/v2"
	"slices"

	"github.com/gpuherd/gpuherd/agent/api"
)

// Server is one server as a coordinator sees it through gossip: a hint, not
// the truth — the owner decides when asked.
type Server struct {
	Name    string
	Drained bool           // cordoned: no new claims
	Free    map[string]int // model → free GPUs
}

// Want is Count GPUs of one model, all to be placed on one server together
// with the rest of the request: the API's item, as the request carries it.
type Want = api.Item

// fits reports whether s can hold every item of want at once.
func (s Server) fits(want []Want) bool {
	if s.Drained {
		return false
	}
	for _, w := range want {
		if s.Free[w.Model] < w.Count {
			return false
		}
	}
	return true
}

// leftover is the number of GPUs of the requested models that s would still
// have free after placing want: best fit takes the server with the least, so
// that servers with big holes stay whole for big requests.
func (s Server) leftover(want []Want) int {
	n := 0
	for _, w := range want {
		n += s.Free[w.Model] - w.Count
	}
	return n
}

// Rank orders the servers that, by this view, can hold all of want: prefer
// first when it fits, then best fit, ties in random order (rnd; nil means a
// fixed order, for tests) so that concurrent coordinators with the same view
// spread over equally good servers instead of all racing for the first.
func Rank(servers []Server, want []Want, prefer string, rnd *rand.Rand) []string {
	var fit []Server
	for _, s := range servers {
		if s.fits(want) {
			fit = append(fit, s)
		}
	}
	tieOrder(fit, rnd)
	slices.SortStableFunc(fit, func(a, b Server) int {
		if pa, pb := a.Name == prefer, b.Name == prefer; pa != pb {
			if pa {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.leftover(want), b.leftover(want))
	})
	out := make([]string, len(fit))
	for i, s := range fit {
		out[i] = s.Name
	}
	return out
}

// Alternative is a request that would fit on one server right now, offered
// when the asked one does not.
type Alternative struct {
	Items []Want
	// Servers is how many servers could hold it.
	Servers int
}

// Alternatives proposes what the user could have instead of want. For one
// model: the same count of another model, then the largest count of the
// model that one server can still hold. For several models: the
// combinations that one server can hold now (combinations.go). Only
// alternatives that fit on one server, by this view, are offered.
func Alternatives(servers []Server, want []Want, models []string) []Alternative {
	if len(want) > 1 {
		return combinations(servers, want, models)
	}
	var out []Alternative
	for _, m := range models {
		if m == want[0].Model {
			continue
		}
		alt := []Want{{Model: m, Count: want[0].Count}}
		if n := fitCount(servers, alt); n > 0 {
			out = append(out, Alternative{Items: alt, Servers: n})
		}
	}
	for _, w := range want {
		best := 0
		for _, s := range servers {
			if !s.Drained && s.Free[w.Model] > best {
				best = s.Free[w.Model]
			}
		}
		best = min(best, w.Count-1)
		if best >= 1 {
			alt := []Want{{Model: w.Model, Count: best}}
			out = append(out, Alternative{Items: alt, Servers: fitCount(servers, alt)})
		}
	}
	return out
}

// fitCount is how many servers can hold all of w.
func fitCount(servers []Server, w []Want) int {
	n := 0
	for _, s := range servers {
		if s.fits(w) {
			n++
		}
	}
	return n
}

// Nearest orders the servers worth reading before choosing where to place
// want, when the view may be stale: those whose free GPUs of the requested
// models are closest to the request, on either side. A server the view
// shows just short of the request may have had a release since, and one
// the view shows with a little room may have exactly the room asked for
// now: either may be the best fit. capable says whether a server could
// hold want at all (its healthy totals); the others, and drained ones, are
// left out. Ties go to the servers that fit by the view, then in random
// order (rnd; nil means by name, for tests). At most n are returned.
func Nearest(servers []Server, want []Want, capable func(name string) bool, n int, rnd *rand.Rand) []string {
	var near []Server
	for _, s := range servers {
		if !s.Drained && capable(s.Name) {
			near = append(near, s)
		}
	}
	tieOrder(near, rnd)
	slices.SortStableFunc(near, func(a, b Server) int {
		if c := cmp.Compare(a.distance(want), b.distance(want)); c != 0 {
			return c
		}
		if fa, fb := a.fits(want), b.fits(want); fa != fb {
			if fa {
				return -1
			}
			return 1
		}
		return 0
	})
	out := make([]string, 0, min(n, len(near)))
	for _, s := range near[:min(n, len(near))] {
		out = append(out, s.Name)
	}
	return out
}

// distance is how far s's free GPUs of the requested models are from the
// request: the GPUs it lacks plus those it would have left over.
func (s Server) distance(want []Want) int {
	d := 0
	for _, w := range want {
		f := s.Free[w.Model]
		if f < w.Count {
			d += w.Count - f
		} else {
			d += f - w.Count
		}
	}
	return d
}

// tieOrder puts servers in the order that decides ties of the stable sort
// that follows: random (rnd), or by name when rnd is nil (tests).
func tieOrder(servers []Server, rnd *rand.Rand) {
	if rnd != nil {
		rnd.Shuffle(len(servers), func(i, j int) { servers[i], servers[j] = servers[j], servers[i] })
		return
	}
	slices.SortFunc(servers, func(a, b Server) int { return cmp.Compare(a.Name, b.Name) })
}
