// Package hostdns points the VM's resolver at the sidecar's DNS proxy for
// the mesh's domains only, and takes it away again, with no iptables.
//
// On a host running systemd-resolved the root-run
// onboarding-agent-sidecar.service gives the sidecar a link of its own, a
// dummy interface (DefaultLinkName, mesh-dns0) carrying one address
// (resolved uses only links with a routable address) and, through
// resolvectl, the sidecar's address as the link's DNS server, the mesh
// domains as route-only domains (~cluster.local) and DefaultRoute=no.
// resolved then sends names under those domains to the sidecar and every
// other name to the servers it used before, never to the sidecar; the
// host's own servers (DHCP's, a global DNS= of the operator) are untouched,
// since the link is a scope of its own. Deleting the link restores the
// host's resolver exactly, and a reboot starts without it. The agent asks
// for it (Enable) only after the sidecar's DNS proxy has loaded istiod's
// name table (Ready), and every restart or stop of the sidecar deletes it
// first (Disable).
//
// Earlier versions wrote a global drop-in
// (/run/systemd/resolved.conf.d/onboarding-agent-mesh-dns.conf), which made
// the sidecar one of resolved's global servers: asked for every name, and
// sharing a scope with the operator's own global servers. Enable and
// Disable remove it.
package hostdns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

const (
	// DefaultLinkName is the sidecar's resolver link.
	DefaultLinkName = "mesh-dns0"
	// DefaultLinkAddress is the address the link carries: resolved ignores
	// a link without a routable address. A /32 in the link-local range,
	// apart from the addresses clouds serve metadata and DNS on
	// (169.254.169.x, 169.254.170.x); nothing listens on it. Configurable
	// (sidecar.dns.link.address) for a network that uses it.
	DefaultLinkAddress = "169.254.53.53/32"
	// LegacyDropIn is the global drop-in earlier versions wrote.
	LegacyDropIn = "/run/systemd/resolved.conf.d/onboarding-agent-mesh-dns.conf"
	// ResolvedUnit is systemd-resolved's unit.
	ResolvedUnit = "systemd-resolved.service"
	// LinkAlias marks the link as the agent's (ip link ... alias): the agent
	// never configures or deletes a link of that name without it, and the
	// package's removal deletes every link with it.
	LinkAlias = "onboarding-agent-mesh-dns"
	// ResolvedRuntimeDir exists while systemd-resolved runs.
	ResolvedRuntimeDir = "/run/systemd/resolve"
)

// Link is the sidecar's resolver link: its interface, the address it
// carries, the DNS server resolved sends the domains to, and the domains.
type Link struct {
	Name    string
	Address netip.Prefix
	Server  netip.AddrPort
	Domains []string
}

// linkName: an interface name short enough for the veth fallback's peer
// (Name+"p", at most 15 bytes), nothing resolvectl or ip reads as an option.
var linkName = regexp.MustCompile(`^[a-z][a-z0-9-]{0,12}[a-z0-9]$`)

// NewLink validates the link's configuration: an interface name, a host
// address (/32 or /128) that is not loopback, link-local IPv6 or multicast
// (resolved counts only routable addresses), a loopback ip:port for the
// sidecar's proxy, and at least one DNS subdomain. Nothing but a server and
// route-only domains can reach resolved, and no name outside them.
func NewLink(name, address, server string, domains []string) (Link, error) {
	if err := ValidLinkName(name); err != nil {
		return Link{}, err
	}
	p, err := ParseLinkAddress(address)
	if err != nil {
		return Link{}, err
	}
	ap, err := netip.ParseAddrPort(server)
	if err != nil || !ap.Addr().IsLoopback() || ap.Port() == 0 || ap.Addr().Zone() != "" {
		return Link{}, fmt.Errorf("mesh DNS: address %q must be a loopback ip:port", server)
	}
	if len(domains) == 0 {
		return Link{}, errors.New("mesh DNS: no domains to route")
	}
	l := Link{Name: name, Address: p, Server: ap}
	for _, d := range domains {
		d = strings.TrimSuffix(strings.ToLower(d), ".")
		if msgs := validation.IsDNS1123Subdomain(d); len(msgs) > 0 {
			return Link{}, fmt.Errorf("mesh DNS: domain %q: %s", d, strings.Join(msgs, "; "))
		}
		l.Domains = append(l.Domains, d)
	}
	return l, nil
}

// ValidLinkName checks the link's interface name.
func ValidLinkName(name string) error {
	if !linkName.MatchString(name) {
		return fmt.Errorf("mesh DNS: link name %q must be 2-14 lowercase letters, digits or '-', starting with a letter", name)
	}
	return nil
}

// ParseLinkAddress parses the link's address: one host address (/32 or
// /128) that resolved counts as routable.
func ParseLinkAddress(address string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(address)
	if err != nil || p.Bits() != p.Addr().BitLen() || p.Addr().IsLoopback() || p.Addr().IsMulticast() ||
		p.Addr().IsUnspecified() || (p.Addr().Is6() && p.Addr().IsLinkLocalUnicast()) || p.Addr().Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("mesh DNS: link address %q must be one host address (a.b.c.d/32 or an IPv6 /128), not loopback, IPv6 link-local or multicast", address)
	}
	return p, nil
}

// peer is the veth fallback's other end.
func (l Link) peer() string { return l.Name + "p" }

// Options are the commands Enable and Disable run.
type Options struct {
	// Run runs argv (ip, resolvectl, systemctl) and returns its combined
	// output. Required.
	Run func(ctx context.Context, argv ...string) ([]byte, error)
	// LegacyDropIn is removed by Enable and Disable. Default LegacyDropIn.
	LegacyDropIn string
}

func (o Options) run(ctx context.Context, argv ...string) error {
	out, err := o.Run(ctx, argv...)
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Enable creates the link if it is missing (a dummy interface, or where
// the kernel has no dummy driver a veth pair), gives it its address, brings
// it up and configures resolved for it: not a default route, no LLMNR,
// mDNS, DNSSEC or DNS over TLS (the sidecar speaks plain DNS on loopback),
// the domains route-only and, last, the sidecar's server, so that no step
// leaves a link that is a default route with the sidecar's server. If a
// step fails the link is deleted: the host's resolver is as it was. Every
// step is idempotent, so Enable also repairs a link that lost its
// settings. It returns whether it created the link.
func Enable(ctx context.Context, o Options, l Link) (bool, error) {
	if err := removeLegacy(ctx, o); err != nil {
		return false, err
	}
	exists, err := ownLink(ctx, o, l.Name)
	if err != nil {
		return false, err
	}
	if !exists {
		if err := createLink(ctx, o, l); err != nil {
			return false, err
		}
	}
	routes := make([]string, 0, len(l.Domains))
	for _, d := range l.Domains {
		routes = append(routes, "~"+d)
	}
	steps := [][]string{
		{"ip", "address", "replace", l.Address.String(), "dev", l.Name},
		{"ip", "link", "set", "dev", l.Name, "up"},
		{"resolvectl", "default-route", l.Name, "false"},
		{"resolvectl", "llmnr", l.Name, "false"},
		{"resolvectl", "mdns", l.Name, "false"},
		{"resolvectl", "dnssec", l.Name, "false"},
		{"resolvectl", "dnsovertls", l.Name, "false"},
		append([]string{"resolvectl", "domain", l.Name}, routes...),
		{"resolvectl", "dns", l.Name, l.Server.String()},
	}
	for _, s := range steps {
		if err := o.run(ctx, s...); err != nil {
			err = fmt.Errorf("mesh DNS link %s: %w", l.Name, err)
			if derr := o.run(ctx, "ip", "link", "delete", "dev", l.Name); derr != nil {
				err = fmt.Errorf("%w; deleting the link: %w", err, derr)
			}
			return false, err
		}
	}
	return !exists, nil
}

// createLink adds a dummy interface, or a veth pair (its peer up, so the
// link has carrier) where the dummy driver is missing.
func createLink(ctx context.Context, o Options, l Link) error {
	dummyErr := o.run(ctx, "ip", "link", "add", l.Name, "type", "dummy")
	if dummyErr != nil {
		if err := o.run(ctx, "ip", "link", "add", l.Name, "type", "veth", "peer", "name", l.peer()); err != nil {
			return fmt.Errorf("mesh DNS link %s: no dummy (%w) and no veth link (%w)", l.Name, dummyErr, err)
		}
		if err := o.run(ctx, "ip", "link", "set", "dev", l.peer(), "up"); err != nil {
			return fmt.Errorf("mesh DNS link %s: %w", l.Name, err)
		}
	}
	if err := o.run(ctx, "ip", "link", "set", "dev", l.Name, "alias", LinkAlias); err != nil {
		return fmt.Errorf("mesh DNS link %s: %w", l.Name, err)
	}
	return nil
}

// Disable deletes the link, if present (resolved forgets its settings with
// it), and the legacy drop-in. It returns whether anything was removed.
func Disable(ctx context.Context, o Options, l Link) (bool, error) {
	if err := removeLegacy(ctx, o); err != nil {
		return false, err
	}
	exists, err := ownLink(ctx, o, l.Name)
	if err != nil || !exists {
		return false, err
	}
	if err := o.run(ctx, "ip", "link", "delete", "dev", l.Name); err != nil {
		return false, fmt.Errorf("mesh DNS link %s: %w", l.Name, err)
	}
	return true, nil
}

// ownLink asks ip for the host's links and reports whether name is one;
// a link of that name without LinkAlias is someone else's, an error.
func ownLink(ctx context.Context, o Options, name string) (bool, error) {
	out, err := o.Run(ctx, "ip", "-o", "link", "show")
	if err != nil {
		return false, fmt.Errorf("ip -o link show: %w: %s", err, strings.TrimSpace(string(out)))
	}
	alias, ok := Links(out)[name]
	if ok && alias != LinkAlias {
		return false, fmt.Errorf("mesh DNS: a link named %s exists and is not the agent's (its alias is %q, not %s): choose another sidecar.dns.link.name", name, alias, LinkAlias)
	}
	return ok, nil
}

// Links parses `ip -o link show`: one line a link, "<index>: <name>[@<peer>]:
// <flags> ...", fields after "\" (ip's line continuation), one of them
// "alias <alias>". It returns each link's alias ("" for none).
func Links(out []byte) map[string]string {
	links := map[string]string{}
	for line := range strings.Lines(string(out)) {
		_, rest, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		ifname, rest, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		ifname, _, _ = strings.Cut(ifname, "@")
		alias := ""
		for _, field := range strings.Split(strings.TrimSpace(rest), "\\") {
			if a, ok := strings.CutPrefix(strings.TrimSpace(field), "alias "); ok {
				alias = a
			}
		}
		links[ifname] = alias
	}
	return links
}

// removeLegacy deletes an earlier version's global drop-in and, if there
// was one, restarts resolved so that it forgets it.
func removeLegacy(ctx context.Context, o Options) error {
	path := o.LegacyDropIn
	if path == "" {
		path = LegacyDropIn
	}
	switch err := os.Remove(path); {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return o.run(ctx, "systemctl", "try-reload-or-restart", ResolvedUnit)
}

// HasResolved reports whether systemd-resolved runs on this host (its
// runtime directory exists).
func HasResolved() bool {
	_, err := os.Stat(ResolvedRuntimeDir)
	return err == nil
}

// Ready reports whether the DNS proxy at addr has its name table: it asks
// for name (a name under a mesh domain) and takes any answer but a server
// failure, which is what pilot-agent answers before istiod's name table
// arrives, as ready. Found and not-found (the proxy forwarded an unknown
// name) are both ready; a timeout or refusal is not.
func Ready(ctx context.Context, addr, name string, timeout time.Duration) bool {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := r.LookupHost(ctx, strings.TrimSuffix(name, ".")+".")
	if err == nil {
		return true
	}
	var dnsErr *net.DNSError
	return errors.As(err, &dnsErr) && dnsErr.IsNotFound
}

// WaitReady polls Ready every interval until the proxy at addr has its
// name table (nil) or ctx ends (ctx's error): the agent points the host's
// resolver at the proxy only after it returns nil, so a proxy whose name
// table never arrives (standalone mode, istiod unreachable) never answers
// the host's mesh domains with SERVFAIL.
func WaitReady(ctx context.Context, addr, name string, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for !Ready(ctx, addr, name, interval) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
