//go:build linux

// Package datasync makes appended bytes durable at the cost of one
// fdatasync: the data and the file's size, without the inode times an
// fsync would also write. The registry's raft log and the ledger's journal
// use it.
package datasync

import (
	"os"

	"golang.org/x/sys/unix"
)

// File makes what was written to f durable: its bytes and its size.
func File(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
