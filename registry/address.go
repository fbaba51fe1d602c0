package registry

import (
	"fmt"
	"net/netip"
)

// ParseWorkloadAddress parses a workload address as reported by an agent and
// returns it in canonical form (netip's: lowercase, IPv6 compressed), so that
// the same address written two ways (2001:DB8:0:0:0:0:0:20, 2001:db8::20) is
// stored, compared and fenced as one.
//
// It refuses, with a message naming the reason, addresses that can never be a
// workload's address: IPv6 zones, IPv4-mapped IPv6 addresses (write the IPv4
// form), the unspecified address, loopback (127.0.0.0/8, ::1), link-local
// (169.254.0.0/16 - including the instance metadata service 169.254.169.254 -
// and fe80::/10) and multicast addresses, and the limited broadcast address.
// allowLoopback accepts loopback addresses (demos and tests that run
// "VMs" on 127.0.0.0/8; never in production).
func ParseWorkloadAddress(s string, allowLoopback bool) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return netip.Addr{}, fmt.Errorf("not an IP address")
	case ip.Zone() != "":
		return netip.Addr{}, fmt.Errorf("an IPv6 zone (%%%s) is not allowed", ip.Zone())
	case ip.Is4In6():
		return netip.Addr{}, fmt.Errorf("IPv4-mapped IPv6 address: write the IPv4 address %s", ip.Unmap())
	case ip.IsUnspecified():
		return netip.Addr{}, fmt.Errorf("unspecified address")
	case ip.IsLoopback() && !allowLoopback:
		return netip.Addr{}, fmt.Errorf("loopback address")
	case ip.IsLinkLocalUnicast():
		return netip.Addr{}, fmt.Errorf("link-local address (169.254.0.0/16, fe80::/10)")
	case ip.IsMulticast(), ip.IsLinkLocalMulticast(), ip.IsInterfaceLocalMulticast():
		return netip.Addr{}, fmt.Errorf("multicast address")
	case ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return netip.Addr{}, fmt.Errorf("broadcast address")
	}
	return ip, nil
}
