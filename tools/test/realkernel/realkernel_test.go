//go:build linux

package main

import (
	"os"
	"testing"
)

// TestMain reports the result to QEMU when run as the guest's test binary
// (run.sh sets GPUHERD_REAL_KERNEL_EXIT=1): 0 for pass, 1 for fail, so
// that QEMU exits 1 or 3.
func TestMain(m *testing.M) {
	if spec := os.Getenv(consumerEnv); spec != "" {
		consumerMain(spec)
	}
	code := m.Run()
	if os.Getenv("GPUHERD_REAL_KERNEL_EXIT") == "1" {
		v := uint8(0)
		if code != 0 {
			v = 1
		}
		if err := qemuExit(v); err != nil {
			println("realkernel:", err.Error())
		}
	}
	os.Exit(code)
}

// TestRealKernel runs both parts. It binds PCI devices through /sys, so it
// runs only in run.sh's guest (GPUHERD_REAL_KERNEL=1); `go test ./...`
// skips it.
func TestRealKernel(t *testing.T) {
	if os.Getenv("GPUHERD_REAL_KERNEL") != "1" {
		t.Skip("binds PCI devices through /sys: runs only inside the QEMU guest of tools/test/realkernel/run.sh (make test-kernel)")
	}
	if err := run(os.Stdout); err != nil {
		t.Fatal(err)
	}
}
