//go:build !linux

// Command gpuherd-chaos needs Linux: network namespaces, veth pairs and
// nftables are what it injects faults with.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "gpuherd-chaos runs on Linux only (network namespaces, nftables)")
	os.Exit(2)
}
