package gossip

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// AdvertiseAddr returns the IPv4 address other servers should use to reach
// this one. With iface empty it is the first global unicast IPv4 address of
// the interface that carries the IPv4 default route (the way the server talks
// to the rest of the data centre); with iface named, that interface's first
// IPv4 address. It only reads the routing table and addresses.
func AdvertiseAddr(iface string) (net.IP, error) {
	if iface != "" {
		link, err := netlink.LinkByName(iface)
		if err != nil {
			return nil, fmt.Errorf("advertise interface %q: %w; check --advertise-interface", iface, err)
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
		if err != nil {
			return nil, fmt.Errorf("advertise interface %q: list addresses: %w", iface, err)
		}
		ip := firstIPv4(addrs, false)
		if ip == nil {
			return nil, fmt.Errorf("advertise interface %q has no IPv4 address; set --advertise-addr", iface)
		}
		return ip, nil
	}

	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("read the IPv4 routing table: %w; set --advertise-interface or --advertise-addr", err)
	}
	index, err := defaultRouteLink(routes)
	if err != nil {
		return nil, err
	}
	link, err := netlink.LinkByIndex(index)
	if err != nil {
		return nil, fmt.Errorf("interface %d of the default route: %w; set --advertise-interface or --advertise-addr", index, err)
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("interface %s of the default route: list addresses: %w", link.Attrs().Name, err)
	}
	ip := firstIPv4(addrs, true)
	if ip == nil {
		return nil, fmt.Errorf("interface %s of the default route has no global IPv4 address; set --advertise-interface or --advertise-addr", link.Attrs().Name)
	}
	return ip, nil
}

var errNoDefaultRoute = errors.New("no IPv4 default route; set --advertise-interface or --advertise-addr")

// defaultRouteLink returns the interface index of the preferred (lowest
// metric) IPv4 default route in the main table. A multipath default route
// counts by its first next hop.
func defaultRouteLink(routes []netlink.Route) (int, error) {
	best, bestPrio := 0, 0
	for _, r := range routes {
		if !isDefaultDst(r.Dst) {
			continue
		}
		// Policy-routing tables other than main do not decide where the
		// server's ordinary traffic goes.
		if r.Table != 0 && r.Table != mainTable {
			continue
		}
		index := r.LinkIndex
		if index == 0 && len(r.MultiPath) > 0 {
			index = r.MultiPath[0].LinkIndex
		}
		if index == 0 {
			continue
		}
		if best == 0 || r.Priority < bestPrio {
			best, bestPrio = index, r.Priority
		}
	}
	if best == 0 {
		return 0, errNoDefaultRoute
	}
	return best, nil
}

// mainTable is RT_TABLE_MAIN, the table `ip route` shows.
const mainTable = 254

// isDefaultDst reports whether dst is 0.0.0.0/0; netlink leaves Dst nil for
// a default route in some versions and sets 0.0.0.0/0 in others.
func isDefaultDst(dst *net.IPNet) bool {
	if dst == nil {
		return true
	}
	ones, _ := dst.Mask.Size()
	return ones == 0 && dst.IP.IsUnspecified()
}

// firstIPv4 returns the first IPv4 address of addrs, only a global unicast
// one when globalOnly is set.
func firstIPv4(addrs []netlink.Addr, globalOnly bool) net.IP {
	for _, a := range addrs {
		if a.IPNet == nil {
			continue
		}
		ip := a.IP.To4()
		if ip == nil || (globalOnly && !ip.IsGlobalUnicast()) {
			continue
		}
		return ip
	}
	return nil
}
