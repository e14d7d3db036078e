package main

import (
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/gpuherd/gpuherd/gossip/gossiptest"
)

// netMeter counts what the in-memory gossip members send each other:
// datagrams (probes, acks, gossip) and stream bytes (push/pull, joins),
// both directions of a stream counted at the end that dialled.
type netMeter struct {
	packets     atomic.Int64
	packetBytes atomic.Int64
	streams     atomic.Int64
	streamBytes atomic.Int64
}

type traffic struct {
	packets, packetBytes, streams, streamBytes int64
	at                                         time.Time
}

func (m *netMeter) read() traffic {
	return traffic{packets: m.packets.Load(), packetBytes: m.packetBytes.Load(),
		streams: m.streams.Load(), streamBytes: m.streamBytes.Load(), at: time.Now()}
}

// bytes is everything sent, datagrams and streams.
func (t traffic) bytes() int64 { return t.packetBytes + t.streamBytes }

// since is the traffic between u and t.
func (t traffic) since(u traffic) traffic {
	return traffic{packets: t.packets - u.packets, packetBytes: t.packetBytes - u.packetBytes,
		streams: t.streams - u.streams, streamBytes: t.streamBytes - u.streamBytes, at: t.at}
}

// meteredTransport is a gossiptest transport whose sends the meter counts.
type meteredTransport struct {
	*gossiptest.Transport
	m *netMeter
}

var _ memberlist.NodeAwareTransport = (*meteredTransport)(nil)

func (t *meteredTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *meteredTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	t.m.packets.Add(1)
	t.m.packetBytes.Add(int64(len(b)))
	return t.Transport.WriteToAddress(b, a)
}

func (t *meteredTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *meteredTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	c, err := t.Transport.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	t.m.streams.Add(1)
	return meteredConn{Conn: c, m: t.m}, nil
}

type meteredConn struct {
	net.Conn
	m *netMeter
}

func (c meteredConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.m.streamBytes.Add(int64(n))
	return n, err
}

func (c meteredConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.m.streamBytes.Add(int64(n))
	return n, err
}
