//go:build unix

package gossip

import (
	"io/fs"
	"syscall"
)

// fileOwner is the uid that owns a file, when the platform says.
func fileOwner(fi fs.FileInfo) (int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
