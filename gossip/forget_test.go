package gossip

import (
	"net"
	"slices"
	"testing"
	"time"
)

// A removed member leaves the view and the dead count at once; a live one
// is never forgotten, and one that comes back is listed again.
func TestForgetDropsOnlyDepartedMembers(t *testing.T) {
	v := newView("a", time.Hour)
	meta, err := Summary{}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	ip := net.IPv4(127, 0, 0, 1)
	v.alive("a", ip, 7946, meta)
	v.alive("b", ip, 7946, meta)
	v.alive("c", ip, 7946, meta)
	v.gone("b", meta)
	names := func() []string {
		var out []string
		for _, m := range v.list() {
			out = append(out, m.Name+"="+m.State)
		}
		return out
	}
	if got := names(); !slices.Equal(got, []string{"a=alive", "b=dead", "c=alive"}) {
		t.Fatalf("before: %v", got)
	}
	if v.forget("c") || v.forget("a") {
		t.Fatal("an alive member or this agent was forgotten")
	}
	v.suspect("c")
	if v.forget("c") {
		t.Fatal("a suspect member was forgotten")
	}
	if !v.forget("b") {
		t.Fatal("the dead member was not forgotten")
	}
	if got := names(); !slices.Equal(got, []string{"a=alive", "c=suspect"}) {
		t.Fatalf("after forgetting b: %v", got)
	}
	if n := v.deadCount(); n != 0 {
		t.Fatalf("dead count after forgetting b: %d, want 0", n)
	}
	if v.forget("b") || v.forget("nobody") {
		t.Fatal("forgot a member the view does not hold")
	}
	v.alive("b", ip, 7946, meta)
	if got := names(); !slices.Contains(got, "b=alive") {
		t.Fatalf("b back: %v", got)
	}
}
