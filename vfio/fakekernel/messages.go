package fakekernel

import "fmt"

// maxQuoted bounds how much of a caller-supplied value an error message
// repeats, as package vfio's messages do.
const maxQuoted = 64

// quote is s as a Go string literal, cut to maxQuoted bytes with a note of
// the full length.
func quote(s string) string {
	if len(s) <= maxQuoted {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:maxQuoted], len(s))
}

// shorten keeps error messages bounded when a name is huge.
func shorten(s string) string {
	if len(s) <= 2*maxQuoted {
		return s
	}
	return s[:2*maxQuoted] + "..."
}
