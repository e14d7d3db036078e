package main

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// debugExitPort is the I/O port of QEMU's isa-debug-exit device as run.sh
// configures it (iobase=0xf4).
const debugExitPort = 0xf4

func outb(port uint16, val uint8)

// qemuExit ends the guest: QEMU exits with status (code << 1) | 1. The
// kernel has no /dev/port (CONFIG_DEVPORT is off in Debian's cloud kernel),
// so the port is written directly after ioperm.
func qemuExit(code uint8) error {
	// ioperm grants the port to the calling thread only: the write must
	// run on the thread that asked, or it faults (SIGSEGV at outb after a
	// passing run, seen once in CI).
	runtime.LockOSThread()
	if err := unix.Ioperm(debugExitPort, 4, 1); err != nil {
		return fmt.Errorf("ioperm 0x%x: %w", debugExitPort, err)
	}
	outb(debugExitPort, code)
	return fmt.Errorf("isa-debug-exit at 0x%x did not end the machine", debugExitPort)
}
