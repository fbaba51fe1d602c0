// Package hostdns points the VM's resolver at the sidecar's DNS proxy for
// the mesh's domains only, and takes it away again, with no iptables.
//
// On a host running systemd-resolved the root-run
// onboarding-agent-sidecar.service writes a runtime drop-in,
// /run/systemd/resolved.conf.d/onboarding-agent-mesh-dns.conf, that names
// the sidecar's address as a DNS server with route-only domains
// (Domains=~cluster.local): resolved sends names under those domains to the
// sidecar and to no other server. The drop-in lives under /run, so a host
// that reboots starts without it and gets it back only once its sidecar
// answers again; removing it (and reloading resolved) restores the host's
// resolver exactly. The agent asks for it (Enable) only after the sidecar's
// DNS proxy has loaded istiod's name table (Ready), and every restart or
// stop of the sidecar removes it first (Disable).
package hostdns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// DefaultDropInDir and DropInName locate the resolved drop-in.
const (
	DefaultDropInDir = "/run/systemd/resolved.conf.d"
	DropInName       = "onboarding-agent-mesh-dns.conf"
	// ResolvedUnit is systemd-resolved's unit, reloaded after a change.
	ResolvedUnit = "systemd-resolved.service"
)

// header opens every drop-in Render writes.
const header = "# Written by onboarding-agent-sidecar.service while the Istio sidecar answers DNS.\n" +
	"# Removed when the sidecar stops or restarts. Do not edit: see docs/dns.md.\n"

// Render renders the resolved drop-in that sends the names under domains
// (route-only) to the DNS server at addr (ip:port). It refuses an address
// that is not a loopback ip:port and a domain that is not a DNS subdomain,
// so nothing but a server and route-only domains reaches resolved.
func Render(addr string, domains []string) ([]byte, error) {
	ap, err := validAddress(addr)
	if err != nil {
		return nil, err
	}
	if len(domains) == 0 {
		return nil, errors.New("mesh DNS: no domains to route")
	}
	routes := make([]string, 0, len(domains))
	for _, d := range domains {
		d = strings.TrimSuffix(strings.ToLower(d), ".")
		if msgs := validation.IsDNS1123Subdomain(d); len(msgs) > 0 {
			return nil, fmt.Errorf("mesh DNS: domain %q: %s", d, strings.Join(msgs, "; "))
		}
		routes = append(routes, "~"+d)
	}
	return fmt.Appendf(nil, "%s[Resolve]\nDNS=%s\nDomains=%s\n", header, ap, strings.Join(routes, " ")), nil
}

// validAddress: a loopback IP and a port, as the agent's configuration
// admits for the sidecar's DNS proxy.
func validAddress(addr string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().IsLoopback() || ap.Port() == 0 || ap.Addr().Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("mesh DNS: address %q must be a loopback ip:port", addr)
	}
	return ap, nil
}

// Options configures Enable and Disable.
type Options struct {
	// Dir is the resolved drop-in directory. Default DefaultDropInDir.
	Dir string
	// Reload reloads (or restarts) systemd-resolved after a change; called
	// only when the drop-in changed. Required.
	Reload func(ctx context.Context) error
}

func (o Options) path() string {
	dir := o.Dir
	if dir == "" {
		dir = DefaultDropInDir
	}
	return filepath.Join(dir, DropInName)
}

// Enable installs the drop-in (content from Render) and reloads resolved
// when it changed. It does nothing on a host without systemd-resolved (no
// /run/systemd/resolve): such a host is configured as docs/dns.md says.
func Enable(ctx context.Context, o Options, content []byte, hasResolved bool) (bool, error) {
	if !hasResolved {
		return false, nil
	}
	p := o.path()
	if old, err := os.ReadFile(p); err == nil && string(old) == string(content) {
		return false, nil
	}
	if err := writeAtomic(p, content); err != nil {
		return false, err
	}
	if err := o.Reload(ctx); err != nil {
		return true, fmt.Errorf("reload %s: %w", ResolvedUnit, err)
	}
	return true, nil
}

// Disable removes the drop-in, if present, and reloads resolved.
func Disable(ctx context.Context, o Options) (bool, error) {
	err := os.Remove(o.path())
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("remove %s: %w", o.path(), err)
	}
	if err := o.Reload(ctx); err != nil {
		return true, fmt.Errorf("reload %s: %w", ResolvedUnit, err)
	}
	return true, nil
}

// HasResolved reports whether systemd-resolved runs on this host (its
// runtime directory exists).
func HasResolved() bool {
	_, err := os.Stat("/run/systemd/resolve")
	return err == nil
}

func writeAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
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
