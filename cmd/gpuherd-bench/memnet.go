package main

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// memNet is an in-memory network for memberlist that behaves like UDP:
// a packet to a full receive queue is dropped, never waited for.
//
// memberlist v0.7.0 ships MockNetwork/MockTransport (there is no
// NewMockNetwork: the zero MockNetwork is used), but it hands every packet
// over an unbuffered channel: a member answering a ping blocks until the
// pinger's receive loop takes the ack, and two members doing that to each
// other deadlock. With a few dozen members every probe then times out and
// the cluster flaps. This transport is MockTransport with a buffered,
// lossy packet queue and a locked address table.
type memNet struct {
	mu     sync.RWMutex
	byAddr map[string]*memTransport
	port   int
}

type memAddr string

func (a memAddr) Network() string { return "mem" }
func (a memAddr) String() string  { return string(a) }

type memTransport struct {
	net      *memNet
	addr     string
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
}

var _ memberlist.NodeAwareTransport = (*memTransport)(nil)

func (n *memNet) newTransport() *memTransport {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.byAddr == nil {
		n.byAddr = map[string]*memTransport{}
	}
	n.port++
	t := &memTransport{net: n, addr: fmt.Sprintf("127.0.0.1:%d", n.port),
		packetCh: make(chan *memberlist.Packet, 8192), streamCh: make(chan net.Conn, 16)}
	n.byAddr[t.addr] = t
	return t
}

func (n *memNet) peer(addr string) (*memTransport, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	t, ok := n.byAddr[addr]
	if !ok {
		return nil, fmt.Errorf("mem: no route to %s", addr)
	}
	return t, nil
}

func (t *memTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	host, port, err := net.SplitHostPort(t.addr)
	if err != nil {
		return nil, 0, err
	}
	p, err := strconv.Atoi(port)
	return net.ParseIP(host), p, err
}

func (t *memTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *memTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	dest, err := t.net.peer(a.Addr)
	if err != nil {
		return time.Time{}, err
	}
	now := time.Now()
	select {
	case dest.packetCh <- &memberlist.Packet{Buf: append([]byte(nil), b...), From: memAddr(t.addr), Timestamp: now}:
	default: // a full socket buffer drops the datagram
	}
	return now, nil
}

func (t *memTransport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

func (t *memTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *memTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	dest, err := t.net.peer(a.Addr)
	if err != nil {
		return nil, err
	}
	p1, p2 := net.Pipe()
	select {
	case dest.streamCh <- p1:
		return p2, nil
	case <-time.After(timeout):
		p1.Close()
		p2.Close()
		return nil, fmt.Errorf("mem: dial %s: timeout", a.Addr)
	}
}

func (t *memTransport) StreamCh() <-chan net.Conn { return t.streamCh }

func (t *memTransport) Shutdown() error {
	t.net.mu.Lock()
	delete(t.net.byAddr, t.addr)
	t.net.mu.Unlock()
	return nil
}
