package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	agentconfig "github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/agent/hostdns"
	"github.com/embark-mesh/embark/onboarding/agent/sidecar"
	"github.com/embark-mesh/embark/test/demo/check"
	"github.com/embark-mesh/embark/test/demo/dig"
	"github.com/embark-mesh/embark/test/demo/vm"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/resolved"
	"github.com/embark-mesh/embark/test/vmsim"
)

// The demo's mesh names on a VM (docs/dns.md): the VM's sidecar's DNS proxy
// answers the names in istiod's name table, relayed by Embark, and forwards
// every other name to the VM's usual resolver. This file holds the names'
// part of the demo.
const (
	// serviceEntryHost is the host of the operator's ServiceEntry, which
	// declares no address: istiod allocates one.
	serviceEntryHost = "api.payments.example"
	// serviceEntryDomain is its domain, which the VM's resolver routes to
	// the sidecar (sidecar.dns.domains).
	serviceEntryDomain = "payments.example"
	// outsideName is a name outside the mesh a VM resolves.
	outsideName = "sts.us-east-2.amazonaws.com"
)

var (
	// upstreamAnswer is what the VM's usual resolver, the demo's stand-in
	// for the VPC's, answers for every name outside cluster.local
	// (TEST-NET-1: nothing is reached through it).
	upstreamAnswer = netip.MustParseAddr("192.0.2.80")
	// allocatedRange is where istiod allocates ServiceEntry addresses
	// (PILOT_ENABLE_IP_AUTOALLOCATE), and writes into the status.
	allocatedRange = netip.MustParsePrefix("240.240.0.0/16")
)

// serviceEntryYAML is the operator's ServiceEntry: exported to the VM's
// namespace (it is in it), with the seed Sidecar's egress port, so that it
// is in the VM's name table (a Sidecar egress listener with a port imports
// only the hosts with that port).
var serviceEntryYAML = fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: payments-api
  namespace: bookinfo
spec:
  hosts:
  - %s
  location: MESH_EXTERNAL
  resolution: DNS
  ports:
  - number: %d
    name: http
    protocol: HTTP
`, serviceEntryHost, productpagePort)

// startUpstreamResolver gives v a usual resolver of its own: a DNS server of
// the demo on loopback, named by the resolv.conf v's pilot-agent reads.
func (d *demo) startUpstreamResolver(out io.Writer, v *vm.VM) error {
	if d.upstream == nil {
		u, err := dig.StartUpstream(upstreamAnswer)
		if err != nil {
			return err
		}
		d.upstream = u
	}
	v.ResolvConf = d.upstream.ResolvConf()
	fmt.Fprintf(out, "%s's usual resolver (the VPC's, simulated; it answers %s for names outside cluster.local): /etc/resolv.conf %s", v.Name, upstreamAnswer, v.ResolvConf)
	return nil
}

// resolveMeshNames shows v resolving, through its sidecar's DNS proxy, a
// Service's name (its ClusterIP) and an operator's ServiceEntry host (the
// address istiod allocated), both answered by the sidecar from its name
// table, and a name outside the mesh, answered by v's usual resolver.
func (d *demo) resolveMeshNames(ctx context.Context, out io.Writer, v *vm.VM) error {
	file := filepath.Join(d.work, "serviceentry.yaml")
	if err := os.WriteFile(file, []byte(serviceEntryYAML), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(out, "the operator's ServiceEntry (no addresses: istiod allocates one):\n$ cat %s\n%s", file, serviceEntryYAML)
	if err := d.kubectl(ctx, out, "apply", "-f", file); err != nil {
		return err
	}
	server, err := d.showDNSSettings(out, v)
	if err != nil {
		return err
	}
	svc := &corev1.Service{}
	if err := d.env.Client.Get(ctx, types.NamespacedName{Namespace: "bookinfo", Name: "productpage"}, svc); err != nil {
		return err
	}
	clusterIP, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		return fmt.Errorf("productpage's ClusterIP %q: %w", svc.Spec.ClusterIP, err)
	}
	fmt.Fprintln(out)
	if err := d.showChecked(ctx, out, func(s string) error { return check.Contains(s, clusterIP.String()) },
		"get", "service", "productpage", "-n", "bookinfo"); err != nil {
		return err
	}
	allocated, err := d.showAllocated(ctx, out)
	if err != nil {
		return err
	}
	meshNames := []struct {
		name, want string
		addr       netip.Addr
	}{
		{"productpage.bookinfo.svc.cluster.local", "its ClusterIP " + clusterIP.String(), clusterIP},
		{serviceEntryHost, "the address istiod allocated, " + allocated.String(), allocated},
	}
	for _, n := range meshNames {
		fmt.Fprintln(out)
		if err := showAnswer(ctx, out, server, n.name, "the sidecar answers from its name table (aa), "+n.want, func(r dig.Response) bool {
			return r.Header.RCode == dnsmessage.RCodeSuccess && r.Authoritative() && slices.Equal(r.Addrs(), []netip.Addr{n.addr})
		}); err != nil {
			return err
		}
	}
	fmt.Fprintln(out)
	if err := showAnswer(ctx, out, server, outsideName, fmt.Sprintf("the sidecar forwards it: the usual resolver's answer %s, not authoritative", upstreamAnswer), func(r dig.Response) bool {
		return r.Header.RCode == dnsmessage.RCodeSuccess && !r.Authoritative() && slices.Equal(r.Addrs(), []netip.Addr{upstreamAnswer})
	}); err != nil {
		return err
	}
	if err := d.checkUpstreamAsked(out, outsideName, meshNames[0].name, meshNames[1].name); err != nil {
		return err
	}
	return d.resolveThroughHostResolver(ctx, out, v, server, []netip.Addr{clusterIP, allocated})
}

// resolveThroughHostResolver shows v's own resolver, Debian's real
// systemd-resolved (in a network namespace of the demo's: the demo's VMs
// share this machine's), configured with the commands the agent's root
// service runs on dns-on: a link of the sidecar's own carrying the mesh
// domains, route-only. Programs on v ask resolved's stub; mesh names reach
// the sidecar, every other name v's uplink server (a relay to the usual
// resolver), never the sidecar. The sidecar's DNS proxy runs in this
// machine's namespace: a relay at its address on v joins the two.
func (d *demo) resolveThroughHostResolver(ctx context.Context, out io.Writer, v *vm.VM, sidecarDNS string, want []netip.Addr) error {
	uplink := "127.0.0.78"
	h, err := resolved.New(ctx, resolved.Options{UplinkDNS: []string{uplink}})
	if err != nil {
		return err
	}
	defer h.Close()
	up, err := h.RelayUDP(uplink+":53", netip.AddrPortFrom(d.upstream.Addr, 53).String())
	if err != nil {
		return err
	}
	defer up.Close()
	side, err := h.RelayUDP(sidecarDNS, sidecarDNS)
	if err != nil {
		return err
	}
	defer side.Close()
	fmt.Fprintf(out, "\n%s's own resolver: systemd-resolved (real), its uplink's server %s; the agent's root service, once the sidecar answers (dns-on), runs:\n", v.Name, uplink)
	link, err := hostdns.NewLink(hostdns.DefaultLinkName, hostdns.DefaultLinkAddress, sidecarDNS, []string{"cluster.local", serviceEntryDomain})
	if err != nil {
		return err
	}
	run := func(ctx context.Context, argv ...string) ([]byte, error) {
		if argv[0] != "ip" || argv[1] != "-o" { // ip -o link show: how it finds its link
			fmt.Fprintf(out, "# %s\n", strings.Join(argv, " "))
		}
		return h.Run(ctx, argv...)
	}
	if _, err := hostdns.Enable(ctx, hostdns.Options{Run: run, LegacyDropIn: filepath.Join(d.work, "no-legacy-drop-in")}, link); err != nil {
		return err
	}
	if err := showCommand(ctx, out, h, nil, "resolvectl", "status", link.Name); err != nil {
		return err
	}
	names := []string{"productpage.bookinfo.svc.cluster.local", serviceEntryHost}
	for i, name := range names {
		if err := showCommand(ctx, out, h, func(s string) error { return check.Contains(s, want[i].String()) }, "resolvectl", "query", "--cache=no", name); err != nil {
			return err
		}
	}
	if err := showCommand(ctx, out, h, func(s string) error { return check.Contains(s, upstreamAnswer.String()) }, "resolvectl", "query", "--cache=no", outsideName); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nthe sidecar was asked through the link for: %s %d, %s %d, %s %d\n", names[0], side.Asked(names[0]), names[1], side.Asked(names[1]), outsideName, side.Asked(outsideName))
	if side.Asked(names[0]) == 0 || side.Asked(names[1]) == 0 {
		return errors.New("the mesh names were answered without asking the sidecar")
	}
	if side.Asked(outsideName) != 0 {
		return fmt.Errorf("the sidecar was asked for %s, a name outside the mesh domains", outsideName)
	}
	return nil
}

// showCommand runs argv on h's resolver host, shows it and its output, and
// checks the output with ok (nil: any) until it passes or the demo's wait
// ends.
func showCommand(ctx context.Context, out io.Writer, h *resolved.Host, ok func(string) error, argv ...string) error {
	var last []byte
	var lastErr error
	err := fixtures.Poll(ctx, pollInterval, waitFor, func() error {
		last, lastErr = h.Run(ctx, argv...)
		if lastErr != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), lastErr, last)
		}
		if ok != nil {
			return ok(string(last))
		}
		return nil
	})
	fmt.Fprintf(out, "\n$ %s\n%s", strings.Join(argv, " "), last)
	return err
}

// showAllocated waits until istiod has allocated the ServiceEntry an
// address (its status), shows it and returns it.
func (d *demo) showAllocated(ctx context.Context, out io.Writer) (netip.Addr, error) {
	var allocated netip.Addr
	err := d.showChecked(ctx, out, func(s string) error {
		t, err := check.ParseTable(s)
		if err != nil {
			return err
		}
		col, err := t.Column("NAME", "ADDRESS")
		if err != nil {
			return err
		}
		// istiod allocates an IPv4 and an IPv6 address; a VM asking for
		// A records gets the IPv4 one.
		for _, a := range strings.Split(col["payments-api"], ",") {
			if addr, err := netip.ParseAddr(a); err == nil && allocatedRange.Contains(addr) {
				allocated = addr
				return nil
			}
		}
		return fmt.Errorf("ServiceEntry payments-api has addresses %q, want one istiod allocated in %s", col["payments-api"], allocatedRange)
	}, "get", "serviceentry", "payments-api", "-n", "bookinfo", "-o", "custom-columns=NAME:.metadata.name,HOSTS:.spec.hosts,ADDRESS:.status.addresses[*].value")
	return allocated, err
}

// showDNSSettings shows the DNS lines of the cluster.env the onboarding
// agent wrote for v, checks them, and returns where v's DNS proxy listens.
func (d *demo) showDNSSettings(out io.Writer, v *vm.VM) (string, error) {
	data, err := os.ReadFile(filepath.Join(v.Root, vmsim.ClusterEnv))
	if err != nil {
		return "", err
	}
	fmt.Fprintf(out, "\n%s: the DNS settings its onboarding agent wrote for the sidecar:\n$ grep DNS /%s\n%s\n", v.Name, vmsim.ClusterEnv, vm.GrepLines(string(data), "DNS"))
	env, err := sidecar.ParseClusterEnv(data)
	if err != nil {
		return "", err
	}
	if env["ISTIO_META_DNS_CAPTURE"] != "true" || env["DNS_PROXY_ADDR"] != agentconfig.DefaultDNSAddress {
		return "", fmt.Errorf("cluster.env has ISTIO_META_DNS_CAPTURE=%q DNS_PROXY_ADDR=%q, want true and %s", env["ISTIO_META_DNS_CAPTURE"], env["DNS_PROXY_ADDR"], agentconfig.DefaultDNSAddress)
	}
	server := v.DNSAddr()
	if server == "" {
		return "", fmt.Errorf("%s's sidecar runs no DNS proxy", v.Name)
	}
	fmt.Fprintf(out, "the simulated VMs share this machine's loopback, so %s's pilot-agent listens for %s on a port of its own: %s\n", v.Name, agentconfig.DefaultDNSAddress, server)
	return server, nil
}

// showAnswer asks server for name until ok accepts the response, then shows
// the query and the response as dig prints them.
func showAnswer(ctx context.Context, out io.Writer, server, name, want string, ok func(dig.Response) bool) error {
	var last dig.Response
	var lastErr error
	err := fixtures.Poll(ctx, pollInterval, waitFor, func() error {
		r, err := dig.Query(ctx, server, name)
		if err != nil {
			lastErr = err
			return err
		}
		last, lastErr = r, nil
		if !ok(r) {
			return fmt.Errorf("%s: %s %v (aa=%v), want %s", name, r.Header.RCode, r.Addrs(), r.Authoritative(), want)
		}
		return nil
	})
	fmt.Fprintf(out, "$ %s\n", dig.Command(server, name))
	if lastErr != nil {
		fmt.Fprintf(out, ";; %v\n", lastErr)
	} else {
		fmt.Fprint(out, last.String())
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "(%s)\n", want)
	return nil
}

// checkUpstreamAsked checks that the VM's usual resolver was asked for
// outside and never for any of mesh, and shows what it was asked.
func (d *demo) checkUpstreamAsked(out io.Writer, outside string, mesh ...string) error {
	asked := d.upstream.Asked()
	fmt.Fprintf(out, "\nthe usual resolver (%s:53) was asked for: %s\n", d.upstream.Addr, strings.Join(slices.Compact(slices.Sorted(slices.Values(asked))), " "))
	if !slices.Contains(asked, outside+".") {
		return fmt.Errorf("the usual resolver was never asked for %s: the sidecar answered it itself", outside)
	}
	for _, n := range mesh {
		if slices.Contains(asked, n+".") {
			return fmt.Errorf("the usual resolver was asked for the mesh name %s: the sidecar should answer it from its name table", n)
		}
	}
	return nil
}
