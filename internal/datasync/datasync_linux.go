//go:build linux

// Package datasync makes appended bytes durable at the cost of one
// fdatasync: the data and the file's size, without the inode times an
// fsync would also write. The registry's raft log and the ledger's journal
// use it.
package datasync

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// File makes what was written to f durable: its bytes and its size. A
// file closed before the call, or while it waits to start, fails with an
// error that is os.ErrClosed, as f.Sync would: the descriptor is held for
// the call (never a raw number that a close, or another file opened
// since, could have taken).
func File(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if serr = unix.Fdatasync(int(fd)); !errors.Is(serr, unix.EINTR) {
				return
			}
		}
	}); err != nil {
		// The only failure before the call: the file is closed.
		return os.ErrClosed
	}
	return serr // the errno, as unix.Fdatasync returns it
}
