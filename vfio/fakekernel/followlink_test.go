package fakekernel

import (
	"path"
	"slices"
	"strings"
	"testing"
)

// followLink resolves a link as path.Join of its directory and its text
// does (the form the tree's walk used before it stopped building strings),
// and refuses one that climbs above the root.
func TestFollowLinkJoinsAsPathJoin(t *testing.T) {
	for _, c := range []struct {
		parts []string
		i     int
		link  string
	}{
		{[]string{"bus", "pci", "devices", "0000:3b:00.0", "vendor"}, 4, "../../../devices/pci0000:00/0000:3b:00.0"},
		{[]string{"kernel", "iommu_groups", "12", "devices", "0000:3b:00.0"}, 5, "../../../../devices/pci0000:00/0000:3b:00.0"},
		{[]string{"devices", "pci0000:00", "0000:3b:00.1", "physfn", "vendor"}, 4, "../0000:3b:00.0"},
		{[]string{"a", "b", "c"}, 2, "./x//y/."},
		{[]string{"a", "b"}, 2, "/abs/t"},
		{[]string{"a", "b"}, 2, ".."},
		{[]string{"a", "b"}, 2, "../.."},
		{[]string{"a", "b", "c"}, 2, "../../../x"},
	} {
		got, ok := followLink(slices.Clone(c.parts), c.i, c.link)
		target := path.Join(strings.Join(c.parts[:c.i-1], "/"), c.link)
		above := target == ".." || strings.HasPrefix(target, "../")
		if ok == above {
			t.Errorf("%v, link %q at %d: ok %v, but path.Join gives %q", c.parts, c.link, c.i, ok, target)
			continue
		}
		if !ok {
			continue
		}
		var want []string
		if target != "." {
			want = strings.Split(target, "/")
		}
		want = append(want, c.parts[c.i:]...)
		if !slices.Equal(got, want) {
			t.Errorf("%v, link %q at %d: %q, want %q", c.parts, c.link, c.i, got, want)
		}
	}
}
