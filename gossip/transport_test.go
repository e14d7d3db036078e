package gossip

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

func newTestTransport(t *testing.T) *transport {
	t.Helper()
	tr, err := newTransport("127.0.0.1", 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Shutdown() })
	return tr
}

// Packets arrive whole, each in a buffer of its own size (not a 64 KiB one
// per packet), from their sender; streams are accepted on the same port.
func TestTransportPacketsAndStreams(t *testing.T) {
	a, b := newTestTransport(t), newTestTransport(t)
	if a.udp.LocalAddr().(*net.UDPAddr).Port != a.port || a.tcp.Addr().(*net.TCPAddr).Port != a.port {
		t.Fatalf("UDP %v and TCP %v are not both on port %d", a.udp.LocalAddr(), a.tcp.Addr(), a.port)
	}
	to := net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))
	for _, size := range []int{1, 300, 1400, 9000} {
		msg := bytes.Repeat([]byte{byte(size)}, size)
		if _, err := a.WriteToAddress(msg, memberlist.Address{Addr: to, Name: "b"}); err != nil {
			t.Fatal(err)
		}
		p := <-b.PacketCh()
		if !bytes.Equal(p.Buf, msg) {
			t.Fatalf("sent %d bytes, received %d", size, len(p.Buf))
		}
		if cap(p.Buf) > 2*len(p.Buf)+64 {
			t.Errorf("a %d-byte packet came in a %d-byte buffer", size, cap(p.Buf))
		}
		if p.From.(*net.UDPAddr).Port != a.port || p.Timestamp.IsZero() {
			t.Errorf("packet from %v at %v, want port %d and a time", p.From, p.Timestamp, a.port)
		}
	}

	conn, err := a.DialAddressTimeout(memberlist.Address{Addr: to}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	in := <-b.StreamCh()
	defer in.Close()
	got := make([]byte, 5)
	if _, err := io.ReadFull(in, got); err != nil || string(got) != "hello" {
		t.Fatalf("stream read %q, %v", got, err)
	}
}

// Shutdown stops the readers even while nobody takes what they received,
// and may be called twice.
func TestTransportShutdownWithPacketPending(t *testing.T) {
	a, b := newTestTransport(t), newTestTransport(t)
	if _, err := a.WriteTo([]byte("x"), net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := b.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := b.Shutdown(); err != nil {
		t.Fatal(err)
	}
}

func TestTransportAdvertiseAddr(t *testing.T) {
	tr := newTestTransport(t)
	ip, port, err := tr.FinalAdvertiseAddr("", 0)
	if err != nil || !ip.Equal(net.IPv4(127, 0, 0, 1)) || port != tr.port {
		t.Errorf("bound to 127.0.0.1: advertises %v:%d (%v), want 127.0.0.1:%d", ip, port, err, tr.port)
	}
	ip, port, err = tr.FinalAdvertiseAddr("10.1.2.3", 7946)
	if err != nil || !ip.Equal(net.IPv4(10, 1, 2, 3)) || len(ip) != net.IPv4len || port != 7946 {
		t.Errorf("given 10.1.2.3:7946: advertises %v:%d (%v)", ip, port, err)
	}
	if _, port, _ = tr.FinalAdvertiseAddr("10.1.2.3", 0); port != tr.port {
		t.Errorf("given an address without a port: advertises port %d, want the bound %d", port, tr.port)
	}
	if _, _, err := tr.FinalAdvertiseAddr("not-an-ip", 1); err == nil {
		t.Error("an advertise address that is no IP was accepted")
	}
	if _, err := newTransport("gpu-07", 0, slog.New(slog.DiscardHandler)); err == nil {
		t.Error("a bind address that is no IP was accepted")
	}
}
