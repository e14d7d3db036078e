package gossip

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sockaddr "github.com/hashicorp/go-sockaddr"
	"github.com/hashicorp/memberlist"
)

// transport is memberlist's network transport over one UDP socket and one
// TCP listener on the same port, as memberlist's own NetTransport, with one
// difference that matters under load: NetTransport allocates (and zeroes) a
// 64 KiB buffer for every packet it receives, while gossip packets are a
// few hundred bytes. Every claim anywhere changes one server's summary,
// which reaches every member in several packets, so that was most of an
// agent's allocation. This transport reads into one buffer and hands
// memberlist a copy of the packet's size.
type transport struct {
	log     *slog.Logger
	bindIP  net.IP
	port    int
	udp     *net.UDPConn
	tcp     *net.TCPListener
	packets chan *memberlist.Packet
	streams chan net.Conn
	closed  atomic.Bool
	done    chan struct{} // closed by Shutdown
	wg      sync.WaitGroup
}

var _ memberlist.NodeAwareTransport = (*transport)(nil)

// maxPacket is the largest UDP datagram there is: a packet is read whole
// or not at all.
const maxPacket = 65536

// udpReadBuffer is the socket receive buffer asked for, so that bursts of
// gossip are not dropped while the reader is descheduled; the kernel may
// cap it (net.core.rmem_max), and smaller sizes are tried down to the
// default.
const udpReadBuffer = 2 << 20

// newTransport listens on bindAddr:port, UDP and TCP. Port 0 picks a free
// port for both; as two sockets cannot take one port atomically, a port
// the other protocol holds already is retried a few times.
func newTransport(bindAddr string, port int, log *slog.Logger) (*transport, error) {
	ip := net.ParseIP(bindAddr)
	if ip == nil {
		return nil, fmt.Errorf("gossip: bind address %q is not an IP address", bindAddr)
	}
	tries := 1
	if port == 0 {
		tries = 10
	}
	var err error
	for range tries {
		var t *transport
		if t, err = listenTransport(ip, port, log); err == nil {
			t.start()
			return t, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, err
}

func listenTransport(ip net.IP, port int, log *slog.Logger) (*transport, error) {
	tcp, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip, Port: port})
	if err != nil {
		return nil, fmt.Errorf("gossip: listen on TCP %s: %w", net.JoinHostPort(ip.String(), strconv.Itoa(port)), err)
	}
	port = tcp.Addr().(*net.TCPAddr).Port
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port})
	if err != nil {
		_ = tcp.Close()
		return nil, fmt.Errorf("gossip: listen on UDP %s: %w", net.JoinHostPort(ip.String(), strconv.Itoa(port)), err)
	}
	for size := udpReadBuffer; size > 0; size /= 2 {
		if udp.SetReadBuffer(size) == nil {
			break
		}
	}
	return &transport{
		log: log, bindIP: ip, port: port, udp: udp, tcp: tcp,
		packets: make(chan *memberlist.Packet),
		streams: make(chan net.Conn),
		done:    make(chan struct{}),
	}, nil
}

func (t *transport) start() {
	t.wg.Add(2)
	go t.readPackets()
	go t.acceptStreams()
}

// FinalAdvertiseAddr is the address others reach this member at: ip when
// given, else the address bound to, or a private address of this host when
// bound to every address.
func (t *transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if ip != "" {
		addr := net.ParseIP(ip)
		if addr == nil {
			return nil, 0, fmt.Errorf("gossip: advertise address %q is not an IP address", ip)
		}
		if v4 := addr.To4(); v4 != nil {
			addr = v4
		}
		if port == 0 {
			port = t.port
		}
		return addr, port, nil
	}
	if !t.bindIP.IsUnspecified() {
		return t.bindIP, t.port, nil
	}
	private, err := sockaddr.GetPrivateIP()
	if err != nil {
		return nil, 0, fmt.Errorf("gossip: find this host's private address to advertise: %w", err)
	}
	addr := net.ParseIP(private)
	if addr == nil {
		return nil, 0, errors.New("gossip: this host has no private address to advertise; set the advertise address")
	}
	return addr, t.port, nil
}

// WriteTo sends one packet to addr (host:port).
func (t *transport) WriteTo(b []byte, addr string) (time.Time, error) {
	to, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return time.Time{}, err
	}
	_, err = t.udp.WriteTo(b, to)
	return time.Now(), err
}

// WriteToAddress is WriteTo; the node's name is not needed on a LAN.
func (t *transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

// PacketCh delivers the packets received.
func (t *transport) PacketCh() <-chan *memberlist.Packet { return t.packets }

// DialTimeout opens a stream to addr.
func (t *transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.Dial("tcp", addr)
}

// DialAddressTimeout is DialTimeout.
func (t *transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, timeout)
}

// StreamCh delivers the streams accepted.
func (t *transport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown closes both sockets and waits for their readers to stop.
func (t *transport) Shutdown() error {
	if t.closed.Swap(true) {
		return nil
	}
	close(t.done)
	_ = t.tcp.Close()
	_ = t.udp.Close()
	t.wg.Wait()
	return nil
}

// readPackets reads every datagram into one buffer and hands memberlist a
// copy of its size, stamped with when it arrived (memberlist measures
// probe round trips from it).
func (t *transport) readPackets() {
	defer t.wg.Done()
	buf := make([]byte, maxPacket)
	for {
		n, from, err := t.udp.ReadFrom(buf)
		now := time.Now()
		if err != nil {
			if t.closed.Load() {
				return
			}
			t.log.Error("reading a gossip packet", "err", err)
			continue
		}
		if n < 1 {
			t.log.Debug("empty gossip packet", "from", from)
			continue
		}
		select {
		case t.packets <- &memberlist.Packet{Buf: slices.Clone(buf[:n]), From: from, Timestamp: now}:
		case <-t.done:
			return
		}
	}
}

// acceptStreams hands memberlist every connection accepted; an accept
// that fails (too many open files) is retried after a pause that doubles
// up to a second, as a burst of failures would otherwise spin.
func (t *transport) acceptStreams() {
	defer t.wg.Done()
	const first, most = 5 * time.Millisecond, time.Second
	pause := time.Duration(0)
	for {
		conn, err := t.tcp.AcceptTCP()
		if err != nil {
			if t.closed.Load() {
				return
			}
			pause = min(max(2*pause, first), most)
			t.log.Error("accepting a gossip stream", "err", err, "retry_in", pause)
			select {
			case <-time.After(pause):
			case <-t.done:
				return
			}
			continue
		}
		pause = 0
		select {
		case t.streams <- conn:
		case <-t.done:
			_ = conn.Close()
			return
		}
	}
}
