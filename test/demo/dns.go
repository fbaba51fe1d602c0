package main

import (
	"context"
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
	"github.com/embark-mesh/embark/onboarding/agent/sidecar"
	"github.com/embark-mesh/embark/test/demo/check"
	"github.com/embark-mesh/embark/test/demo/dig"
	"github.com/embark-mesh/embark/test/demo/vm"
	"github.com/embark-mesh/embark/test/fixtures"
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
	return d.checkUpstreamAsked(out, outsideName, meshNames[0].name, meshNames[1].name)
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
