package translate

import (
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	tlsinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
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

// istioALPNs are what Istio clients offer in their mutual TLS handshake and
// what the inbound mutual TLS filter chain matches on.
var (
	istioInboundALPNs  = []string{"istio-peer-exchange", "istio", "istio-http/1.0", "istio-http/1.1", "istio-h2"}
	istioOutboundALPNs = []string{"istio-peer-exchange", "istio"}
)

const connectTimeout = 10 * time.Second

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		// anypb.New fails only for a nil or unregistered message; every
		// message here is a generated, registered Envoy type.
		panic(err)
	}
	return a
}

func adsSource() *corev3.ConfigSource {
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

// inboundTLS is the transport socket of the mutual TLS ingress chain.
func inboundTLS(httpPort bool) *corev3.TransportSocket {
	alpn := []string{"istio-peer-exchange", "istio"}
	if httpPort {
		alpn = []string{"h2", "http/1.1"}
	}
	return &corev3.TransportSocket{
		Name: wellknown.TransportSocketTLS,
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(&tlsv3.DownstreamTlsContext{
			CommonTlsContext:         commonTLS(nil, alpn),
			RequireClientCertificate: wrapBool(true),
		})},
	}
}

// outboundTLS is Istio mutual TLS toward a mesh destination.
func outboundTLS(sni string, sans []*tlsv3.SubjectAltNameMatcher) *corev3.TransportSocket {
	return &corev3.TransportSocket{
		Name: wellknown.TransportSocketTLS,
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(&tlsv3.UpstreamTlsContext{
			CommonTlsContext: commonTLS(sans, istioOutboundALPNs),
			Sni:              sni,
		})},
	}
}

func exactSANs(ids []string) []*tlsv3.SubjectAltNameMatcher {
	out := make([]*tlsv3.SubjectAltNameMatcher, 0, len(ids))
	for _, id := range ids {
		out = append(out, &tlsv3.SubjectAltNameMatcher{
			SanType: tlsv3.SubjectAltNameMatcher_URI,
			Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: id}},
		})
	}
	return out
}

func prefixSAN(prefix string) []*tlsv3.SubjectAltNameMatcher {
	return []*tlsv3.SubjectAltNameMatcher{{
		SanType: tlsv3.SubjectAltNameMatcher_URI,
		Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: prefix}},
	}}
}

func tlsInspector() *listenerv3.ListenerFilter {
	return &listenerv3.ListenerFilter{
		Name:       wellknown.TLSInspector,
		ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(&tlsinspectorv3.TlsInspector{})},
	}
}

func wrapBool(b bool) *wrapperspb.BoolValue    { return wrapperspb.Bool(b) }
func wrapU32(v uint32) *wrapperspb.UInt32Value { return wrapperspb.UInt32(v) }

func routerFilter() *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{
		Name:       wellknown.Router,
		ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})},
	}
}

// http2Options makes a cluster speak HTTP/2 to its upstream.
func http2Options() map[string]*anypb.Any {
	return map[string]*anypb.Any{
		"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(&httpv3.HttpProtocolOptions{
			UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
			}},
		}),
	}
}

func socketAddress(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address:       ip,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

func pipeAddress(path string) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: path}}}
}

func lbEndpoint(addr *corev3.Address, weight uint32) *endpointv3.LbEndpoint {
	ep := &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: addr}}}
	if weight > 0 {
		ep.LoadBalancingWeight = wrapU32(weight)
	}
	return ep
}

func baseCluster(name string, t clusterv3.Cluster_DiscoveryType) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: t},
		ConnectTimeout:       durationpb.New(connectTimeout),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
	}
}
