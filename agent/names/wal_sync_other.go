//go:build !linux

package names

import "os"

// fdatasync is a full fsync where the system has no fdatasync.
func fdatasync(f *os.File) error { return f.Sync() }
