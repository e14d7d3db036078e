package main

import (
	"strings"
	"testing"
)

func TestEsc(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"NVIDIA L40S", "NVIDIA L40S"},
		{"ünïcödé 名前", "ünïcödé 名前"},
		{"a\x1b[2Jb", `a\x1b[2Jb`},
		{"tab\tnew\nline\r", `tab\tnew\nline\r`},
		{"bell\x07 del\x7f", `bell\x07 del\x7f`},
		{"c1\u009b31m", `c1\u009b31m`},
		{"bidi\u202eevil", `bidi\u202eevil`},
		{"bad\xffutf8", `bad\xffutf8`},
	} {
		if got := esc(tc.in); got != tc.want {
			t.Errorf("esc(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The writer keeps the layout (tab, newline) and escapes the rest, also
// when a rune or an escape sequence is split across writes.
func TestEscapingWriter(t *testing.T) {
	var b strings.Builder
	w := &escapingWriter{w: &b}
	in := "ID\tMODEL\nvm-1\tL40S\x1b[2J 名\n"
	for i := 0; i < len(in); i++ { // one byte at a time
		if _, err := w.Write([]byte{in[i]}); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = w.Write([]byte{0xe5}) // a rune that never completes
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if want := "ID\tMODEL\nvm-1\tL40S\\x1b[2J 名\n\\xe5"; b.String() != want {
		t.Errorf("wrote %q, want %q", b.String(), want)
	}
}
