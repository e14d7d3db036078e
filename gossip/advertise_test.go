package gossip

import (
	"errors"
	"net"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestAdvertiseAddrNamedInterface(t *testing.T) {
	ip, err := AdvertiseAddr("lo")
	if err != nil {
		t.Fatal(err)
	}
	if !ip.Equal(net.IPv4(127, 0, 0, 1)) {
		t.Errorf("AdvertiseAddr(lo) = %v, want 127.0.0.1", ip)
	}
}

func TestAdvertiseAddrUnknownInterface(t *testing.T) {
	if _, err := AdvertiseAddr("no-such-if0"); err == nil {
		t.Error("no error for an interface that does not exist")
	}
}

// The default-route path only reads the host's routing table; the answer is
// checked against the standard library's view of the same interface.
func TestAdvertiseAddrDefaultRoute(t *testing.T) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Skipf("cannot read the routing table here: %v", err)
	}
	index, err := defaultRouteLink(routes)
	if errors.Is(err, errNoDefaultRoute) {
		t.Skip("this machine has no IPv4 default route; the default-route path is covered by TestDefaultRouteLink only")
	}
	if err != nil {
		t.Fatal(err)
	}
	ip, err := AdvertiseAddr("")
	if err != nil {
		t.Fatal(err)
	}
	ifc, err := net.InterfaceByIndex(index)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			t.Logf("default route via %s, advertising %v", ifc.Name, ip)
			return
		}
	}
	t.Errorf("AdvertiseAddr(\"\") = %v, not an address of %s (the default route's interface): %v", ip, ifc.Name, addrs)
}

func TestDefaultRouteLink(t *testing.T) {
	_, lan, _ := net.ParseCIDR("10.0.0.0/24")
	_, zero, _ := net.ParseCIDR("0.0.0.0/0")
	tests := []struct {
		name   string
		routes []netlink.Route
		want   int
	}{
		{"nil dst", []netlink.Route{{Dst: lan, LinkIndex: 2}, {LinkIndex: 3, Table: mainTable}}, 3},
		{"0.0.0.0/0 dst", []netlink.Route{{Dst: zero, LinkIndex: 4}}, 4},
		{"lowest metric wins", []netlink.Route{{LinkIndex: 5, Priority: 200}, {LinkIndex: 6, Priority: 100}}, 6},
		{"multipath", []netlink.Route{{MultiPath: []*netlink.NexthopInfo{{LinkIndex: 7}, {LinkIndex: 8}}}}, 7},
		{"other table ignored", []netlink.Route{{LinkIndex: 9, Table: 100}, {LinkIndex: 10, Table: mainTable, Priority: 500}}, 10},
		{"none", []netlink.Route{{Dst: lan, LinkIndex: 2}}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := defaultRouteLink(tt.routes)
			if tt.want == 0 {
				if !errors.Is(err, errNoDefaultRoute) {
					t.Errorf("got %d, %v; want errNoDefaultRoute", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}

func TestFirstIPv4(t *testing.T) {
	addr := func(s string) netlink.Addr {
		ip, n, _ := net.ParseCIDR(s)
		n.IP = ip
		return netlink.Addr{IPNet: n}
	}
	addrs := []netlink.Addr{addr("fe80::1/64"), addr("127.0.0.2/8"), addr("169.254.1.1/16"), addr("192.0.2.7/24")}
	if got := firstIPv4(addrs, false); !got.Equal(net.IPv4(127, 0, 0, 2)) {
		t.Errorf("any IPv4: got %v", got)
	}
	if got := firstIPv4(addrs, true); !got.Equal(net.IPv4(192, 0, 2, 7)) {
		t.Errorf("global unicast: got %v", got)
	}
}
