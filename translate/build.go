package translate

import (
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/embark-mesh/embark/translate/endpoints"
	"github.com/embark-mesh/embark/translate/internal/envoyconf"
	"github.com/embark-mesh/embark/translate/selection"
)

// DefaultEgressBind is where egress listeners bind when a Sidecar egress
// listener has no bind: onboarded VMs run without iptables, so the
// application reaches the mesh on 127.0.0.2.
const DefaultEgressBind = "127.0.0.2"

// Translate computes the workload's configuration. It returns a
// *SidecarError (naming the Sidecar and the field) when the selected
// Sidecar cannot be translated; callers keep serving the previous
// configuration and report the error on the Sidecar. With no Sidecar the
// result is empty (see docs/translate.md).
func Translate(in *Inputs) (*Result, error) {
	if in == nil {
		in = &Inputs{}
	}
	b := newBuilder(in)
	sc := selectSidecar(in.Sidecars, in.Workload, b.root)
	res := &Result{Sidecar: sc, Unenforced: b.authz.unenforced}
	if sc == nil {
		return res, nil
	}
	b.sidecarName = sc.Namespace + "/" + sc.Name
	b.warnIgnored(sc)
	if err := b.ingress(sc); err != nil {
		return nil, err
	}
	if err := b.egress(sc); err != nil {
		return nil, err
	}
	b.finish(res)
	return res, nil
}

type builder struct {
	in          *Inputs
	root        string
	trust       string
	suffix      string
	sidecarName string
	// authz is the inbound authorization every ingress chain enforces.
	authz *authz

	listeners map[string]*listenerv3.Listener
	routes    map[string]*routev3.RouteConfiguration
	clusters  map[string]*clusterv3.Cluster
	endpoints map[string]*endpointv3.ClusterLoadAssignment
	warnings  []string
	// bound maps "<ip>:<port>" to the field that claimed it.
	bound map[string]string
	// record, when set, gets every claim in order (Prepare).
	record *[]claimed
	// eps are the endpoints of the destinations egress selects.
	eps *endpoints.Index
	// chains are ingress filter chains already built for the scope
	// (Shared.For); read only.
	chains map[inboundChainKey][]*listenerv3.FilterChain
	// inbound are the other parts of the ingress listeners built once for
	// the scope (Shared.For); nil: built for each workload.
	inbound *inboundParts
}

// inboundParts are the parts of a scope's ingress listeners and inbound
// clusters that do not depend on the workload, built once (Prepare) and
// shared by every workload's (Shared.For). Read only.
type inboundParts struct {
	// tlsInspector is the listener filter of the listeners accepting mTLS.
	tlsInspector *listenerv3.ListenerFilter
	// clusters are the inbound clusters by ingress index, for the ingress
	// listeners whose defaultEndpoint does not name the workload's own
	// address (0.0.0.0); nil for the others and for invalid ones.
	clusters []*clusterv3.Cluster
}

func newBuilder(in *Inputs) *builder {
	b := &builder{
		in:        in,
		root:      in.RootNamespace,
		trust:     in.Mesh.TrustDomain,
		suffix:    in.Mesh.DomainSuffix,
		listeners: map[string]*listenerv3.Listener{},
		routes:    map[string]*routev3.RouteConfiguration{},
		clusters:  map[string]*clusterv3.Cluster{},
		endpoints: map[string]*endpointv3.ClusterLoadAssignment{},
		bound:     map[string]string{},
		eps:       in.Endpoints,
	}
	if b.eps == nil {
		b.eps = endpoints.NewIndex(in.EndpointSlices, in.Pods, in.WorkloadEntries)
	}
	if b.root == "" {
		b.root = DefaultRootNamespace
	}
	if b.trust == "" {
		b.trust = "cluster.local"
	}
	if b.suffix == "" {
		b.suffix = "cluster.local"
	}
	b.authz = newAuthz(in, b.root)
	return b
}

func (b *builder) fail(field, format string, args ...any) error {
	return &SidecarError{Sidecar: b.sidecarName, Field: field, Reason: fmt.Sprintf(format, args...)}
}

func (b *builder) warn(format string, args ...any) {
	b.warnings = append(b.warnings, fmt.Sprintf(format, args...))
}

// protocol is a Sidecar or Service port protocol, upper-cased.
type protocol string

func (p protocol) isHTTP() bool {
	return p == "HTTP" || p == "HTTP2" || p == "GRPC" || p == "GRPC-WEB"
}
func (p protocol) isHTTP2() bool { return p == "HTTP2" || p == "GRPC" }

// parseProtocol accepts the protocols translation supports.
func parseProtocol(s string) (protocol, bool) {
	p := protocol(strings.ToUpper(s))
	switch p {
	case "HTTP", "HTTP2", "GRPC", "GRPC-WEB", "TCP", "TLS", "HTTPS", "MONGO", "MYSQL", "REDIS":
		return p, true
	}
	return "", false
}

func (b *builder) claim(ip string, port uint32, field string) error {
	key := listenerKey(ip, port)
	if b.record != nil {
		*b.record = append(*b.record, claimed{key: key, field: field, ip: ip, port: port})
	}
	if prev, ok := b.bound[key]; ok {
		return b.fail(field, "%s is already used by %s", key, prev)
	}
	b.bound[key] = field
	return nil
}

func listenerKey(ip string, port uint32) string {
	return net.JoinHostPort(ip, strconv.Itoa(int(port)))
}

func listenerName(ip string, port uint32) string { return fmt.Sprintf("%s_%d", ip, port) }

// InboundClusterName is Istio's name of the cluster forwarding an ingress
// port to the application.
func InboundClusterName(port uint32) string { return fmt.Sprintf("inbound|%d||", port) }

// OutboundClusterName is Istio's name of the cluster of a destination
// host's port.
func OutboundClusterName(port uint32, host string) string {
	return fmt.Sprintf("outbound|%d||%s", port, host)
}

func (b *builder) ingress(sc *istionetworkingv1.Sidecar) error {
	for i, ing := range sc.Spec.GetIngress() {
		field := "spec.ingress[" + strconv.Itoa(i) + "]"
		port := ing.GetPort()
		if port == nil {
			return b.fail(field+".port", "is required")
		}
		if port.GetNumber() == 0 || port.GetNumber() > 65535 {
			return b.fail(field+".port.number", "%d is not a port number", port.GetNumber())
		}
		proto, ok := parseProtocol(port.GetProtocol())
		if !ok {
			return b.fail(field+".port.protocol", "%q is not one of HTTP, HTTP2, GRPC, GRPC-WEB, TCP, TLS, HTTPS, MONGO, MYSQL, REDIS", port.GetProtocol())
		}
		bind := b.in.Workload.Address
		if ing.GetBind() != "" {
			bind = ing.GetBind()
			if _, err := parseIP(bind); err != nil {
				return b.fail(field+".bind", "%q is not an IP address", bind)
			}
		}
		if _, err := parseIP(bind); err != nil {
			return fmt.Errorf("workload %s/%s has no IP address to bind ingress %s to (%q)", b.in.Workload.Namespace, b.in.Workload.Name, field, bind)
		}
		c := b.preparedCluster(i)
		if c == nil {
			var err error
			if c, err = b.inboundCluster(ing, proto); err != nil {
				return b.fail(field+".defaultEndpoint", "%s", err.Error())
			}
		}
		if err := b.claim(bind, port.GetNumber(), field); err != nil {
			return err
		}
		if _, dup := b.clusters[c.Name]; dup {
			return b.fail(field+".port.number", "port %d is declared by two ingress listeners", port.GetNumber())
		}
		b.clusters[c.Name] = c

		mode := selection.PeerAuthMode(b.in.PeerAuthentications, b.in.Workload.Namespace, b.in.Workload.Labels, b.root, port.GetNumber())
		chains := b.inboundChains(proto, port.GetNumber(), mode)
		l := &listenerv3.Listener{
			Name:             listenerName(bind, port.GetNumber()),
			Address:          envoyconf.SocketAddress(bind, port.GetNumber()),
			TrafficDirection: corev3.TrafficDirection_INBOUND,
			FilterChains:     chains,
		}
		if mode != MTLSDisable {
			l.ListenerFilters = []*listenerv3.ListenerFilter{b.tlsInspector()}
		}
		b.listeners[l.Name] = l
	}
	return nil
}

// inboundCluster is the cluster forwarding ing's port to its
// defaultEndpoint; the error says what is wrong with the defaultEndpoint.
func (b *builder) inboundCluster(ing *networkingv1alpha3.IstioIngressListener, proto protocol) (*clusterv3.Cluster, error) {
	upstream, err := b.defaultEndpoint(ing.GetDefaultEndpoint())
	if err != nil {
		return nil, err
	}
	name := InboundClusterName(ing.GetPort().GetNumber())
	c := envoyconf.BaseCluster(name, clusterv3.Cluster_STATIC)
	c.LoadAssignment = &endpointv3.ClusterLoadAssignment{
		ClusterName: name,
		Endpoints:   []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{envoyconf.LBEndpoint(upstream, 0)}}},
	}
	if proto.isHTTP2() {
		c.TypedExtensionProtocolOptions = envoyconf.HTTP2Options()
	}
	return c, nil
}

// preparedCluster is the scope's inbound cluster of ingress i, nil if none
// was prepared.
func (b *builder) preparedCluster(i int) *clusterv3.Cluster {
	if b.inbound == nil || i >= len(b.inbound.clusters) {
		return nil
	}
	return b.inbound.clusters[i]
}

func (b *builder) tlsInspector() *listenerv3.ListenerFilter {
	if b.inbound != nil {
		return b.inbound.tlsInspector
	}
	return envoyconf.TLSInspector()
}

// inboundChains are the filter chains of an ingress listener on port: they
// depend on the scope (protocol, port, mTLS mode, authorization), not on the
// workload's address, so Shared.For serves the ones Prepare built (chains).
func (b *builder) inboundChains(proto protocol, port uint32, mode MTLSMode) []*listenerv3.FilterChain {
	if c, ok := b.chains[inboundChainKey{proto, port, mode}]; ok {
		return c
	}
	clusterName := InboundClusterName(port)
	var chains []*listenerv3.FilterChain
	if mode != MTLSDisable {
		chains = append(chains, &listenerv3.FilterChain{
			Name: fmt.Sprintf("inbound|%d|mtls", port),
			FilterChainMatch: &listenerv3.FilterChainMatch{
				TransportProtocol:    "tls",
				ApplicationProtocols: envoyconf.IstioInboundALPNs,
			},
			Filters:         b.inboundFilters(proto, port, clusterName),
			TransportSocket: envoyconf.InboundTLS(proto.isHTTP()),
		})
	}
	if mode != MTLSStrict {
		chains = append(chains, &listenerv3.FilterChain{
			Name:    fmt.Sprintf("inbound|%d|plaintext", port),
			Filters: b.inboundFilters(proto, port, clusterName),
		})
	}
	return chains
}

// defaultEndpoint parses an ingress defaultEndpoint: "<ip>:<port>" or
// "unix://<absolute path>". 0.0.0.0 stands for the workload's address, as
// in Istio.
func (b *builder) defaultEndpoint(s string) (*corev3.Address, error) {
	if s == "" {
		return nil, fmt.Errorf("is required: onboarded workloads have no traffic capture, say where the application listens (e.g. 127.0.0.1:8080)")
	}
	if path, ok := strings.CutPrefix(s, "unix://"); ok {
		if !strings.HasPrefix(path, "/") && !strings.HasPrefix(path, "@") {
			return nil, fmt.Errorf("%q: the unix socket path must be absolute or abstract (@name)", s)
		}
		return envoyconf.PipeAddress(path), nil
	}
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		return nil, fmt.Errorf("%q is not <ip>:<port> or unix://<path>", s)
	}
	ip, err := parseIP(host)
	if err != nil {
		return nil, fmt.Errorf("%q: %q is not an IP address", s, host)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return nil, fmt.Errorf("%q: %q is not a port number", s, portStr)
	}
	addr := ip.String()
	if ip.IsUnspecified() {
		addr = b.in.Workload.Address
	}
	return envoyconf.SocketAddress(addr, uint32(port)), nil
}

// inboundFilters are an ingress chain's filters: the inbound authorization
// (RBAC; refuse-all when a policy selecting the workload is not enforced),
// then the HTTP connection manager or TCP proxy to the application.
func (b *builder) inboundFilters(proto protocol, port uint32, cluster string) []*listenerv3.Filter {
	if !proto.isHTTP() {
		return append(b.authz.rules.NetworkFilters(port), envoyconf.TCPProxy(fmt.Sprintf("inbound|%d||", port), cluster))
	}
	return []*listenerv3.Filter{inboundHTTP(proto, port, cluster, b.authz.rules.HTTPFilters())}
}

func inboundHTTP(proto protocol, port uint32, cluster string, authzFilters []*hcmv3.HttpFilter) *listenerv3.Filter {
	codec := hcmv3.HttpConnectionManager_AUTO
	if proto.isHTTP2() {
		codec = hcmv3.HttpConnectionManager_HTTP2
	}
	m := &hcmv3.HttpConnectionManager{
		StatPrefix: fmt.Sprintf("inbound_%d", port),
		CodecType:  codec,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: cluster,
			VirtualHosts: []*routev3.VirtualHost{{
				Name:    fmt.Sprintf("inbound|http|%d", port),
				Domains: []string{"*"},
				Routes:  []*routev3.Route{envoyconf.RouteTo(cluster)},
			}},
		}},
		HttpFilters: append(authzFilters, envoyconf.RouterFilter()),
	}
	return &listenerv3.Filter{Name: wellknown.HTTPConnectionManager, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: envoyconf.MustAny(m)}}
}

func (b *builder) finish(res *Result) {
	res.Listeners = sortedValues(b.listeners)
	res.Routes = sortedValues(b.routes)
	res.Clusters = sortedValues(b.clusters)
	res.Endpoints = sortedValues(b.endpoints)
	sort.Strings(b.warnings)
	res.Warnings = b.warnings
}

func sortedValues[T types.Resource](m map[string]T) []types.Resource {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]types.Resource, 0, len(keys))
	for _, k := range keys {
		out = append(out, m[k])
	}
	return out
}

func resourceName(r types.Resource) string { return cachev3.GetResourceName(r) }

// parseIP accepts an IPv4 or IPv6 address without a zone (Envoy socket
// addresses have no zone).
func parseIP(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return ip, err
	}
	if ip.Zone() != "" {
		return ip, fmt.Errorf("%q has a zone", s)
	}
	return ip, nil
}

// warnIgnored names the Sidecar fields that are set but not translated.
func (b *builder) warnIgnored(sc *istionetworkingv1.Sidecar) {
	if sc.Spec.GetOutboundTrafficPolicy().GetMode().String() == "ALLOW_ANY" {
		b.warn("spec.outboundTrafficPolicy: ALLOW_ANY is not translated; hosts not selected by the egress listeners get 404 or no listener")
	}
	if sc.Spec.GetInboundConnectionPool() != nil {
		b.warn("spec.inboundConnectionPool is not translated")
	}
	for i, ing := range sc.Spec.GetIngress() {
		if ing.GetTls() != nil {
			b.warn("spec.ingress[%d].tls is not translated: the sidecar does not terminate the application's TLS", i)
		}
		if ing.GetConnectionPool() != nil {
			b.warn("spec.ingress[%d].connectionPool is not translated", i)
		}
		if ing.GetCaptureMode().String() == "IPTABLES" {
			b.warn("spec.ingress[%d].captureMode IPTABLES is not translated: onboarded workloads have no traffic capture", i)
		}
	}
	for i, eg := range sc.Spec.GetEgress() {
		if eg.GetCaptureMode().String() == "IPTABLES" {
			b.warn("spec.egress[%d].captureMode IPTABLES is not translated: onboarded workloads have no traffic capture", i)
		}
	}
}
