// Package envoyconf builds the Envoy v3 messages of Istio's shapes that
// translation assembles: typed configs, ADS and SDS config sources, Istio
// mutual TLS transport sockets through the local agent's SDS secrets, SAN
// matchers, socket and pipe addresses, base clusters, TLS inspector, router,
// TCP proxy and route actions. Internal to translate: not an API.
package envoyconf

import (
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	tlsinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Names of the SDS resources and the bootstrap cluster Istio's pilot-agent
// serves them on (its bootstrap defines the "sds-grpc" cluster on the
// agent's workload-spiffe-uds socket).
const (
	SDSClusterName = "sds-grpc"
	SDSCertName    = "default"
	SDSRootCAName  = "ROOTCA"
)

// IstioInboundALPNs are what Istio clients offer in their mutual TLS
// handshake and what the inbound mutual TLS filter chain matches on;
// istioOutboundALPNs are what a sidecar offers.
var (
	IstioInboundALPNs  = []string{"istio-peer-exchange", "istio", "istio-http/1.0", "istio-http/1.1", "istio-h2"}
	istioOutboundALPNs = []string{"istio-peer-exchange", "istio"}
)

const connectTimeout = 10 * time.Second

// MustAny packs m as an Any typed config.
func MustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		// anypb.New fails only for a nil or unregistered message; every
		// message here is a generated, registered Envoy type.
		panic(err)
	}
	return a
}

// ADSSource is the config source of resources fetched over the ADS stream.
func ADSSource() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ResourceApiVersion:    corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
	}
}

func sdsSecret(name string) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{
		Name: name,
		SdsConfig: &corev3.ConfigSource{
			ResourceApiVersion: corev3.ApiVersion_V3,
			ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{ApiConfigSource: &corev3.ApiConfigSource{
				ApiType:                   corev3.ApiConfigSource_GRPC,
				TransportApiVersion:       corev3.ApiVersion_V3,
				SetNodeOnFirstMessageOnly: true,
				GrpcServices: []*corev3.GrpcService{{
					TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: SDSClusterName}},
				}},
			}},
		},
	}
}

// commonTLS is the workload certificate plus validation against the mesh
// root CA, with the SAN matchers given (none: any mesh identity).
func commonTLS(sans []*tlsv3.SubjectAltNameMatcher, alpn []string) *tlsv3.CommonTlsContext {
	return &tlsv3.CommonTlsContext{
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sdsSecret(SDSCertName)},
		ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{
			CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: sans},
				ValidationContextSdsSecretConfig: sdsSecret(SDSRootCAName),
			},
		},
		AlpnProtocols: alpn,
	}
}

// InboundTLS is the transport socket of the mutual TLS ingress chain.
func InboundTLS(httpPort bool) *corev3.TransportSocket {
	alpn := []string{"istio-peer-exchange", "istio"}
	if httpPort {
		alpn = []string{"h2", "http/1.1"}
	}
	return &corev3.TransportSocket{
		Name: wellknown.TransportSocketTLS,
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: MustAny(&tlsv3.DownstreamTlsContext{
			CommonTlsContext:         commonTLS(nil, alpn),
			RequireClientCertificate: wrapBool(true),
		})},
	}
}

// OutboundTLS is Istio mutual TLS toward a mesh destination.
func OutboundTLS(sni string, sans []*tlsv3.SubjectAltNameMatcher) *corev3.TransportSocket {
	return &corev3.TransportSocket{
		Name: wellknown.TransportSocketTLS,
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: MustAny(&tlsv3.UpstreamTlsContext{
			CommonTlsContext: commonTLS(sans, istioOutboundALPNs),
			Sni:              sni,
		})},
	}
}

// ExactSANs match URI SANs equal to one of ids.
func ExactSANs(ids []string) []*tlsv3.SubjectAltNameMatcher {
	out := make([]*tlsv3.SubjectAltNameMatcher, 0, len(ids))
	for _, id := range ids {
		out = append(out, &tlsv3.SubjectAltNameMatcher{
			SanType: tlsv3.SubjectAltNameMatcher_URI,
			Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: id}},
		})
	}
	return out
}

// PrefixSAN matches URI SANs that start with prefix.
func PrefixSAN(prefix string) []*tlsv3.SubjectAltNameMatcher {
	return []*tlsv3.SubjectAltNameMatcher{{
		SanType: tlsv3.SubjectAltNameMatcher_URI,
		Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: prefix}},
	}}
}

// TLSInspector is the listener filter that reads SNI and ALPN.
func TLSInspector() *listenerv3.ListenerFilter {
	return &listenerv3.ListenerFilter{
		Name:       wellknown.TLSInspector,
		ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: MustAny(&tlsinspectorv3.TlsInspector{})},
	}
}

func wrapBool(b bool) *wrapperspb.BoolValue    { return wrapperspb.Bool(b) }
func wrapU32(v uint32) *wrapperspb.UInt32Value { return wrapperspb.UInt32(v) }

// RouterFilter is the HTTP router filter, the last of every HTTP chain.
func RouterFilter() *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{
		Name:       wellknown.Router,
		ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: MustAny(&routerv3.Router{})},
	}
}

// HTTP2Options makes a cluster speak HTTP/2 to its upstream.
func HTTP2Options() map[string]*anypb.Any {
	return map[string]*anypb.Any{
		"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": MustAny(&httpv3.HttpProtocolOptions{
			UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
			}},
		}),
	}
}

// SocketAddress is the TCP address ip:port.
func SocketAddress(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address:       ip,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// PipeAddress is the unix socket at path.
func PipeAddress(path string) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: path}}}
}

// LBEndpoint is an endpoint at addr, with its load-balancing weight when
// weight is not 0.
func LBEndpoint(addr *corev3.Address, weight uint32) *endpointv3.LbEndpoint {
	ep := &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: addr}}}
	if weight > 0 {
		ep.LoadBalancingWeight = wrapU32(weight)
	}
	return ep
}

// BaseCluster is a round-robin cluster of the discovery type t with
// Istio's connect timeout.
func BaseCluster(name string, t clusterv3.Cluster_DiscoveryType) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: t},
		ConnectTimeout:       durationpb.New(connectTimeout),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
	}
}

// TCPProxy is a TCP proxy filter to cluster.
func TCPProxy(stat, cluster string) *listenerv3.Filter {
	return &listenerv3.Filter{
		Name: wellknown.TCPProxy,
		ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: MustAny(&tcpproxyv3.TcpProxy{
			StatPrefix:       stat,
			ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: cluster},
		})},
	}
}

// RouteTo routes every path to cluster, without a timeout.
func RouteTo(cluster string) *routev3.Route {
	return &routev3.Route{
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
			// Istio disables the route timeout by default.
			Timeout: durationpb.New(0),
		}},
	}
}
