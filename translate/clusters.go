package translate

import (
	"fmt"
	"net/netip"
	"sort"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"

	"github.com/embark-mesh/embark/translate/endpoints"
	"github.com/embark-mesh/embark/translate/internal/envoyconf"
)

// outboundCluster creates (once) the cluster of a destination, and its
// endpoints when it uses EDS. It returns the cluster name, or "" when the
// destination cannot be translated (a warning says why).
func (b *builder) outboundCluster(d destination) string {
	name := d.clusterName()
	if _, ok := b.clusters[name]; ok {
		return name
	}
	var (
		c    *clusterv3.Cluster
		eps  []endpoints.Endpoint
		mesh bool
	)
	switch {
	case d.svc != nil:
		eps = b.eps.OfService(d.svc, d.svcPort)
		mesh = true
	default:
		eps = b.eps.OfServiceEntry(d.se, d.sePort)
		mesh = d.se.Spec.GetLocation() == networkingv1alpha3.ServiceEntry_MESH_INTERNAL
	}
	resolution := networkingv1alpha3.ServiceEntry_STATIC
	if d.se != nil {
		resolution = d.se.Spec.GetResolution()
	}
	switch resolution {
	case networkingv1alpha3.ServiceEntry_DNS, networkingv1alpha3.ServiceEntry_DNS_ROUND_ROBIN:
		if len(d.se.Spec.GetEndpoints()) == 0 {
			if _, err := netip.ParseAddr(d.host); err == nil || !isDNSName(d.host) {
				b.warn("ServiceEntry %s/%s: host %q cannot be resolved by DNS; %s left out", d.se.Namespace, d.se.Name, d.host, name)
				return ""
			}
			target := d.port
			if d.sePort.GetTargetPort() != 0 {
				target = d.sePort.GetTargetPort()
			}
			eps = []endpoints.Endpoint{{Addr: d.host, Port: target}}
		} else {
			eps = endpoints.Inline(d.se, d.sePort)
		}
		if len(eps) == 0 {
			b.warn("ServiceEntry %s/%s: no endpoint has an address; %s left out", d.se.Namespace, d.se.Name, name)
			return ""
		}
		t := clusterv3.Cluster_STRICT_DNS
		if resolution == networkingv1alpha3.ServiceEntry_DNS_ROUND_ROBIN {
			t = clusterv3.Cluster_LOGICAL_DNS
			if len(eps) > 1 {
				eps = eps[:1]
			}
		}
		c = envoyconf.BaseCluster(name, t)
		c.DnsLookupFamily = clusterv3.Cluster_V4_PREFERRED
		c.LoadAssignment = endpoints.LoadAssignment(name, eps)
	case networkingv1alpha3.ServiceEntry_DYNAMIC_DNS:
		b.warn("ServiceEntry %s/%s: resolution DYNAMIC_DNS is not supported; %s left out", d.se.Namespace, d.se.Name, name)
		return ""
	default: // STATIC, NONE and Services: EDS over ADS
		c = envoyconf.BaseCluster(name, clusterv3.Cluster_EDS)
		c.EdsClusterConfig = &clusterv3.Cluster_EdsClusterConfig{EdsConfig: envoyconf.ADSSource()}
		ipEps := eps[:0:0]
		for _, e := range eps {
			if _, err := parseIP(e.Addr); err != nil {
				b.warn("%s: endpoint address %q is not an IP address; left out", name, e.Addr)
				continue
			}
			ipEps = append(ipEps, e)
		}
		eps = ipEps
		b.endpoints[name] = endpoints.LoadAssignment(name, eps)
	}
	if d.proto.isHTTP2() {
		c.TypedExtensionProtocolOptions = envoyconf.HTTP2Options()
	}
	if mesh {
		sni := fmt.Sprintf("outbound_.%d_._.%s", d.port, d.host)
		c.TransportSocket = envoyconf.OutboundTLS(sni, b.sans(d, eps))
	}
	b.clusters[name] = c
	return name
}

// sans are the SPIFFE IDs the destination's endpoints may present: those of
// their service accounts plus a ServiceEntry's subjectAltNames. When an
// endpoint's service account is unknown (no Pods given, an entry without
// one) and the ServiceEntry names no subjectAltNames, any identity of the
// destination's namespace is accepted as well, so that endpoint is not
// locked out.
func (b *builder) sans(d destination, eps []endpoints.Endpoint) []*tlsv3.SubjectAltNameMatcher {
	set := map[string]bool{}
	unknown := len(eps) == 0
	for _, e := range eps {
		if e.SA != "" {
			set[b.spiffeID(d.ns, e.SA)] = true
		} else {
			unknown = true
		}
	}
	if d.se != nil && len(d.se.Spec.GetSubjectAltNames()) > 0 {
		unknown = false
		for _, s := range d.se.Spec.GetSubjectAltNames() {
			set[s] = true
		}
	}
	ids := make([]string, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := envoyconf.ExactSANs(ids)
	if unknown {
		out = append(out, envoyconf.PrefixSAN(fmt.Sprintf("spiffe://%s/ns/%s/", b.trust, d.ns))...)
	}
	return out
}

// SpiffeID is the identity of a service account: spiffe://<td>/ns/<ns>/sa/<sa>.
func (b *builder) spiffeID(ns, sa string) string {
	return fmt.Sprintf("spiffe://%s/ns/%s/sa/%s", b.trust, ns, sa)
}

func isDNSName(h string) bool {
	_, err := ParseHostForm("*/" + h)
	return err == nil && h != "*" && h[0] != '*'
}
