//go:build unix

package vfio

import (
	"errors"
	"os"
	"syscall"
)

// writeOnce issues exactly one write(2) of data to f. Not f.Write: that
// retries short writes, and a second write(2) with the rest of the data
// would be a second, different store.
func writeOnce(f *os.File, data []byte) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var werr error
	err = rc.Write(func(fd uintptr) bool {
		for {
			n, werr = syscall.Write(int(fd), data)
			// EINTR: nothing was stored, so trying again is still one store.
			if !errors.Is(werr, syscall.EINTR) {
				break
			}
		}
		return !errors.Is(werr, syscall.EAGAIN)
	})
	if err != nil {
		return 0, err
	}
	if n < 0 {
		n = 0
	}
	return n, werr
}
