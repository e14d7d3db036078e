//go:build !linux

// Package datasync makes appended bytes durable; see datasync_linux.go.
package datasync

import "os"

// File is a full fsync where the system has no fdatasync.
func File(f *os.File) error { return f.Sync() }
