//go:build linux && !amd64

package main

import "errors"

func qemuExit(uint8) error { return errors.New("isa-debug-exit: amd64 only") }
