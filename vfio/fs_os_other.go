//go:build !unix

package vfio

import "os"

// writeOnce writes data to f. Without sysfs there is no store to split, so
// the portable write is enough for test trees on other systems.
func writeOnce(f *os.File, data []byte) (int, error) { return f.Write(data) }
