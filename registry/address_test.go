package registry

import (
	"net/netip"
	"testing"
)

func TestParseWorkloadAddress(t *testing.T) {
	tests := []struct {
		name, in      string
		allowLoopback bool
		want          string // "" = refused
	}{
		{name: "IPv4", in: "10.0.0.5", want: "10.0.0.5"},
		{name: "IPv6 canonical", in: "2001:db8::20", want: "2001:db8::20"},
		{name: "IPv6 long and upper case", in: "2001:DB8:0:0:0:0:0:20", want: "2001:db8::20"},
		{name: "IPv4-mapped IPv6", in: "::ffff:10.0.0.5"},
		{name: "loopback", in: "127.0.0.1"},
		{name: "loopback allowed for demos", in: "127.0.1.1", allowLoopback: true, want: "127.0.1.1"},
		{name: "IPv6 loopback", in: "::1"},
		{name: "instance metadata service", in: "169.254.169.254"},
		{name: "IPv6 link-local", in: "fe80::1"},
		{name: "unspecified", in: "0.0.0.0"},
		{name: "IPv6 unspecified", in: "::"},
		{name: "multicast", in: "224.0.0.1"},
		{name: "IPv6 multicast", in: "ff02::1"},
		{name: "broadcast", in: "255.255.255.255"},
		{name: "zone", in: "fe80::1%eth0"},
		{name: "not an address", in: "vm-1.example.com"},
		{name: "with a port", in: "10.0.0.5:80"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseWorkloadAddress(tt.in, tt.allowLoopback)
			switch {
			case tt.want == "" && err == nil:
				t.Errorf("ParseWorkloadAddress(%q) = %v, want refused", tt.in, got)
			case tt.want != "" && (err != nil || got.String() != tt.want):
				t.Errorf("ParseWorkloadAddress(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
			}
		})
	}
}

// FuzzParseWorkloadAddress: agent-reported addresses never panic the
// parser, and an accepted address is canonical, unicast, unmapped, zoneless
// and parses back to itself.
func FuzzParseWorkloadAddress(f *testing.F) {
	for _, s := range []string{"10.0.0.5", "2001:DB8::20", "::ffff:1.2.3.4", "fe80::1%eth0", "", "1.2.3.4.5", "::"} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, s string, loopback bool) {
		ip, err := ParseWorkloadAddress(s, loopback)
		if err != nil {
			return
		}
		if ip.Zone() != "" || ip.Is4In6() || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLinkLocalUnicast() || (!loopback && ip.IsLoopback()) {
			t.Fatalf("accepted %q as %v", s, ip)
		}
		back, err := netip.ParseAddr(ip.String())
		if err != nil || back != ip {
			t.Fatalf("%v does not parse back to itself: %v", ip, err)
		}
	})
}
