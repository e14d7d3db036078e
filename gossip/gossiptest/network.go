// Package gossiptest is an in-memory network for memberlist, with hooks to
// drop, delay, partition (both ways or one way), pause and kill members,
// for tests and simulations that run many gossip members in one process.
package gossiptest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Network behaves like UDP and TCP between its transports: a packet to a
// full receive queue is dropped, never waited for. The zero Network is
// ready to use.
//
// memberlist v0.7.0 ships MockNetwork/MockTransport (there is no
// NewMockNetwork: the zero MockNetwork is used), but it hands every packet
// over an unbuffered channel: a member answering a ping blocks until the
// pinger's receive loop takes the ack, and two members doing that to each
// other deadlock. With a few dozen members every probe then times out and
// the cluster flaps. This transport is MockTransport with a buffered,
// lossy packet queue, a locked address table and fault hooks.
type Network struct {
	mu      sync.RWMutex
	byAddr  map[string]*Transport
	port    int
	blocked map[[2]string]bool // from → to: nothing passes
	paused  map[string]bool    // neither sends nor receives
	loss    float64            // share of packets dropped
	delay   time.Duration      // added to every packet
	rnd     *rand.Rand
}

// Transport is one member's end of a Network; pass it as
// memberlist.Config.Transport.
type Transport struct {
	net      *Network
	addr     string
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

type memAddr string

func (a memAddr) Network() string { return "mem" }
func (a memAddr) String() string  { return string(a) }

// NewTransport adds a member to the network, at a new address.
func (n *Network) NewTransport() *Transport {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.byAddr == nil {
		n.byAddr = map[string]*Transport{}
	}
	n.port++
	t := &Transport{net: n, addr: fmt.Sprintf("127.0.0.1:%d", n.port),
		packetCh: make(chan *memberlist.Packet, 8192), streamCh: make(chan net.Conn, 16)}
	n.byAddr[t.addr] = t
	return t
}

// Addr is the transport's address ("127.0.0.1:N"), the name the fault
// hooks take.
func (t *Transport) Addr() string { return t.addr }

// Block stops everything from one address to another; the other way is
// untouched (a one-way partition).
func (n *Network) Block(from, to string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.blocked == nil {
		n.blocked = map[[2]string]bool{}
	}
	n.blocked[[2]string{from, to}] = true
}

// Partition blocks both ways between every address of side and every
// address of other.
func (n *Network) Partition(side, other []string) {
	for _, a := range side {
		for _, b := range other {
			n.Block(a, b)
			n.Block(b, a)
		}
	}
}

// Pause makes addr neither send nor receive, as a stopped process (SIGSTOP)
// whose peers time out; Resume undoes it. What was sent meanwhile is lost.
func (n *Network) Pause(addr string) { n.setPaused(addr, true) }

// Resume undoes Pause.
func (n *Network) Resume(addr string) { n.setPaused(addr, false) }

func (n *Network) setPaused(addr string, p bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.paused == nil {
		n.paused = map[string]bool{}
	}
	n.paused[addr] = p
}

// Kill removes addr from the network at once, as a crashed host: dials and
// packets to it fail from now on. Its memberlist is left to the caller.
func (n *Network) Kill(addr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.byAddr, addr)
}

// SetLoss drops each packet (not streams) with probability p, drawn from
// a generator seeded with seed, so that a run can be replayed.
func (n *Network) SetLoss(p float64, seed uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.loss, n.rnd = p, rand.New(rand.NewPCG(seed, seed))
}

// SetDelay delays every packet (not streams) by d.
func (n *Network) SetDelay(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.delay = d
}

// Heal lifts every block, pause, loss and delay (not kills).
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.blocked, n.paused, n.loss, n.delay = nil, nil, 0, 0
}

// route returns the transport at to, when from may reach it now.
func (n *Network) route(from, to string) (*Transport, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	t, ok := n.byAddr[to]
	if !ok || n.blocked[[2]string{from, to}] || n.paused[from] || n.paused[to] {
		return nil, fmt.Errorf("mem: no route from %s to %s", from, to)
	}
	return t, nil
}

// packetFate says whether a packet is lost and how long it is delayed.
func (n *Network) packetFate() (lost bool, delay time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.loss > 0 && n.rnd.Float64() < n.loss {
		return true, 0
	}
	return false, n.delay
}

// FinalAdvertiseAddr implements memberlist.Transport.
func (t *Transport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	host, port, err := net.SplitHostPort(t.addr)
	if err != nil {
		return nil, 0, err
	}
	p, err := strconv.Atoi(port)
	return net.ParseIP(host), p, err
}

// WriteTo implements memberlist.Transport.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress implements memberlist.NodeAwareTransport. A packet that a
// fault stops is lost silently, as a datagram is.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	dest, err := t.net.route(t.addr, a.Addr)
	if err != nil {
		if _, known := t.net.lookup(a.Addr); !known {
			return time.Time{}, err
		}
		return now, nil
	}
	lost, delay := t.net.packetFate()
	if lost {
		return now, nil
	}
	p := &memberlist.Packet{Buf: append([]byte(nil), b...), From: memAddr(t.addr), Timestamp: now}
	deliver := func() {
		select {
		case dest.packetCh <- p:
		default: // a full socket buffer drops the datagram
		}
	}
	if delay > 0 {
		time.AfterFunc(delay, deliver)
	} else {
		deliver()
	}
	return now, nil
}

func (n *Network) lookup(addr string) (*Transport, bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	t, ok := n.byAddr[addr]
	return t, ok
}

// PacketCh implements memberlist.Transport.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

// DialTimeout implements memberlist.Transport.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport. A fault
// between the two ends makes the dial fail.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	dest, err := t.net.route(t.addr, a.Addr)
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

// StreamCh implements memberlist.Transport.
func (t *Transport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown implements memberlist.Transport: the address leaves the network.
func (t *Transport) Shutdown() error {
	t.net.Kill(t.addr)
	return nil
}
