package translate

import (
	"fmt"
	"sort"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/embark-mesh/embark/translate/internal/envoyconf"
	"github.com/embark-mesh/embark/translate/selection"
)

// ExportToAnnotation is Istio's Service annotation restricting which
// namespaces see the Service.
const ExportToAnnotation = "networking.istio.io/exportTo"

// destination is one port of a Service or ServiceEntry host an egress
// listener selected.
type destination struct {
	host    string // FQDN of a Service, or a ServiceEntry host
	ns      string
	port    uint32
	proto   protocol
	svc     *corev1.Service
	svcPort corev1.ServicePort
	se      *istionetworkingv1.ServiceEntry
	sePort  *networkingv1alpha3.ServicePort
}

func (d destination) clusterName() string { return OutboundClusterName(d.port, d.host) }

// servicePortProtocol infers a Service port's protocol the way Istio does:
// appProtocol, else the name's prefix before "-", else TCP.
func servicePortProtocol(p corev1.ServicePort) protocol {
	if p.AppProtocol != nil {
		if pr, ok := parseProtocol(*p.AppProtocol); ok {
			return pr
		}
	}
	prefix, _, _ := strings.Cut(p.Name, "-")
	if pr, ok := parseProtocol(prefix); ok {
		return pr
	}
	return "TCP"
}

// destinations lists every Service and ServiceEntry port visible to the
// workload and selected by forms, sorted by port, then host. port 0 means
// any port.
func (b *builder) destinations(forms []HostForm, port uint32) []destination {
	wlNS := b.in.Workload.Namespace
	selected := func(host, ns string) bool {
		for _, f := range forms {
			if f.Matches(host, ns, wlNS) {
				return true
			}
		}
		return false
	}
	var out []destination
	for _, svc := range b.in.Services {
		if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		var exportTo []string
		if a := svc.Annotations[ExportToAnnotation]; a != "" {
			exportTo = strings.Split(a, ",")
		}
		if !selection.ExportedTo(exportTo, svc.Namespace, wlNS) {
			continue
		}
		host := fmt.Sprintf("%s.%s.svc.%s", svc.Name, svc.Namespace, b.suffix)
		if !selected(host, svc.Namespace) {
			continue
		}
		for _, sp := range svc.Spec.Ports {
			if sp.Protocol != "" && sp.Protocol != corev1.ProtocolTCP {
				continue
			}
			if port != 0 && uint32(sp.Port) != port {
				continue
			}
			out = append(out, destination{host: host, ns: svc.Namespace, port: uint32(sp.Port), proto: servicePortProtocol(sp), svc: svc, svcPort: sp})
		}
	}
	for _, se := range b.in.ServiceEntries {
		if se == nil || !selection.ExportedTo(se.Spec.GetExportTo(), se.Namespace, wlNS) {
			continue
		}
		for _, host := range se.Spec.GetHosts() {
			if !selected(host, se.Namespace) {
				continue
			}
			for _, sp := range se.Spec.GetPorts() {
				if port != 0 && sp.GetNumber() != port {
					continue
				}
				pr, ok := parseProtocol(sp.GetProtocol())
				if !ok {
					pr = "TCP"
				}
				out = append(out, destination{host: strings.ToLower(host), ns: se.Namespace, port: sp.GetNumber(), proto: pr, se: se, sePort: sp})
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].port != out[j].port {
			return out[i].port < out[j].port
		}
		if out[i].host != out[j].host {
			return out[i].host < out[j].host
		}
		return out[i].ns < out[j].ns
	})
	// The same host and port from two objects (two ServiceEntries, or a
	// ServiceEntry naming a Service's host): the first in order wins.
	dedup := out[:0]
	seen := map[string]bool{}
	for _, d := range out {
		if seen[d.clusterName()] {
			b.warn("%s is defined more than once; using the one of namespace %s", d.clusterName(), nsOf(dedup, d.clusterName()))
			continue
		}
		seen[d.clusterName()] = true
		dedup = append(dedup, d)
	}
	return dedup
}

func nsOf(ds []destination, cluster string) string {
	for _, d := range ds {
		if d.clusterName() == cluster {
			return d.ns
		}
	}
	return ""
}

func (b *builder) egress(sc *istionetworkingv1.Sidecar) error {
	type portless struct {
		field string
		bind  string
		forms []HostForm
	}
	var later []portless
	for i, eg := range sc.Spec.GetEgress() {
		field := fmt.Sprintf("spec.egress[%d]", i)
		bind := DefaultEgressBind
		if eg.GetBind() != "" {
			bind = eg.GetBind()
			if _, err := parseIP(bind); err != nil {
				return b.fail(field+".bind", "%q is not an IP address", bind)
			}
		}
		if len(eg.GetHosts()) == 0 {
			return b.fail(field+".hosts", "is required")
		}
		forms := make([]HostForm, 0, len(eg.GetHosts()))
		for j, h := range eg.GetHosts() {
			f, err := ParseHostForm(h)
			if err != nil {
				return b.fail(fmt.Sprintf("%s.hosts[%d]", field, j), "%s", err.Error())
			}
			forms = append(forms, f)
		}
		port := eg.GetPort()
		if port == nil {
			later = append(later, portless{field: field, bind: bind, forms: forms})
			continue
		}
		if port.GetNumber() == 0 || port.GetNumber() > 65535 {
			return b.fail(field+".port.number", "%d is not a port number", port.GetNumber())
		}
		proto, ok := parseProtocol(port.GetProtocol())
		if !ok {
			return b.fail(field+".port.protocol", "%q is not one of HTTP, HTTP2, GRPC, GRPC-WEB, TCP, TLS, HTTPS, MONGO, MYSQL, REDIS", port.GetProtocol())
		}
		if err := b.claim(bind, port.GetNumber(), field); err != nil {
			return err
		}
		b.egressListener(field, bind, port.GetNumber(), proto, b.destinations(forms, port.GetNumber()))
	}
	// Egress listeners without a port get one listener per port of what
	// their hosts select, after the listeners with ports claimed theirs.
	for _, pl := range later {
		byPort := map[uint32][]destination{}
		var ports []uint32
		for _, d := range b.destinations(pl.forms, 0) {
			if _, ok := byPort[d.port]; !ok {
				ports = append(ports, d.port)
			}
			byPort[d.port] = append(byPort[d.port], d)
		}
		sort.Slice(ports, func(i, j int) bool { return ports[i] < ports[j] })
		for _, p := range ports {
			if prev, taken := b.bound[listenerKey(pl.bind, p)]; taken {
				b.warn("%s: port %d on %s is already used by %s; left out", pl.field, p, pl.bind, prev)
				continue
			}
			b.bound[listenerKey(pl.bind, p)] = pl.field
			b.egressListener(pl.field, pl.bind, p, commonProtocol(byPort[p]), byPort[p])
		}
	}
	return nil
}

// commonProtocol is HTTP2 when every destination speaks HTTP/2 or gRPC,
// HTTP when every one speaks some HTTP, TCP otherwise.
func commonProtocol(ds []destination) protocol {
	allHTTP, allH2 := true, true
	for _, d := range ds {
		allHTTP = allHTTP && d.proto.isHTTP()
		allH2 = allH2 && d.proto.isHTTP2()
	}
	switch {
	case allH2:
		return "HTTP2"
	case allHTTP:
		return "HTTP"
	}
	return "TCP"
}

func (b *builder) egressListener(field, bind string, port uint32, proto protocol, dests []destination) {
	name := listenerName(bind, port)
	var filter *listenerv3.Filter
	if proto.isHTTP() {
		rc := &routev3.RouteConfiguration{Name: name}
		claimed := map[string]string{}
		for _, d := range dests {
			vh := &routev3.VirtualHost{Name: fmt.Sprintf("%s:%d", d.host, port)}
			for _, dom := range b.domains(d) {
				if prev, dup := claimed[dom]; dup {
					b.warn("%s: domain %q of %s is already routed to %s; left out", field, dom, d.host, prev)
					continue
				}
				claimed[dom] = d.host
				vh.Domains = append(vh.Domains, dom)
			}
			if len(vh.Domains) == 0 {
				continue
			}
			cluster := b.outboundCluster(d)
			if cluster == "" {
				continue
			}
			vh.Routes = []*routev3.Route{envoyconf.RouteTo(cluster)}
			rc.VirtualHosts = append(rc.VirtualHosts, vh)
		}
		b.routes[name] = rc
		m := &hcmv3.HttpConnectionManager{
			StatPrefix: "outbound_" + name,
			CodecType:  hcmv3.HttpConnectionManager_AUTO,
			RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
				ConfigSource:    envoyconf.ADSSource(),
				RouteConfigName: name,
			}},
			HttpFilters: []*hcmv3.HttpFilter{envoyconf.RouterFilter()},
		}
		filter = &listenerv3.Filter{Name: wellknown.HTTPConnectionManager, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: envoyconf.MustAny(m)}}
	} else {
		switch len(dests) {
		case 1:
			cluster := b.outboundCluster(dests[0])
			if cluster == "" {
				return
			}
			filter = envoyconf.TCPProxy("outbound|"+name, cluster)
		case 0:
			b.warn("%s: no Service or ServiceEntry selected by its hosts has port %d; no listener on %s", field, port, name)
			return
		default:
			if proto == "TLS" || proto == "HTTPS" {
				b.sniListener(field, bind, port, dests)
				return
			}
			hosts := make([]string, 0, len(dests))
			for _, d := range dests {
				hosts = append(hosts, d.host)
			}
			b.warn("%s: %s port %d has %d destinations (%s); a TCP listener needs exactly one, no listener on %s", field, proto, port, len(dests), strings.Join(hosts, ", "), name)
			return
		}
	}
	b.listeners[name] = &listenerv3.Listener{
		Name:             name,
		Address:          envoyconf.SocketAddress(bind, port),
		TrafficDirection: corev3.TrafficDirection_OUTBOUND,
		FilterChains:     []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{filter}}},
	}
}

// domains are the names an application may use for the destination, each
// with and without ":<port>". A Service's short name is only offered to
// workloads of its own namespace.
func (b *builder) domains(d destination) []string {
	var names []string
	if d.svc != nil {
		if d.ns == b.in.Workload.Namespace {
			names = append(names, d.svc.Name)
		}
		names = append(names,
			d.svc.Name+"."+d.ns,
			d.svc.Name+"."+d.ns+".svc",
			d.host)
	} else {
		names = []string{d.host}
	}
	out := make([]string, 0, 2*len(names))
	for _, n := range names {
		out = append(out, n, fmt.Sprintf("%s:%d", n, d.port))
	}
	return out
}

// sniListener serves a TLS port with several destinations: the client's
// TLS server name (read by tls_inspector) picks the destination, among the
// names without port an application uses for it. Connections without a
// known server name match no chain and are closed.
func (b *builder) sniListener(field, bind string, port uint32, dests []destination) {
	name := listenerName(bind, port)
	claimed := map[string]string{}
	var chains []*listenerv3.FilterChain
	for _, d := range dests {
		var names []string
		for _, dom := range b.domains(d) {
			if strings.Contains(dom, ":") {
				continue
			}
			if prev, dup := claimed[dom]; dup {
				b.warn("%s: server name %q of %s is already routed to %s; left out", field, dom, d.host, prev)
				continue
			}
			claimed[dom] = d.host
			names = append(names, dom)
		}
		if len(names) == 0 {
			continue
		}
		cluster := b.outboundCluster(d)
		if cluster == "" {
			continue
		}
		chains = append(chains, &listenerv3.FilterChain{
			Name:             cluster,
			FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: names},
			Filters:          []*listenerv3.Filter{envoyconf.TCPProxy("outbound|"+name, cluster)},
		})
	}
	if len(chains) == 0 {
		b.warn("%s: no destination on TLS port %d has a usable server name; no listener on %s", field, port, name)
		return
	}
	b.listeners[name] = &listenerv3.Listener{
		Name:             name,
		Address:          envoyconf.SocketAddress(bind, port),
		TrafficDirection: corev3.TrafficDirection_OUTBOUND,
		ListenerFilters:  []*listenerv3.ListenerFilter{envoyconf.TLSInspector()},
		FilterChains:     chains,
	}
}
