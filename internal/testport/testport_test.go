package testport

import (
	"net"
	"slices"
	"strconv"
	"testing"
)

func TestFreePortsAreDistinctBindableAndBelowTheEphemeralRange(t *testing.T) {
	ports, err := Free(20)
	if err != nil {
		t.Fatal(err)
	}
	low := ephemeralLow()
	for i, p := range ports {
		if p >= low || p < 1024 {
			t.Errorf("port %d outside [1024, %d)", p, low)
		}
		if slices.Contains(ports[:i], p) {
			t.Errorf("port %d twice", p)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Errorf("port %d cannot be bound after Free: %v", p, err)
			continue
		}
		ln.Close()
	}
}
