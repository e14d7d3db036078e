package inventory

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	c := DefaultCatalog()
	long := strings.Repeat("h100", 10000)
	tests := []struct {
		query      string
		want       string   // model name on success
		ambiguous  []string // candidates when ambiguous
		unknown    bool
		wantErrMsg string // substring of the error message
	}{
		{query: "NVIDIA H100 80GB", want: "NVIDIA H100 80GB"},
		{query: "H100 80GB", want: "NVIDIA H100 80GB"},
		{query: "h100-80gb", want: "NVIDIA H100 80GB"},
		{query: "nvidia h100 80gb", want: "NVIDIA H100 80GB"},
		{query: "H100_80GB", want: "NVIDIA H100 80GB"},
		{query: "  NVIDIA-H100\t80GB  ", want: "NVIDIA H100 80GB"},
		{query: "H100 NVL", want: "NVIDIA H100 NVL"},
		{query: "L40S", want: "NVIDIA L40S"},
		{query: "l40s", want: "NVIDIA L40S"},
		{query: "L40", want: "NVIDIA L40"}, // exact beats being a prefix of L40S
		{query: "l4", want: "NVIDIA L4"},
		{query: "H200", want: "NVIDIA H200"}, // exact beats being a prefix of H200 NVL
		{query: "rtx-6000-pro", want: "NVIDIA RTX 6000 Pro"},
		{query: "RTX 6000", ambiguous: []string{"NVIDIA RTX 6000 Ada", "NVIDIA RTX 6000 Pro"}},
		{query: "rtx6000 ada", want: "NVIDIA RTX 6000 Ada"},
		{query: "a100 80", want: "NVIDIA A100 80GB"},
		{query: "b2", want: "NVIDIA B200"},
		{query: "h100", ambiguous: []string{"NVIDIA H100 80GB", "NVIDIA H100 NVL"},
			wantErrMsg: `GPU model "h100" is ambiguous: NVIDIA H100 80GB, NVIDIA H100 NVL`},
		{query: "a100", ambiguous: []string{"NVIDIA A100 40GB", "NVIDIA A100 80GB"}},
		{query: "NVIDIA", unknown: true, wantErrMsg: "no GPU model given"},
		{query: "", unknown: true, wantErrMsg: "no GPU model given (known: NVIDIA A10, NVIDIA A100 40GB, NVIDIA A100 80GB,"},
		{query: "   ", unknown: true, wantErrMsg: "no GPU model given"},
		{query: "zzz", unknown: true, wantErrMsg: `unknown GPU model "zzz" (known: NVIDIA A10, NVIDIA A100 40GB, NVIDIA A100 80GB, NVIDIA A40, NVIDIA B200,`},
		{query: "H100 80GB PCIe", unknown: true},
		{query: "10de:1ff2", unknown: true}, // not seen on this host: see TestMatchIn
		{query: long, unknown: true, wantErrMsg: `unknown GPU model "` + strings.Repeat("h100", 16) + `"…`},
	}
	for _, tt := range tests {
		name := tt.query
		if len(name) > 20 {
			name = name[:20] + "..."
		}
		t.Run(name, func(t *testing.T) {
			m, err := c.Match(tt.query)
			var amb *AmbiguousModelError
			var unk *UnknownModelError
			switch {
			case tt.want != "":
				if err != nil || m.Name != tt.want {
					t.Fatalf("Match(%q) = %q, %v; want %q", tt.query, m.Name, err, tt.want)
				}
				return
			case tt.ambiguous != nil:
				if !errors.As(err, &amb) {
					t.Fatalf("Match(%q) = %q, %v; want ambiguous", tt.query, m.Name, err)
				}
				if !slices.Equal(amb.Candidates, tt.ambiguous) || !slices.Equal(amb.Known, c.Names()) || amb.Query != tt.query {
					t.Errorf("ambiguous error %+v", amb)
				}
			case tt.unknown:
				if !errors.As(err, &unk) {
					t.Fatalf("Match(%q) = %q, %v; want unknown", tt.query, m.Name, err)
				}
				if !slices.Equal(unk.Known, c.Names()) || unk.Query != tt.query {
					t.Errorf("unknown error %+v", unk)
				}
			}
			if m.Name != "" {
				t.Errorf("a failed match returned a model: %+v", m)
			}
			if !strings.Contains(err.Error(), tt.wantErrMsg) {
				t.Errorf("error %q does not contain %q", err, tt.wantErrMsg)
			}
			if len(err.Error()) > 1000 {
				t.Errorf("error message is %d bytes long", len(err.Error()))
			}
		})
	}
}

func TestMatchEveryCanonicalName(t *testing.T) {
	c := DefaultCatalog()
	for _, name := range c.Names() {
		for _, q := range []string{name, strings.ToLower(name), strings.ReplaceAll(name, " ", "-"), strings.TrimPrefix(name, "NVIDIA ")} {
			if m, err := c.Match(q); err != nil || m.Name != name {
				t.Errorf("Match(%q) = %q, %v; want %q", q, m.Name, err, name)
			}
		}
	}
}

func TestMatchIn(t *testing.T) {
	c := DefaultCatalog()
	seen := []string{"10de:1db4", "10de:1db9", "NVIDIA L40S", " "}

	m, err := c.MatchIn("10DE:1DB4", seen)
	if err != nil || m.Name != "10de:1db4" || !slices.Equal(m.DeviceIDs, []uint16{0x1db4}) {
		t.Errorf("MatchIn(10DE:1DB4) = %+v, %v", m, err)
	}
	m, err = c.MatchIn("l40s", seen)
	if err != nil || m.Name != "NVIDIA L40S" || m.MemoryBytes == 0 {
		t.Errorf("an extra name equal to a catalog name must give the catalog model: %+v, %v", m, err)
	}
	var amb *AmbiguousModelError
	if _, err := c.MatchIn("10de:1db", seen); !errors.As(err, &amb) || !slices.Equal(amb.Candidates, []string{"10de:1db4", "10de:1db9"}) {
		t.Errorf("MatchIn(10de:1eb) = %v", err)
	}
	var unk *UnknownModelError
	if _, err := c.MatchIn("zzz", seen); !errors.As(err, &unk) || !slices.Contains(unk.Known, "10de:1db9") || slices.Contains(unk.Known, " ") {
		t.Errorf("unknown error must list the extra names it knew: %v", err)
	} else if n := len(unk.Known); n != len(c.Names())+2 {
		t.Errorf("Known has %d names, want %d: %q", n, len(c.Names())+2, unk.Known)
	}
	if m, err := c.MatchIn("Custom Board", []string{"custom-board"}); err != nil || m.Name != "custom-board" || m.DeviceIDs != nil {
		t.Errorf("plain extra name: %+v, %v", m, err)
	}
}

func FuzzMatch(f *testing.F) {
	for _, s := range []string{"", "   ", "h100", "H100 80GB", "h100-80gb", "nvidia h100 80gb", "L40S", "rtx-6000-pro",
		"RTX 6000", "a100", "zzz", "10de:1db4", "NVIDIA", "nvidia nvidia", "\x00", "h\u0130100", "ǅ", strings.Repeat("-", 300)} {
		f.Add(s)
	}
	c := DefaultCatalog()
	names := c.Names()
	f.Fuzz(func(t *testing.T, q string) {
		m, err := c.MatchIn(q, []string{"10de:1db4"})
		var amb *AmbiguousModelError
		var unk *UnknownModelError
		switch {
		case err == nil:
			if !slices.Contains(names, m.Name) && m.Name != "10de:1db4" {
				t.Fatalf("Match(%q) returned %q, which is not a known name", q, m.Name)
			}
		case errors.As(err, &amb):
			if len(amb.Candidates) < 2 {
				t.Fatalf("Match(%q): ambiguous with %d candidates", q, len(amb.Candidates))
			}
		case errors.As(err, &unk):
		default:
			t.Fatalf("Match(%q): unexpected error type %T: %v", q, err, err)
		}
		if err != nil {
			_ = err.Error() // must not panic either
		}
		for _, name := range names {
			if normalize(q) == normalize(name) && (err != nil || m.Name != name) {
				t.Fatalf("Match(%q) = %q, %v; it names %q exactly", q, m.Name, err, name)
			}
		}
		if slices.Contains(names, q) && m.Name != q {
			t.Fatalf("canonical name %q matched %q", q, m.Name)
		}
	})
}

// TestExactIsMatchForCanonicalNames: Exact answers what Match answers for
// every canonical name of the catalog, and nothing for any other spelling,
// which Match still resolves.
func TestExactIsMatchForCanonicalNames(t *testing.T) {
	c := DefaultCatalog()
	if len(c.Names()) < 2 {
		t.Fatal("the default catalog needs models for this test")
	}
	for _, name := range c.Names() {
		got, ok := c.Exact(name)
		if !ok {
			t.Errorf("Exact(%q): not found", name)
			continue
		}
		want, err := c.Match(name)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Exact(%q) = %+v, Match = %+v", name, got, want)
		}
		for _, other := range []string{strings.ToLower(name), strings.TrimPrefix(name, "NVIDIA "), name + " ", " " + name} {
			if other == name {
				continue
			}
			if m, ok := c.Exact(other); ok {
				t.Errorf("Exact(%q) = %q; only the canonical spelling is exact", other, m.Name)
			}
			if m, err := c.Match(other); err != nil || m.Name != name {
				t.Errorf("Match(%q) = %q, %v; want %q", other, m.Name, err, name)
			}
		}
	}
	if _, ok := c.Exact("10de:2330"); ok {
		t.Error("an uncatalogued name is exact")
	}
}
