package main

import "syscall"

// childAttr puts an agent in its own process group, so that Ctrl-C in the
// terminal reaches only the demo, which then stops the agents in order; and
// has the kernel kill it should the demo itself die without cleaning up.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
