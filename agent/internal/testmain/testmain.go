// Package testmain is what the agent's test binaries do before their
// tests run: the waiting tests run side by side, and the tests' files live
// in memory.
package testmain

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// Run runs m and returns its exit code, after two changes to how it runs
// unless the command line or the environment already says otherwise:
//
//   - -test.parallel is raised to parallel. The cluster tests spend most of
//     their time waiting for gossip rounds, leases and elections, not
//     computing: the default (one test per CPU) left a 2-core machine idle
//     for most of the run.
//   - TMPDIR points at /dev/shm, a memory file system, so that t.TempDir
//     and os.MkdirTemp("", …) are in memory. The ledger and the name
//     registry fsync every write, as they must; on a disk shared by
//     several test binaries those fsyncs queued behind each other and took
//     most of `go test ./agent/...`. What the tests check does not depend
//     on the disk: a kill -9 keeps what reached the page cache on either,
//     and the full-disk tests mount a small file system of their own
//     (testdisk.Mount). /dev/shm's path is short enough that an agent's
//     socket in a test's directory stays within a unix socket path's 100
//     bytes.
func Run(m *testing.M, parallel int) int {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set && runtime.GOMAXPROCS(0) < parallel {
		if err := flag.Set("test.parallel", strconv.Itoa(parallel)); err != nil {
			panic(err)
		}
	}
	if os.Getenv("TMPDIR") == "" {
		if fi, err := os.Stat(shm); err == nil && fi.IsDir() && fi.Mode()&0o1777 == 0o1777 {
			os.Setenv("TMPDIR", shm)
			defer os.Unsetenv("TMPDIR")
		}
	}
	return m.Run()
}

// shm is where Linux keeps a memory file system every user may write to
// (mode 1777, as /tmp).
const shm = "/dev/shm"
