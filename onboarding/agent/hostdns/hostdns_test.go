package hostdns

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestNewLink(t *testing.T) {
	tests := []struct {
		name, link, address, server string
		domains                     []string
		wantDomains                 []string
		wantErr                     string
	}{
		{name: "default", link: DefaultLinkName, address: DefaultLinkAddress, server: "127.0.0.1:15053", domains: []string{"cluster.local"}, wantDomains: []string{"cluster.local"}},
		{name: "several domains, case and trailing dot", link: "mesh0", address: "10.255.53.1/32", server: "127.0.0.1:15053",
			domains: []string{"cluster.local", "Example.COM."}, wantDomains: []string{"cluster.local", "example.com"}},
		{name: "ipv6", link: "mesh0", address: "fd00:53::1/128", server: "[::1]:15053", domains: []string{"cluster.local"}, wantDomains: []string{"cluster.local"}},
		{name: "server not loopback", link: "mesh0", address: DefaultLinkAddress, server: "10.0.0.7:15053", domains: []string{"cluster.local"}, wantErr: "loopback"},
		{name: "server without port", link: "mesh0", address: DefaultLinkAddress, server: "127.0.0.1", domains: []string{"cluster.local"}, wantErr: "loopback ip:port"},
		{name: "no domains", link: "mesh0", address: DefaultLinkAddress, server: "127.0.0.1:15053", wantErr: "no domains"},
		{name: "injected line", link: "mesh0", address: DefaultLinkAddress, server: "127.0.0.1:15053", domains: []string{"cluster.local\nDNS=1.1.1.1"}, wantErr: "domain"},
		{name: "root domain", link: "mesh0", address: DefaultLinkAddress, server: "127.0.0.1:15053", domains: []string{"."}, wantErr: "domain"},
		{name: "link name an option", link: "-all", address: DefaultLinkAddress, server: "127.0.0.1:15053", domains: []string{"cluster.local"}, wantErr: "link name"},
		{name: "link name too long for the veth peer", link: "mesh-dns-link-0", address: DefaultLinkAddress, server: "127.0.0.1:15053", domains: []string{"cluster.local"}, wantErr: "link name"},
		{name: "any interface name", link: "eth0", address: DefaultLinkAddress, server: "127.0.0.1:15053", domains: []string{"cluster.local"}, wantDomains: []string{"cluster.local"}},
		{name: "address a network", link: "mesh0", address: "169.254.53.0/24", server: "127.0.0.1:15053", domains: []string{"cluster.local"}, wantErr: "one host address"},
		{name: "address loopback", link: "mesh0", address: "127.0.0.54/32", server: "127.0.0.1:15053", domains: []string{"cluster.local"}, wantErr: "not loopback"},
		{name: "address ipv6 link-local", link: "mesh0", address: "fe80::53/128", server: "127.0.0.1:15053", domains: []string{"cluster.local"}, wantErr: "link-local"},
		{name: "address not an address", link: "mesh0", address: "mesh", server: "127.0.0.1:15053", domains: []string{"cluster.local"}, wantErr: "one host address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := NewLink(tt.link, tt.address, tt.server, tt.domains)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(l.Domains, tt.wantDomains) || l.Name != tt.link || l.Server.String() != tt.server {
				t.Errorf("link %+v, want name %s server %s domains %v", l, tt.link, tt.server, tt.wantDomains)
			}
		})
	}
}

func TestLinks(t *testing.T) {
	out := []byte("1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\\    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00\n" +
		"2: eth0@if7: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP mode DEFAULT group default qlen 1000\\    link/ether 02:42:ac:11:00:02 brd ff:ff:ff:ff:ff:ff link-netnsid 0\n" +
		"5: mesh-dns0@mesh-dns0p: <BROADCAST,NOARP,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP\\    link/ether 9e:b9:c5:a2:7f:df brd ff:ff:ff:ff:ff:ff\\    alias onboarding-agent-mesh-dns\n" +
		"garbage\n")
	want := map[string]string{"lo": "", "eth0": "", "mesh-dns0": LinkAlias}
	if got := Links(out); !maps.Equal(got, want) {
		t.Errorf("Links = %v, want %v", got, want)
	}
}

// host plays ip and resolvectl for Enable and Disable: it keeps the links
// and records every command. The real commands against a real
// systemd-resolved run in test/istiod (TestVMResolverAsksTheSidecarForMeshNamesOnly).
type host struct {
	links   map[string]string // name: alias
	noDummy bool
	calls   []string
	fail    string // a command prefix that fails
}

func (h *host) run(_ context.Context, argv ...string) ([]byte, error) {
	cmd := strings.Join(argv, " ")
	h.calls = append(h.calls, cmd)
	if h.fail != "" && strings.HasPrefix(cmd, h.fail) {
		return []byte("boom"), errors.New("exit status 1")
	}
	switch {
	case cmd == "ip -o link show":
		var b strings.Builder
		i := 1
		for name, alias := range h.links {
			b.WriteString(strconv.Itoa(i) + ": " + name + ": <UP> mtu 1500")
			if alias != "" {
				b.WriteString("\\    alias " + alias)
			}
			b.WriteString("\n")
			i++
		}
		return []byte(b.String()), nil
	case strings.HasSuffix(cmd, "type dummy"):
		if h.noDummy {
			return []byte("Error: Unknown device type."), errors.New("exit status 2")
		}
		h.links[argv[3]] = ""
	case strings.Contains(cmd, "type veth"):
		h.links[argv[3]], h.links[argv[8]] = "", ""
	case strings.HasPrefix(cmd, "ip link set dev ") && argv[5] == "alias":
		h.links[argv[4]] = argv[6]
	case strings.HasPrefix(cmd, "ip link delete dev "):
		delete(h.links, argv[4])
		delete(h.links, argv[4]+"p")
	}
	return nil, nil
}

func TestEnableDisable(t *testing.T) {
	l, err := NewLink(DefaultLinkName, DefaultLinkAddress, "127.0.0.1:15053", []string{"cluster.local", "corp.example"})
	if err != nil {
		t.Fatal(err)
	}
	configure := []string{
		"ip address replace 169.254.53.53/32 dev mesh-dns0",
		"ip link set dev mesh-dns0 up",
		"resolvectl default-route mesh-dns0 false",
		"resolvectl llmnr mesh-dns0 false",
		"resolvectl mdns mesh-dns0 false",
		"resolvectl dnssec mesh-dns0 false",
		"resolvectl dnsovertls mesh-dns0 false",
		"resolvectl domain mesh-dns0 ~cluster.local ~corp.example",
		"resolvectl dns mesh-dns0 127.0.0.1:15053",
	}
	tests := []struct {
		name        string
		noDummy     bool
		legacy      bool
		steps       []string // enable, disable
		wantChanged []bool
		wantCalls   []string
		wantLinks   []string
	}{
		{name: "enable creates a dummy link and configures it", steps: []string{"enable"}, wantChanged: []bool{true},
			wantCalls: append([]string{"ip -o link show", "ip link add mesh-dns0 type dummy", "ip link set dev mesh-dns0 alias onboarding-agent-mesh-dns"}, configure...), wantLinks: []string{"mesh-dns0"}},
		{name: "enable again configures the link again", steps: []string{"enable", "enable"}, wantChanged: []bool{true, false},
			wantCalls: slices.Concat([]string{"ip -o link show", "ip link add mesh-dns0 type dummy", "ip link set dev mesh-dns0 alias onboarding-agent-mesh-dns"}, configure, []string{"ip -o link show"}, configure), wantLinks: []string{"mesh-dns0"}},
		{name: "no dummy driver: a veth pair", noDummy: true, steps: []string{"enable"}, wantChanged: []bool{true},
			wantCalls: append([]string{"ip -o link show", "ip link add mesh-dns0 type dummy", "ip link add mesh-dns0 type veth peer name mesh-dns0p", "ip link set dev mesh-dns0p up", "ip link set dev mesh-dns0 alias onboarding-agent-mesh-dns"}, configure...),
			wantLinks: []string{"mesh-dns0", "mesh-dns0p"}},
		{name: "disable deletes the link", steps: []string{"enable", "disable"}, wantChanged: []bool{true, true},
			wantCalls: slices.Concat([]string{"ip -o link show", "ip link add mesh-dns0 type dummy", "ip link set dev mesh-dns0 alias onboarding-agent-mesh-dns"}, configure, []string{"ip -o link show", "ip link delete dev mesh-dns0"})},
		{name: "disable without a link does nothing", steps: []string{"disable"}, wantChanged: []bool{false}, wantCalls: []string{"ip -o link show"}},
		{name: "the legacy global drop-in goes, and resolved forgets it", legacy: true, steps: []string{"disable"}, wantChanged: []bool{false},
			wantCalls: []string{"systemctl try-reload-or-restart systemd-resolved.service", "ip -o link show"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &host{links: map[string]string{"lo": "", "eth0": ""}, noDummy: tt.noDummy}
			o := Options{Run: h.run, LegacyDropIn: filepath.Join(t.TempDir(), "legacy.conf")}
			if tt.legacy {
				if err := os.WriteFile(o.LegacyDropIn, []byte("[Resolve]\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for i, s := range tt.steps {
				var changed bool
				var err error
				if s == "enable" {
					changed, err = Enable(t.Context(), o, l)
				} else {
					changed, err = Disable(t.Context(), o, l)
				}
				if err != nil {
					t.Fatalf("%s: %v", s, err)
				}
				if changed != tt.wantChanged[i] {
					t.Errorf("%s #%d: changed = %v, want %v", s, i, changed, tt.wantChanged[i])
				}
			}
			if !slices.Equal(h.calls, tt.wantCalls) {
				t.Errorf("commands:\n%s\nwant:\n%s", strings.Join(h.calls, "\n"), strings.Join(tt.wantCalls, "\n"))
			}
			var links []string
			for name := range h.links {
				if name != "lo" && name != "eth0" {
					links = append(links, name)
				}
			}
			slices.Sort(links)
			if !slices.Equal(links, tt.wantLinks) {
				t.Errorf("links %v, want %v", links, tt.wantLinks)
			}
			if _, err := os.Stat(o.LegacyDropIn); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("legacy drop-in still there: %v", err)
			}
		})
	}
}

// A link of the configured name that is not the agent's (no alias) is
// neither configured nor deleted.
func TestSomeoneElsesLink(t *testing.T) {
	l, err := NewLink("eth1", DefaultLinkAddress, "127.0.0.1:15053", []string{"cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	for name, do := range map[string]func(context.Context, Options, Link) (bool, error){"enable": Enable, "disable": Disable} {
		h := &host{links: map[string]string{"eth1": "uplink"}}
		_, err := do(t.Context(), Options{Run: h.run, LegacyDropIn: filepath.Join(t.TempDir(), "none")}, l)
		if err == nil || !strings.Contains(err.Error(), "not the agent's") {
			t.Errorf("%s: err = %v, want a refusal", name, err)
		}
		if len(h.calls) != 1 {
			t.Errorf("%s: ran %v after finding someone else's link", name, h.calls)
		}
	}
}

func TestEnableReportsTheFailingCommand(t *testing.T) {
	l, err := NewLink(DefaultLinkName, DefaultLinkAddress, "127.0.0.1:15053", []string{"cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	h := &host{links: map[string]string{}, fail: "resolvectl domain"}
	_, err = Enable(t.Context(), Options{Run: h.run, LegacyDropIn: filepath.Join(t.TempDir(), "none")}, l)
	if err == nil || !strings.Contains(err.Error(), "resolvectl domain mesh-dns0 ~cluster.local") || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("err = %v, want the failing command and its output", err)
	}
	// The server was never set, and the half-configured link is gone.
	if slices.ContainsFunc(h.calls, func(c string) bool { return strings.HasPrefix(c, "resolvectl dns ") }) {
		t.Errorf("the sidecar's server was set before the link was configured: %v", h.calls)
	}
	if _, ok := h.links["mesh-dns0"]; ok {
		t.Errorf("a failed Enable left the link: %v", h.calls)
	}
}
