// Package testport finds loopback ports for agents that tests and tools
// start on fixed ports (a seed to --join, a restart on the same ports).
//
// The ports are taken below the kernel's ephemeral range. Agents bind
// other listeners on port 0 (the name registry's raft), and the kernel
// hands those out of the ephemeral range only: a port picked here and
// released can never be given to one of them in the moment before the
// agent it was picked for binds it, as a port picked with a bind to port 0
// can.
package testport

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Free returns n distinct loopback ports free for both TCP and UDP now
// (memberlist uses both on its port). They are held while searching, so
// that no two are the same, and released before Free returns.
func Free(n int) ([]int, error) {
	var (
		ports   []int
		closers []io.Closer
	)
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	lo, hi := 10000, ephemeralLow()
	if hi-lo < 100*n {
		lo = 1024
	}
	for attempts := 0; len(ports) < n; attempts++ {
		if attempts > 100*n {
			return nil, errors.New("no free loopback port for TCP and UDP below the ephemeral range after many attempts")
		}
		port := lo + rand.IntN(hi-lo)
		if slices.Contains(ports, port) {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue // taken: try another
		}
		closers = append(closers, ln)
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			continue
		}
		closers = append(closers, pc)
		ports = append(ports, port)
	}
	return ports, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// net.ipv4.ip_local_port_range; 32768 when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= 1024 {
		return 32768
	}
	return n
}
